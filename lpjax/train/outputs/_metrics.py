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
import sys
import time


def truncate_after(path: str, step: int):
  """Drops the lines of a metrics.jsonl logged after `step` (atomically), and a torn last line.

  A run resumed from the checkpoint at `step` logs those steps again, so the file ends up the same
  as an uninterrupted run's.
  """
  if not os.path.exists(path):
    return
  kept = []
  with open(path) as f:
    for line in f:
      try:
        record = json.loads(line)
      except json.JSONDecodeError:  # a line torn by a crash mid-write
        continue
      if record.get("step", 0) <= step:
        kept.append(json.dumps(record) + "\n")
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.writelines(kept)
  os.replace(tmp, path)


def tensorboard_command(logdir: str) -> str:
  """A shell command that shows `logdir` in TensorBoard, with its installation when this Python
  environment has no TensorBoard (it is not a dependency: metrics.jsonl holds the same scalars).

  Examples:
    >>> "--logdir runs/x/tensorboard" in tensorboard_command("runs/x/tensorboard")
    True
  """
  import importlib.util

  bin_dir = os.path.dirname(sys.executable)
  tensorboard = os.path.join(bin_dir, "tensorboard")
  if importlib.util.find_spec("tensorboard") is not None and os.path.exists(tensorboard):
    return f"{tensorboard} --logdir {logdir}"
  return f"{os.path.join(bin_dir, 'pip')} install tensorboard && {tensorboard} --logdir {logdir}"


class MetricWriter:
  """Appends one JSON line per write; mirrors scalars to TensorBoard when tensorboardX exists.

  `resume_step`: the step a resumed run restarts from; later records of the interrupted run are
  dropped (metrics.jsonl) or purged (TensorBoard's purge_step).
  """

  def __init__(self, workdir: str, *, tensorboard: bool = True, enabled: bool = True,
               resume_step: int | None = None):
    self.enabled = enabled
    self._tb = None
    if not enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "metrics.jsonl")
    truncate_after(path, resume_step if resume_step is not None else 0)
    self._file = open(path, "a", buffering=1)
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter
        purge = None if not resume_step else resume_step + 1
        self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"), purge_step=purge)
      except ImportError:
        logging.warning("tensorboardX is not installed; metrics go to metrics.jsonl only "
                        "(pip install tensorboardX mirrors them to TensorBoard).")

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
  """Training progress: a tqdm bar (loss, units per second, ETA) on a terminal; when stderr is
  not a terminal (a log file, a batch job), a plain log line at most every `line_seconds`
  instead, so that progress and log lines never share a line.

  The ETA comes from the steady step rate: the time of compiles (`exclude`, which the trainer
  calls with each compile's seconds) and evaluations (`restart_clock`) is left out, and so is the
  first interval of the run (or of a resumed run) once a later one has been timed.

  Examples:
    >>> p = Progress(100, 1000, 512.0, enabled=False)
    >>> p.eta_seconds(100)  # nothing timed yet
    nan
  """

  def __init__(self, start_step: int, total_steps: int, units_per_step: float, enabled: bool,
               unit: str = "tokens", *, line_seconds: float = 30.0, terminal: bool | None = None):
    self.units_per_step = units_per_step  # the caller may update it (variable sequence lengths)
    self.unit = unit
    self.total_steps = total_steps
    self.last_time = time.perf_counter()
    self.last_step = start_step
    self._bar = None
    self._lines = False
    self._line_seconds = line_seconds
    self._last_line = time.perf_counter()
    self._excluded = 0.0  # compile seconds inside the current interval
    self._first = None  # (steps, seconds) of the first interval
    self._steady = [0, 0.0]  # (steps, seconds) of the later intervals
    if not enabled:
      return
    if terminal is None:
      terminal = sys.stderr.isatty()
    import importlib.util
    if terminal and importlib.util.find_spec("tqdm") is not None:  # else lines (a stock image)
      from tqdm import tqdm
      # tqdm's own remaining-time estimate would count the compile; the ETA is in the postfix
      self._bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True,
                       bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")
    else:
      self._lines = True

  def exclude(self, seconds: float):
    """Leaves `seconds` (a compile in the current interval) out of the step rate."""
    self._excluded += seconds

  def eta_seconds(self, step: int) -> float:
    """Seconds to total_steps at the steady step rate (nan before any step was timed)."""
    steps, seconds = self._steady if self._steady[0] else (self._first or (0, 0.0))
    if not steps:
      return float("nan")
    return max(self.total_steps - step, 0) * seconds / steps

  def update(self, step: int, loss: float) -> float:
    """Advances to `step`; returns units/s since the previous update (compile time left out)."""
    now = time.perf_counter()
    steps = max(step - self.last_step, 1)
    seconds = max(now - self.last_time - self._excluded, 1e-9)
    self._excluded = 0.0
    per_second = steps * self.units_per_step / seconds
    if self._first is None:
      self._first = (steps, seconds)
    else:
      self._steady[0] += steps
      self._steady[1] += seconds
    eta = _duration(self.eta_seconds(step))
    if self._bar is not None:
      self._bar.update(step - self.last_step)
      self._bar.set_postfix({"loss": f"{loss:.4f}", f"{self.unit}/s": f"{per_second:,.0f}",
                             "ETA": eta})
    elif self._lines and (now - self._last_line >= self._line_seconds
                          or step >= self.total_steps):
      logging.getLogger("lpjax.train").info(
          "step %d/%d: loss %.4f, %s %s/s, ETA %s", step, self.total_steps, loss,
          f"{per_second:,.0f}", self.unit, eta)
      self._last_line = now
    self.last_time, self.last_step = now, step
    return per_second

  def restart_clock(self):
    """Excludes the time since the last update (e.g. an evaluation) from the rate and ETA."""
    self.last_time = time.perf_counter()

  def close(self):
    if self._bar is not None:
      self._bar.close()


def _duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  seconds = int(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
