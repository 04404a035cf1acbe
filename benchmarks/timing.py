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


def allocator() -> str:
  """The C allocator setting that moves CPU timings, for the header of a benchmark's table.

  With GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (as `make` sets it) XLA:CPU's per-call buffers come
  in 2 MiB pages; without it, on a kernel whose huge pages are "madvise" only, every call faults
  them in 4 KiB at a time (lpjax.train._process.cpu_allocator_hint).
  """
  import os

  return f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES') or '(unset)'}"
