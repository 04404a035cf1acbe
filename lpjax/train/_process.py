"""The process around a run: multi-process initialization, SIGTERM / SIGINT handling, logging.

Examples:
  >>> with StopSignals() as signals:
  ...   pass
  >>> signals.received is None
  True
"""

from __future__ import annotations

import logging
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
