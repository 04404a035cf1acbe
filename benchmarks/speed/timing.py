"""Wall-clock timing shared by the benchmarks: medians of repeated, synchronized calls (one
function, or several interleaved), and the allocator setting that moves CPU timings."""

from __future__ import annotations

import os
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


def interleaved_medians(timed: dict, rounds: int) -> dict:
  """{name: median seconds} of the callables in `timed` (each runs once and returns its wall time),
  over `rounds` rounds that run every callable once, in an order rotated by one each round, so
  that a drift of the machine hits every entry alike."""
  names = list(timed)
  times = {name: [] for name in names}
  for r in range(rounds):
    k = r % len(names)
    for name in names[k:] + names[:k]:
      times[name].append(timed[name]())
  return {name: statistics.median(t) if t else float("nan") for name, t in times.items()}


def allocator() -> str:
  """The C allocator setting that moves CPU timings, for the header of a benchmark's table.

  With GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (as `make` sets it) XLA:CPU's per-call buffers come
  in 2 MiB pages; without it, on a kernel whose huge pages are "madvise" only, every call faults
  them in 4 KiB at a time (lpjax.train.loop._process.cpu_allocator_hint).
  """
  return f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES') or '(unset)'}"
