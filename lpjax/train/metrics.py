"""Metrics to <workdir>/metrics.jsonl and TensorBoard event files, and a progress bar.

Examples:
  >>> import tempfile, json, os
  >>> d = tempfile.mkdtemp()
  >>> w = MetricWriter(d, tensorboard=False)
  >>> w.write(10, {"train/loss": 2.5})
  >>> w.close()
  >>> json.loads(open(os.path.join(d, "metrics.jsonl")).readline())
  {'step': 10, 'train/loss': 2.5}
"""

from __future__ import annotations

import json
import logging
import math
import os
import time


class MetricWriter:
  """Appends one JSON line per write; mirrors scalars to TensorBoard when tensorboardX exists."""

  def __init__(self, workdir: str, *, tensorboard: bool = True, enabled: bool = True):
    self.enabled = enabled
    self._tb = None
    if not enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    self._file = open(os.path.join(workdir, "metrics.jsonl"), "a", buffering=1)
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter
        self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
      except ImportError:
        logging.warning("tensorboardX is not installed; metrics go to metrics.jsonl only.")

  def write(self, step: int, scalars: dict):
    if not self.enabled:
      return
    clean = {k: (float(v) if isinstance(v, (int, float)) or hasattr(v, "item") else v)
             for k, v in scalars.items()}
    self._file.write(json.dumps({"step": int(step), **clean}) + "\n")
    if self._tb is not None:
      for k, v in clean.items():
        if isinstance(v, float) and math.isfinite(v):
          self._tb.add_scalar(k, v, int(step))

  def close(self):
    if not self.enabled:
      return
    self._file.close()
    if self._tb is not None:
      self._tb.close()


class Progress:
  """A tqdm bar showing loss, tokens/s and the ETA (plain log lines when tqdm is off)."""

  def __init__(self, start_step: int, total_steps: int, tokens_per_step: int, enabled: bool):
    self.tokens_per_step = tokens_per_step
    self.last_time = time.perf_counter()
    self.last_step = start_step
    self._bar = None
    if enabled:
      from tqdm import tqdm
      self._bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)

  def update(self, step: int, loss: float) -> float:
    """Advances to `step`; returns tokens/s since the previous update."""
    now = time.perf_counter()
    steps = max(step - self.last_step, 1)
    tokens_per_second = steps * self.tokens_per_step / max(now - self.last_time, 1e-9)
    if self._bar is not None:
      self._bar.update(step - self.last_step)
      self._bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_second:,.0f}")
    self.last_time, self.last_step = now, step
    return tokens_per_second

  def restart_clock(self):
    """Excludes the time since the last update (e.g. an evaluation) from tokens/s."""
    self.last_time = time.perf_counter()

  def close(self):
    if self._bar is not None:
      self._bar.close()
