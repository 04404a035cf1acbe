"""Runs the stages one after another, each in its own process with its own time limit.

A process per stage keeps a stage's failure from reaching the next one: a Triton crash, an
out-of-memory error that leaves the CUDA context unusable, or a hang (killed at the limit) ends
that stage only, and its partial figures (flushed by `Recorder` after every entry) are kept. The
parent never starts a JAX backend, so it holds no device memory.
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
  letter: str  # a-g, the order of the issue
  name: str  # module in benchmarks/gpu_check (or a dotted module path) with run(rec, dry_run)
  title: str
  limit_s: float  # on a GPU
  dry_limit_s: float  # in the dry run (CPU; generous: the whole dry run is meant to take < 2 min)


STAGES = (
    Stage("a", "env", "environment", 60, 60),
    Stage("b", "exactness", "exactness on the device (XLA path vs CPU)", 100, 90),
    Stage("c", "kernels", "Pallas kernels vs XLA, bit for bit", 100, 120),
    Stage("d", "bandwidth", "bandwidth vs a device copy", 150, 90),
    Stage("e", "gemm", "GEMM overhead (SwiGLU MLP fwd+bwd)", 80, 90),
    Stage("f", "steps", "LLaMA train steps", 240, 180),
    Stage("g", "native", "block-scaled GEMMs: FP4 kernel, native (cc >= 10)", 90, 60),
)
TOTAL_LIMIT_S = 600  # the whole check on one H100/H200 (issue 38)
RESERVE_S = 15  # kept for each later stage when an earlier one would eat the total


def child_env(dry_run: bool, workdir: str) -> dict:
  """The environment of a stage process: in the dry run, the CPU with 4 virtual devices (shard_map
  and the partitioned kernels get several devices) and interpret-mode kernels."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
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


def run_stage(stage: Stage, *, dry_run: bool, timeout_s: float, workdir: str) -> dict:
  """Runs one stage in a child process, killed after `timeout_s`; returns its result dict."""
  path = os.path.join(workdir, f"stage_{stage.letter}.json")
  if os.path.exists(path):
    os.remove(path)
  # The stage stops starting new cases a little before the kill, so it ends cleanly.
  deadline = time.time() + max(timeout_s - max(5.0, 0.1 * timeout_s), 1.0)
  cmd = [sys.executable, "-m", "benchmarks.gpu_check", "--stage", stage.name, "--result", path,
         "--deadline", repr(deadline)] + (["--dry-run"] if dry_run else [])
  start = time.time()
  proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(dry_run, workdir), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
  try:
    log, _ = proc.communicate(timeout=timeout_s)
    rc, timed_out = proc.returncode, False
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)  # the stage and any run it started
    log, _ = proc.communicate()
    rc, timed_out = None, True
  seconds = time.time() - start
  with open(os.path.join(workdir, f"stage_{stage.letter}.log"), "w") as f:
    f.write(log or "")
  result = _read(path, stage)
  result.update(letter=stage.letter, title=stage.title, seconds=seconds, limit_s=timeout_s)
  if timed_out:
    result["status"] = "fail"
    result["error"] = f"killed at its time limit ({timeout_s:.0f} s); figures so far are kept"
  elif result.get("status") == "running":  # died without a word: a crash
    result["status"] = "fail"
    result["error"] = f"the stage process ended with code {rc}: {_tail(log)}"
  return result


def run_all(stages, *, dry_run: bool, workdir: str, total_limit_s: float = TOTAL_LIMIT_S,
            progress=print) -> list[dict]:
  """Every stage in order within `total_limit_s`; a failing stage never stops the next."""
  os.makedirs(workdir, exist_ok=True)
  start, results = time.time(), []
  for i, stage in enumerate(stages):
    left = total_limit_s - (time.time() - start) - RESERVE_S * (len(stages) - i - 1)
    timeout = min(stage.dry_limit_s if dry_run else stage.limit_s, left)
    if timeout < 5:
      results.append(dict(letter=stage.letter, stage=stage.name, title=stage.title,
                          status="not run", error="the whole check's time limit was reached",
                          seconds=0.0, limit_s=0.0, figures=[], checks=dict(passed=0, failed=0)))
      continue
    progress(f"[gpu-check] stage {stage.letter} ({stage.title}): up to {timeout:.0f} s ...",
             flush=True)
    result = run_stage(stage, dry_run=dry_run, timeout_s=timeout, workdir=workdir)
    progress(f"[gpu-check] stage {stage.letter}: {result['status']} in {result['seconds']:.1f} s"
             + (f" ({result['error']})" if result.get("error") else ""), flush=True)
    results.append(result)
  return results


def _read(path: str, stage: Stage) -> dict:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return dict(stage=stage.name, status="running", figures=[], checks=dict(passed=0, failed=0))


def _tail(log: str, lines: int = 3) -> str:
  return " | ".join((log or "").strip().splitlines()[-lines:]) or "(no output)"
