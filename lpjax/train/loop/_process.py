"""The process around a run: multi-process initialization, SIGTERM / SIGINT handling, logging,
the compilation cache, and a hint for CPU runs (`cpu_allocator_hint`).

Examples:
  >>> with StopSignals() as signals:
  ...   pass
  >>> signals.received is None
  True
"""

from __future__ import annotations

import logging
import os
import platform
import signal
import threading

import jax

log = logging.getLogger("lpjax.train")


def maybe_initialize_distributed(config):
  """jax.distributed.initialize with the config's distributed.* settings, when asked to."""
  d = config.distributed
  if not d.initialize:
    return
  kwargs = {}
  if d.coordinator_address:
    kwargs["coordinator_address"] = d.coordinator_address
  if d.num_processes > 0:
    kwargs["num_processes"] = d.num_processes
  if d.process_id >= 0:
    kwargs["process_id"] = d.process_id
  jax.distributed.initialize(**kwargs)


class StopSignals:
  """Turns SIGTERM / SIGINT into a flag the loop checks after each step (main thread only)."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.received = None
    self._previous = {}

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for sig in self.SIGNALS:
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def _handle(self, signum, frame):
    del frame
    if self.received is not None and signum == signal.SIGINT:  # a second Ctrl-C: stop now
      raise KeyboardInterrupt
    self.received = signum
    log.warning("Received %s: checkpointing after this step, then exiting.",
                signal.Signals(signum).name)

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    return False


def setup_logging():
  """lpjax's INFO lines on stderr; other libraries (orbax, absl) at WARNING."""
  try:
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)
  except ImportError:
    pass
  logger = logging.getLogger("lpjax")
  if not logger.handlers:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  logger.propagate = False


DEFAULT_COMPILATION_CACHE = os.path.join("~", ".cache", "lpjax", "jax_compilation_cache")


def use_compilation_cache(directory: str = DEFAULT_COMPILATION_CACHE) -> str | None:
  """Turns on JAX's persistent compilation cache in `directory` ('~' expanded), so that a re-run,
  a resumed run or another seed of the same config loads its compiled train step instead of
  compiling it again (programs that compile in under a second are not stored).

  '' does nothing; neither does a cache directory already set through JAX_COMPILATION_CACHE_DIR
  or jax.config, which wins. Returns the directory in use, or None.
  """
  current = jax.config.jax_compilation_cache_dir
  if current:
    return current
  if not directory:
    return None
  directory = os.path.abspath(os.path.expanduser(directory))
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  log.info("JAX compilation cache: %s", directory)
  return directory


HUGEPAGE_TUNABLE = "glibc.malloc.hugetlb=1"
THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"


def cpu_allocator_hint(environ=None, thp_mode_file: str = THP_MODE_FILE, libc=None) -> str | None:
  """A one-line hint to run with GLIBC_TUNABLES=glibc.malloc.hugetlb=1, or None where it would
  not help.

  XLA:CPU allocates a program's buffers afresh at every call, and glibc returns large ones to the
  kernel when they are freed, so each train step faults its working set in again, 4 KiB at a
  time: the tiny LLaMA's step faulted 144 MB (bf16) to 172 MB (nvfp4) every step. With transparent
  huge pages in "madvise" mode (a common default), the tunable makes glibc ask for 2 MiB pages and
  the faults all but vanish (docs/gemm.md: that step's system time 74-102 -> 24-35 ms, its
  wall time 167-173 -> 122-156 ms in bf16 and 271-283 -> 206-216 ms in nvfp4).
  The tunable is read when a process starts, so it can only be suggested; `make train` and
  `make test` set it. None when the variable already names the tunable, when glibc is older than
  2.35 (no such tunable) or absent, or when the kernel's mode is "always" (huge pages already)
  or "never" (the tunable does nothing).

  Examples:
    >>> cpu_allocator_hint(environ={"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}) is None
    True
  """
  environ = os.environ if environ is None else environ
  if "glibc.malloc.hugetlb" in environ.get("GLIBC_TUNABLES", ""):
    return None
  name, version = platform.libc_ver() if libc is None else libc
  try:
    if name != "glibc" or tuple(int(p) for p in version.split(".")[:2]) < (2, 35):
      return None
    with open(thp_mode_file) as f:
      mode = f.read()
  except (OSError, ValueError):
    return None
  if "[madvise]" not in mode:
    return None
  return (f"CPU run: start it with GLIBC_TUNABLES={HUGEPAGE_TUNABLE} in the environment (as "
          "`make train` does) for steps about a fifth faster: XLA:CPU's buffers then come in "
          "2 MiB pages instead of being faulted in 4 KiB at a time at every step.")
