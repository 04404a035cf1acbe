"""One run per workdir: an exclusive lock on <workdir>/.lock for as long as a run trains.

The lock is an `fcntl.flock`, which the kernel releases when its process ends however it ends
(SIGKILL and OOM included), so a lock left by a dead run never blocks the next one. The file
keeps the holder's pid, host and start time for the message a second run prints. (flock needs
a local or lock-supporting file system; on multi-process runs only process 0 takes it.)

Examples:
  >>> import tempfile
  >>> d = tempfile.mkdtemp()
  >>> with WorkdirLock(d):
  ...   try:
  ...     WorkdirLock(d).acquire()
  ...   except WorkdirInUse as e:
  ...     print(str(e).split(" (")[0])
  Another run is using the workdir ...
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import time

from lpjax.train.schema._config_schema import ConfigError

LOCK_FILE = ".lock"


class WorkdirInUse(ConfigError):
  """Another live process holds the workdir's lock."""


class WorkdirLock:
  """`with WorkdirLock(workdir):` holds the workdir for one run; `acquire` raises WorkdirInUse
  at once (it never waits) when another process holds it."""

  def __init__(self, workdir: str):
    self.path = os.path.join(os.path.abspath(workdir), LOCK_FILE)
    self._fd = None

  def acquire(self):
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = _read_holder(fd)
      os.close(fd)
      raise WorkdirInUse(
          f"Another run is using the workdir {os.path.dirname(self.path)} ({holder}). Wait for it "
          "to finish or stop it, or pass another --workdir.") from None
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": platform.node(),
                             "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
    self._fd = fd
    return self

  def release(self):
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()
    return False


def _read_holder(fd) -> str:
  try:
    os.lseek(fd, 0, os.SEEK_SET)
    info = json.loads(os.read(fd, 4096).decode() or "{}")
    return f"pid {info['pid']} on {info['host']}, since {info['since']}"
  except (OSError, ValueError, KeyError):
    return "holder unknown"
