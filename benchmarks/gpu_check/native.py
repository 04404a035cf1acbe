"""Stage g: on compute capability >= 10 (Blackwell), the native block-scaled GEMM
(`lpjax.pallas.native_matmul`, jax.nn.scaled_matmul on lpjax's own codes and scales) against the
emulated one (dequantize, float32 GEMM): time of each and their largest relative difference (only
the accumulation differs, so they agree to float32 round-off). Elsewhere the stage is skipped on
a GPU; the dry run exercises the emulated path and the fallback."""

from __future__ import annotations

import statistics
import time

from benchmarks.gpu_check._record import StageSkipped

FORMATS = ("nvfp4", "mxfp8_e4m3")
TOLERANCE = 1e-4  # relative to max |emulated|: float32 round-off of a K-long sum, K <= 8192


def _median_s(fn, *args, repeats: int) -> float:
  import jax
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def run(rec, dry_run: bool) -> None:
  import jax
  import jax.numpy as jnp

  from lpjax import pallas, quant

  cc = pallas.native.compute_capability()
  native = cc is not None and cc >= 10.0
  if not native and not dry_run:
    raise StageSkipped(f"compute capability {cc} < 10: no native FP4 / MXFP8 GEMM on this GPU "
                       "(FP4 is emulated: quantize, then a bf16 GEMM)")
  m = n = k = 128 if dry_run else 8192
  repeats = 2 if dry_run else 10
  a = jax.random.normal(jax.random.key(0), (m, k), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, k), jnp.float32)
  for fmt in FORMATS:
    if rec.out_of_time(fmt):
      continue
    qa, qb = (jax.jit(lambda x: quant.quantize(x, fmt, impl="xla"))(v) for v in (a, b))
    emulated = jax.jit(pallas.native.emulated_matmul)
    fast = jax.jit(lambda u, v: pallas.native_matmul(u, v, fallback=not native))
    ref, out = emulated(qa, qb), fast(qa, qb)
    err = float(jnp.max(jnp.abs(out - ref)) / jnp.maximum(jnp.max(jnp.abs(ref)), 1e-30))
    rec.check(f"{fmt}: native vs emulated within {TOLERANCE:g}", err <= TOLERANCE, f"{err:.3g}")
    t_emulated = _median_s(emulated, qa, qb, repeats=repeats)
    t_native = _median_s(fast, qa, qb, repeats=repeats)
    flops = 2 * m * n * k
    rec.row("gemm", fmt=fmt, shape=f"{m}x{k} @ {k}x{n}",
            path="native" if native else "fallback (emulated)", native_ms=t_native * 1e3,
            emulated_ms=t_emulated * 1e3, native_tflops=flops / t_native / 1e12,
            speedup=t_emulated / t_native, max_rel_diff=err)
    if native:  # the fallback is the emulated GEMM itself: a ratio of it would mean nothing
      rec.figure(f"{fmt} native GEMM", t_emulated / t_native, "x the emulated one's speed")
  if not native:
    rec.note("no GPU of compute capability >= 10: native_matmul ran its emulated fallback "
             "(the dry run checks the code path, not the tensor cores)")
