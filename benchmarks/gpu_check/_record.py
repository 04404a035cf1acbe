"""What a stage writes as it runs: checks, figures and table rows, flushed to a JSON file after
every entry, so a stage killed at its time limit still leaves what it measured."""

from __future__ import annotations

import json
import os
import time


class Recorder:
  """The result of one stage, written to `path` (JSON) after each entry.

  Examples:
    >>> import tempfile, os
    >>> rec = Recorder(os.path.join(tempfile.mkdtemp(), "s.json"), "b", deadline=None)
    >>> rec.check("mxfp4 RTN", True); rec.check("nvfp4 SR", False, "codes differ")
    >>> rec.figure("exact", 100.0, "%", goal="100%", met=True)
    >>> rec.figure("exact", 50.0, "%", goal="100%", met=False)   # a running figure: replaced
    >>> rec.data["checks"], rec.data["failures"][0]["name"], rec.data["figures"][0]["value"]
    ({'passed': 1, 'failed': 1}, 'nvfp4 SR', 50.0)
    >>> len(rec.data["figures"])
    1
  """

  def __init__(self, path: str, stage: str, *, deadline: float | None, dry_run: bool = False,
               hang: bool = False):
    self.path = path
    self.deadline = deadline  # time.time() after which a stage starts nothing new
    self.hang = hang  # the rehearsal's forced hang: sleep for good after the first entry
    self.data = dict(stage=stage, dry_run=dry_run, checks=dict(passed=0, failed=0), failures=[],
                     figures=[], tables={}, notes=[], cut_short=[], status="running",
                     compile_s=0.0, run_s=0.0, pid=os.getpid())
    self.flush()

  def add_time(self, *, compile_s: float = 0.0, run_s: float = 0.0) -> None:
    """Adds to the stage's compile time (trace, lower, compile: first-run Triton compiles
    included) and run time (the timed and checked executions), reported apart."""
    self.data["compile_s"] += float(compile_s)
    self.data["run_s"] += float(run_s)

  def time_left(self) -> float:
    return float("inf") if self.deadline is None else self.deadline - time.time()

  def out_of_time(self, what: str) -> bool:
    """True (and `what` recorded as not run) once the stage's time is up."""
    if self.time_left() > 0:
      return False
    self.data["cut_short"].append(what)
    self.flush()
    return True

  def check(self, name: str, ok: bool, detail: str = "") -> None:
    self.data["checks"]["passed" if ok else "failed"] += 1
    self.data.setdefault("passed_checks", [])
    if ok:
      self.data["passed_checks"].append(name)
    else:
      self.data["failures"].append(dict(name=name, detail=detail))
    self.flush()
    self._maybe_hang()

  def _maybe_hang(self) -> None:
    if self.hang:  # LPJAX_GPU_CHECK_HANG names this stage (benchmarks/gpu_check/__main__.py)
      while True:
        time.sleep(3600)

  def figure(self, name: str, value, unit: str = "", *, goal: str | None = None,
             met: bool | None = None) -> None:
    """A headline figure; `goal` is printed beside it and `met` says whether it was reached.
    A figure of the same name is replaced: a stage can keep a running figure up to date, so a
    stage killed at its limit still reports what it had."""
    entry = dict(name=name, value=value, unit=unit, goal=goal, met=met)
    figures = self.data["figures"]
    same = [i for i, f in enumerate(figures) if f["name"] == name]
    if same:
      figures[same[0]] = entry
    else:
      figures.append(entry)
    self.flush()

  def row(self, table: str, **columns) -> None:
    self.data["tables"].setdefault(table, []).append(columns)
    self.flush()

  def note(self, text: str) -> None:
    self.data["notes"].append(text)
    self.flush()

  def flush(self) -> None:
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(self.data, f, indent=1, default=_jsonable)
    os.replace(tmp, self.path)  # a reader never sees half a file


def _jsonable(value):
  try:
    return float(value)  # numpy and jax scalars
  except (TypeError, ValueError):
    return str(value)


def in_order(rec: Recorder, items, work, *, workers: int, label=str):
  """Yields (item, work(item)) in order, `workers` items computing at once in threads (XLA and
  Triton compile outside the GIL); stops starting items at the stage's deadline and records the
  rest as not run. An exception of work(item) is yielded as its result."""
  import concurrent.futures

  todo, running = list(items), []
  with concurrent.futures.ThreadPoolExecutor(max(workers, 1)) as pool:
    while todo or running:
      while todo and len(running) < max(workers, 1) and rec.time_left() > 0:
        item = todo.pop(0)
        running.append((item, pool.submit(work, item)))
      if not running:
        for item in todo:
          rec.out_of_time(label(item))
        return
      item, future = running.pop(0)
      try:
        yield item, future.result()
      except Exception as e:  # noqa: BLE001 (one case's failure is that case's result)
        yield item, e
