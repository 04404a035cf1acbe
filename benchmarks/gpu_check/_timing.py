"""Compile time apart from run time: every stage compiles ahead of time (`compiled`) and times the
compiled executable (`median_s`), and adds both to its Recorder (`Recorder.add_time`)."""

from __future__ import annotations

import statistics
import time


def compiled(fn, *args, rec=None):
  """(jax.jit(fn) traced, lowered and compiled for `args`, the seconds that took). On a GPU this
  includes the first-run Triton compiles of the Pallas kernels inside. `rec` gets the time."""
  import jax
  start = time.perf_counter()
  exe = jax.jit(fn).lower(*args).compile()
  seconds = time.perf_counter() - start
  if rec is not None:
    rec.add_time(compile_s=seconds)
  return exe, seconds


def run(exe, *args, rec=None):
  """exe(*args), waited for; `rec` gets the run time."""
  import jax
  start = time.perf_counter()
  out = jax.block_until_ready(exe(*args))
  if rec is not None:
    rec.add_time(run_s=time.perf_counter() - start)
  return out


def median_s(exe, *args, repeats: int, rec=None) -> float:
  """Median wall time of a compiled executable over `repeats` calls after one untimed call."""
  import jax
  start = time.perf_counter()
  jax.block_until_ready(exe(*args))
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(exe(*args))
    times.append(time.perf_counter() - t)
  if rec is not None:
    rec.add_time(run_s=time.perf_counter() - start)
  return statistics.median(times)
