"""Runs the stages in the plan's order, each in its own process with a deadline, and keeps the
report on disk up to date while they run.

A process per stage keeps a stage's failure from reaching the next one: a Triton crash, an
out-of-memory error that leaves the CUDA context unusable, or a hang (killed at its deadline) ends
that stage only, and its partial figures (flushed by `Recorder` after every entry) are kept. The
parent never starts a JAX backend, so it holds no device memory.

The plan (`PLAN`): the stages run in the order a, g, b, c, e, d, f, so that the figures wanted most
(stage g's FP4 GEMM, stage b/c's exactness) come first, with budgets that add up to
`PLAN_TOTAL_S` = 540 s, inside one 600 s call on a GPU machine. A stage may use the time an
earlier stage left over, never a later stage's budget: stage i must end by
start + (budget of stages 1..i) x total / (budget of all stages run). `--total-limit` scales the
plan (the dry run's default 300 s, the rehearsal's 120 s); `--stages` picks stages, whose budgets
then share the whole total.

While a stage runs, the parent polls its JSON file and calls `on_update` whenever it changes, so
the Markdown report on disk is never more than `POLL_S` behind: a run killed at any point leaves
a readable report of every finished case.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Stage:
  letter: str  # a-g, the letters of issue 38 (the report lists stages in this order)
  name: str  # module in benchmarks/gpu_check (or a dotted module path) with run(rec, dry_run)
  title: str
  budget_s: float  # its share of PLAN_TOTAL_S on one H100 / H200, first compiles included


STAGES = (
    Stage("a", "env", "environment", 25),
    Stage("b", "exactness", "exactness on the device (XLA path vs CPU)", 60),
    Stage("c", "kernels", "Pallas kernels vs XLA, bit for bit", 80),
    Stage("d", "bandwidth", "bandwidth vs a device copy", 75),
    Stage("e", "gemm", "GEMM overhead (SwiGLU MLP fwd+bwd)", 60),
    Stage("f", "steps", "LLaMA train steps", 165),
    Stage("g", "native", "block-scaled GEMMs: FP4 kernel, native (cc >= 10)", 75),
)
PLAN = "agbcedf"  # the run order: FP4 GEMM figures and exactness first, the long steps last
PLAN_TOTAL_S = 540  # the default total on a GPU: one 600 s call, with room to start and copy back
DRY_RUN_TOTAL_S = 300  # the dry run's default total (it takes about a minute on 2 CPU cores)
MIN_STAGE_S = 5.0  # a stage left less than this is not started (recorded as skipped for time)
POLL_S = 1.0  # how often the parent looks at a running stage's JSON file


def in_plan_order(stages, plan: str = PLAN) -> list:
  """The stages in the order they run.

  Examples:
    >>> [s.letter for s in in_plan_order(STAGES)]
    ['a', 'g', 'b', 'c', 'e', 'd', 'f']
  """
  return sorted(stages, key=lambda s: plan.index(s.letter) if s.letter in plan else len(plan))


def deadlines(stages, total_s: float) -> list[float]:
  """Seconds from the start by which each stage (in run order) must end: the plan's budgets,
  cumulated and scaled to `total_s`.

  Examples:
    >>> [round(d) for d in deadlines(in_plan_order(STAGES), 540)]
    [25, 100, 160, 240, 300, 375, 540]
    >>> [round(d) for d in deadlines(in_plan_order(STAGES), 120)]
    [6, 22, 36, 53, 67, 83, 120]
  """
  scale = total_s / max(sum(s.budget_s for s in stages), 1e-9)
  out, acc = [], 0.0
  for s in stages:
    acc += s.budget_s
    out.append(acc * scale)
  return out


def child_env(dry_run: bool, workdir: str) -> dict:
  """The environment of a stage process: in the dry run, the CPU with 4 virtual devices (shard_map
  and the partitioned kernels get several devices) and interpret-mode kernels."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
  env["PYTHONUNBUFFERED"] = "1"  # the stage log is current when a stage is killed
  if dry_run:
    env["JAX_PLATFORMS"] = "cpu"
    # CPU compiles dominate the dry run: a persistent cache lets a repeated dry run (and stage f's
    # runs of one program) load them. A GPU run compiles afresh: its compile times are figures.
    env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(workdir, "jax_cache"))
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
    flags = env.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
      env["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=4").strip()
  elif env.get("JAX_PLATFORMS") and "cpu" not in env["JAX_PLATFORMS"].split(","):
    env["JAX_PLATFORMS"] += ",cpu"  # stage b compares the device with the host CPU
  return env


def pending(stage: Stage, status: str = "not started", error: str = "") -> dict:
  """The result of a stage that has not run (yet)."""
  return dict(letter=stage.letter, stage=stage.name, title=stage.title, status=status,
              error=error, seconds=0.0, limit_s=0.0, figures=[], checks=dict(passed=0, failed=0))


