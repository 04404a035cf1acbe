"""The process around a run: multi-process initialization, SIGTERM / SIGINT handling, logging.

Examples:
  >>> with StopSignals() as signals:
  ...   pass
  >>> signals.received is None
  True
"""

from __future__ import annotations

import logging
import os
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
