"""Stage g: block-scaled GEMMs on the device.

- The FP4 GEMM kernel (`lpjax.pallas.fp4_matmul`: exact integer per-block dots, float32
  block-order sums; docs/gemm.md), on any GPU: compiled with Triton, its bits against the same
  kernel in interpret mode on the host CPU (which tests/pallas checks against numpy), and its
  time against a bf16 GEMM and the emulated GEMM (dequantize to bf16, bf16 GEMM) of one shape.
- On compute capability >= 10 (Blackwell), the native block-scaled GEMM
  (`lpjax.pallas.native_matmul`, jax.nn.scaled_matmul on lpjax's own codes and scales) against the
  emulated one (dequantize, float32 GEMM): time and largest relative difference (only the
  accumulation differs, so they agree to float32 round-off). Skipped on older GPUs.

The dry run exercises every path on the CPU (interpret mode; the native GEMM's fallback).
"""

from __future__ import annotations


from benchmarks.gpu_check._data import same_bits

NATIVE_FORMATS = ("nvfp4", "mxfp8_e4m3")
FP4_FORMATS = ("mxfp4", "nvfp4")
TOLERANCE = 1e-4  # relative to max |emulated|: float32 round-off of a K-long sum, K <= 8192


def shapes(dry_run: bool) -> dict:
  """(M, N, K) of the exactness check (interpret mode on the CPU is slow) and of the timings."""
  return dict(exact=(32, 16, 128) if dry_run else (128, 128, 512),
              timed=(64, 64, 128) if dry_run else (8192, 8192, 8192))


def _median_s(fn, *args, repeats: int) -> float:
  """Median wall time after one warm-up call (benchmarks/timing.py; imports JAX, so lazily)."""
  from benchmarks.timing import median_seconds
  return median_seconds(fn, *args, repeats=repeats)


def _operands(fmt, m, n, k, seed=0):
  import jax
  from lpjax import quant
  a = jax.random.normal(jax.random.key(seed), (m, k))
  b = jax.random.normal(jax.random.key(seed + 1), (n, k))
  quantize = jax.jit(lambda x: quant.quantize(x, fmt, impl="xla"))
  return a, b, quantize(a), quantize(b)


def fp4_kernel(rec, dry_run: bool) -> None:
  """The FP4 GEMM kernel: exactness vs interpret mode on the CPU, and speed."""
  import jax
  import jax.numpy as jnp

  from lpjax import pallas, quant

  gpu = jax.default_backend() == "gpu"
  cpu = jax.devices("cpu")[0]
  repeats = 2 if dry_run else 10
  for fmt in FP4_FORMATS:
    if rec.out_of_time(f"FP4 GEMM kernel {fmt}"):
      continue
    m, n, k = shapes(dry_run)["exact"]
    _, _, qa, qb = _operands(fmt, m, n, k)
    kernel = jax.jit(lambda u, v: pallas.fp4_matmul(u, v, interpret=None if gpu else True))
    on_device = kernel(qa, qb)
    on_cpu = jax.jit(lambda u, v: pallas.fp4_matmul(u, v, interpret=True))(
        *jax.device_put((qa, qb), cpu))
    ok, why = same_bits(on_device, on_cpu)
    rec.check(f"FP4 GEMM kernel {fmt} {m}x{k} @ {k}x{n}: same bits as interpret mode on the CPU",
              ok, why)
    m, n, k = shapes(dry_run)["timed"]
    a, b, qa, qb = _operands(fmt, m, n, k)
    bf16 = jax.jit(lambda x, y: jnp.dot(x, y.T, preferred_element_type=jnp.float32))
    # FP4 as the recipes emulate it: values decoded to bf16, then a bf16 GEMM.
    emulated = jax.jit(lambda u, v: jnp.dot(quant.dequantize(u, jnp.bfloat16, impl="xla"),
                                            quant.dequantize(v, jnp.bfloat16, impl="xla").T,
                                            preferred_element_type=jnp.float32))
    ab, bb = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    # The reference dequantizes to float32: NVFP4's decoded values need more bits than bf16 has.
    ref = jax.jit(pallas.native.emulated_matmul)(qa, qb)
    err = float(jnp.max(jnp.abs(kernel(qa, qb) - ref)) / jnp.maximum(jnp.max(jnp.abs(ref)), 1e-30))
    rec.check(f"FP4 GEMM kernel {fmt}: within {TOLERANCE:g} of the float32 GEMM of the decoded "
              "operands", err <= TOLERANCE, f"{err:.3g}")
    t_bf16 = _median_s(bf16, ab, bb, repeats=repeats)
    t_emulated = _median_s(emulated, qa, qb, repeats=repeats)
    t_kernel = _median_s(kernel, qa, qb, repeats=repeats)
    rec.row("fp4 gemm kernel", fmt=fmt, shape=f"{m}x{k} @ {k}x{n}",
            kernel="Triton" if gpu else "interpret", kernel_ms=t_kernel * 1e3,
            emulated_ms=t_emulated * 1e3, bf16_ms=t_bf16 * 1e3,
            kernel_tflops=2 * m * n * k / t_kernel / 1e12, x_bf16_time=t_kernel / t_bf16,
            max_rel_diff=err)
    if gpu:  # interpret-mode timings on a CPU would mean nothing
      rec.figure(f"FP4 GEMM kernel {fmt}", t_kernel / t_bf16, "x bf16 GEMM time")


def native_gemm(rec, dry_run: bool) -> None:
  """The native block-scaled GEMM vs the emulated one, on compute capability >= 10."""
  import jax
  import jax.numpy as jnp

  from lpjax import pallas

  cc = pallas.native.compute_capability()
  native = cc is not None and cc >= 10.0
  if not native and not dry_run:
    rec.note(f"native GEMM: skipped, compute capability {cc} < 10 (no FP4 / MXFP8 tensor cores)")
    return
  m, n, k = shapes(dry_run)["timed"]
  repeats = 2 if dry_run else 10
  for fmt in NATIVE_FORMATS:
    if rec.out_of_time(f"native {fmt}"):
      continue
    _, _, qa, qb = _operands(fmt, m, n, k)
    emulated = jax.jit(pallas.native.emulated_matmul)
    fast = jax.jit(lambda u, v: pallas.native_matmul(u, v, fallback=not native))
    ref, out = emulated(qa, qb), fast(qa, qb)
    err = float(jnp.max(jnp.abs(out - ref)) / jnp.maximum(jnp.max(jnp.abs(ref)), 1e-30))
    rec.check(f"{fmt}: native vs emulated within {TOLERANCE:g}", err <= TOLERANCE, f"{err:.3g}")
    t_emulated = _median_s(emulated, qa, qb, repeats=repeats)
    t_native = _median_s(fast, qa, qb, repeats=repeats)
    rec.row("native gemm", fmt=fmt, shape=f"{m}x{k} @ {k}x{n}",
            path="native" if native else "fallback (emulated)", native_ms=t_native * 1e3,
            emulated_ms=t_emulated * 1e3, native_tflops=2 * m * n * k / t_native / 1e12,
            speedup=t_emulated / t_native, max_rel_diff=err)
    if native:  # the fallback is the emulated GEMM itself: a ratio of it would mean nothing
      rec.figure(f"{fmt} native GEMM", t_emulated / t_native, "x the emulated one's speed")
  if not native:
    rec.note("no GPU of compute capability >= 10: native_matmul ran its emulated fallback "
             "(the dry run checks the code path, not the tensor cores)")


def run(rec, dry_run: bool) -> None:
  fp4_kernel(rec, dry_run)
  native_gemm(rec, dry_run)