def run_stage(stage: Stage, *, dry_run: bool, timeout_s: float, workdir: str,
              on_update=None) -> dict:
  """Runs one stage in a child process, killed after `timeout_s`; returns its result dict.
  `on_update(partial result)` is called whenever the stage's JSON file changes."""
  path = os.path.join(workdir, f"stage_{stage.letter}.json")
  for old in (path, path + ".tmp"):
    if os.path.exists(old):
      os.remove(old)
  # The stage stops starting new cases a little before the kill, so it ends cleanly.
  deadline = time.time() + max(timeout_s - max(3.0, 0.1 * timeout_s), 1.0)
  cmd = [sys.executable, "-m", "benchmarks.gpu_check", "--stage", stage.name, "--letter",
         stage.letter, "--result", path, "--deadline", repr(deadline)] + (
             ["--dry-run"] if dry_run else [])
  log_path = os.path.join(workdir, f"stage_{stage.letter}.log")
  start = time.time()
  with open(log_path, "w") as log:  # a file, not a pipe: nothing blocks, and it survives a kill
    proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(dry_run, workdir), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    _RUNNING.append(proc)
    try:
      rc, timed_out = _wait(proc, start, timeout_s, path, stage, on_update)
    finally:
      _RUNNING.remove(proc)
  seconds = time.time() - start
  result = _read(path, stage)
  result.update(letter=stage.letter, title=stage.title, seconds=seconds, limit_s=timeout_s)
  if timed_out:
    result["status"] = "fail"
    result["killed"] = True
    result["error"] = f"killed at its time limit ({timeout_s:.0f} s); figures so far are kept"
  elif result.get("status") == "running":  # died without a word: a crash
    result["status"] = "fail"
    result["error"] = f"the stage process ended with code {rc}: {_tail(log_path)}"
  return result


def _wait(proc, start: float, timeout_s: float, path: str, stage: Stage, on_update):
  """Waits for the stage process until start + timeout_s, reporting changes of its JSON file."""
  kill_at, seen = start + timeout_s, None
  while True:
    try:
      rc = proc.wait(timeout=max(min(POLL_S, kill_at - time.time()), 0.01))
      return rc, False
    except subprocess.TimeoutExpired:
      pass
    if on_update is not None:
      mtime = os.path.getmtime(path) if os.path.exists(path) else None
      if mtime != seen:
        seen = mtime
        partial = _read(path, stage)
        partial.update(letter=stage.letter, title=stage.title, status="running",
                       seconds=time.time() - start, limit_s=timeout_s)
        on_update(partial)
    if time.time() >= kill_at:
      kill(proc)
      return None, True


_RUNNING: list = []  # the stage process now running (killed with the parent on SIGTERM)
_STATE: dict = dict(results=None, current=None)  # run_all's results so far and its stage


def snapshot(status: str = "interrupted") -> list[dict] | None:
  """run_all's results as they stand, the running stage re-read from its JSON file and marked
  `status` (for a report written when the run is stopped by a signal)."""
  results = _STATE.get("results")
  if results is None:
    return None
  results = list(results)
  if _STATE.get("current"):
    stage, workdir = _STATE["current"]
    i = next((k for k, r in enumerate(results) if r.get("letter") == stage.letter), None)
    if i is not None and results[i].get("status") in ("running", "not started"):
      partial = _read(os.path.join(workdir, f"stage_{stage.letter}.json"), stage)
      partial.update(letter=stage.letter, title=stage.title, status=status,
                     error="stopped by a signal while it ran; figures so far are kept")
      results[i] = partial
  return results


def kill(proc) -> None:
  """Kills a stage process and everything it started (its own process group)."""
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass
  proc.wait()


def kill_running() -> None:
  for proc in list(_RUNNING):
    kill(proc)


def run_all(stages, *, dry_run: bool, workdir: str, total_limit_s: float = PLAN_TOTAL_S,
            progress=print, on_update=None) -> list[dict]:
  """Every stage in the plan's order within `total_limit_s`; a failing stage never stops the next.
  Returns the results in run order. `on_update(results)` (every stage, finished, running or not
  started, in run order) is called when anything changes."""
  os.makedirs(workdir, exist_ok=True)
  stages = in_plan_order(stages)
  ends = deadlines(stages, total_limit_s)
  start = time.time()
  results = [pending(s) for s in stages]
  stage_of = dict(enumerate(stages))
  _STATE.update(results=results, current=None)

  def update(i, partial):
    results[i] = partial
    _STATE.update(results=results, current=(stage_of[i], workdir))
    if on_update is not None:
      on_update(list(results))

  if on_update is not None:
    on_update(list(results))
  for i, stage in enumerate(stages):
    timeout = start + ends[i] - time.time()
    if timeout < MIN_STAGE_S:
      update(i, pending(stage, "not run", f"skipped for time: {max(timeout, 0):.0f} s of the "
                        f"{total_limit_s:.0f} s total were left for it"))
      continue
    progress(f"[gpu-check] stage {stage.letter} ({stage.title}): up to {timeout:.0f} s ...",
             flush=True)
    _STATE.update(current=(stage, workdir))
    result = run_stage(stage, dry_run=dry_run, timeout_s=timeout, workdir=workdir,
                       on_update=lambda partial, i=i: update(i, partial))
    progress(f"[gpu-check] stage {stage.letter}: {result['status']} in {result['seconds']:.1f} s"
             + (f" ({result['error']})" if result.get("error") else ""), flush=True)
    update(i, result)
  return results


def _read(path: str, stage: Stage) -> dict:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return dict(stage=stage.name, status="running", figures=[], checks=dict(passed=0, failed=0))


def _tail(log_path: str, lines: int = 3) -> str:
  try:
    with open(log_path, errors="replace") as f:
      log = f.read()
  except OSError:
    log = ""
  return " | ".join(log.strip().splitlines()[-lines:]) or "(no output)"
