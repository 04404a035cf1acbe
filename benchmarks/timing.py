"""Wall-clock timing shared by the benchmarks: the median of repeated, synchronized calls."""

from __future__ import annotations

import statistics
import time

import jax


def median_seconds(fn, *args, repeats: int, warmup: int = 1) -> float:
  """Median wall time of fn(*args) over `repeats` calls, after `warmup` untimed calls (compile)."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)
