"""Stage g: block-scaled GEMMs on the device.

Each format is a case of its own (one failing format never loses the other's figures), and the
reference GEMM decodes with lpjax.quant's XLA path, never through a kernel under test.

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


def _operands(fmt, m, n, k, seed=0):
  import jax
  from lpjax import quant
  a = jax.random.normal(jax.random.key(seed), (m, k))
  b = jax.random.normal(jax.random.key(seed + 1), (n, k))
  quantize = jax.jit(lambda x: quant.quantize(x, fmt, impl="xla"))
  return a, b, quantize(a), quantize(b)


def reference(qa, qb):
  """The float32 GEMM of the decoded operands, decoded by lpjax.quant's XLA path: never by the
  Pallas kernels (impl="auto" on a GPU), which are under test here."""
  from lpjax import pallas
  return pallas.native.emulated_matmul(qa, qb, impl="xla")


def _rel_diff(out, ref) -> float:
  import jax.numpy as jnp
  return float(jnp.max(jnp.abs(out - ref)) / jnp.maximum(jnp.max(jnp.abs(ref)), 1e-30))


def each_case(rec, what: str, fn, *args) -> None:
  """fn(*args) as one case of the stage: an exception fails that case only (recorded), and the
  stage goes on with the next format."""
  try:
    fn(*args)
  except Exception as e:  # noqa: BLE001 (one case's failure is that case's result)
    rec.check(what, False, f"{type(e).__name__}: {e}"[:500])


def fp4_kernel_case(rec, fmt: str, dry_run: bool) -> None:
  """The FP4 GEMM kernel on one format: exactness vs interpret mode on the CPU, and speed."""
  import jax
  import jax.numpy as jnp

  from benchmarks.gpu_check import _timing
  from lpjax import pallas, quant

  gpu = jax.default_backend() == "gpu"
  cpu = jax.devices("cpu")[0]
  repeats = 2 if dry_run else 10
  m, n, k = shapes(dry_run)["exact"]
  _, _, qa, qb = _operands(fmt, m, n, k)
  kernel_fn = lambda u, v: pallas.fp4_matmul(u, v, interpret=None if gpu else True)
  kernel, _ = _timing.compiled(kernel_fn, qa, qb, rec=rec)
  on_device = _timing.run(kernel, qa, qb, rec=rec)
  on_cpu = jax.jit(lambda u, v: pallas.fp4_matmul(u, v, interpret=True))(
      *jax.device_put((qa, qb), cpu))
  ok, why = same_bits(on_device, on_cpu)
  rec.check(f"FP4 GEMM kernel {fmt} {m}x{k} @ {k}x{n}: same bits as interpret mode on the CPU",
            ok, why)
  m, n, k = shapes(dry_run)["timed"]
  a, b, qa, qb = _operands(fmt, m, n, k)
  ab, bb = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
  bf16, _ = _timing.compiled(lambda x, y: jnp.dot(x, y.T, preferred_element_type=jnp.float32),
                             ab, bb, rec=rec)
  # FP4 as the recipes emulate it: values decoded to bf16, then a bf16 GEMM.
  emulated, _ = _timing.compiled(
      lambda u, v: jnp.dot(quant.dequantize(u, jnp.bfloat16, impl="xla"),
                           quant.dequantize(v, jnp.bfloat16, impl="xla").T,
                           preferred_element_type=jnp.float32), qa, qb, rec=rec)
  kernel, compile_s = _timing.compiled(kernel_fn, qa, qb, rec=rec)
  # The reference dequantizes to float32 (NVFP4's decoded values need more bits than bf16 has).
  ref_exe, _ = _timing.compiled(reference, qa, qb, rec=rec)
  err = _rel_diff(_timing.run(kernel, qa, qb, rec=rec), _timing.run(ref_exe, qa, qb, rec=rec))
  rec.check(f"FP4 GEMM kernel {fmt}: within {TOLERANCE:g} of the float32 GEMM of the decoded "
            "operands (XLA path)", err <= TOLERANCE, f"{err:.3g}")
  t_bf16 = _timing.median_s(bf16, ab, bb, repeats=repeats, rec=rec)
  t_emulated = _timing.median_s(emulated, qa, qb, repeats=repeats, rec=rec)
  t_kernel = _timing.median_s(kernel, qa, qb, repeats=repeats, rec=rec)
  rec.row("fp4 gemm kernel", fmt=fmt, shape=f"{m}x{k} @ {k}x{n}",
          kernel="Triton" if gpu else "interpret", compile_s=compile_s, kernel_ms=t_kernel * 1e3,
          emulated_ms=t_emulated * 1e3, bf16_ms=t_bf16 * 1e3,
          kernel_tflops=2 * m * n * k / t_kernel / 1e12, x_bf16_time=t_kernel / t_bf16,
          max_rel_diff=err)
  if gpu:  # interpret-mode timings on a CPU would mean nothing
    rec.figure(f"FP4 GEMM kernel {fmt}", t_kernel / t_bf16, "x bf16 GEMM time")


def fp4_kernel(rec, dry_run: bool) -> None:
  """The FP4 GEMM kernel, each format a case of its own (a failing MXFP4 keeps NVFP4's)."""
  for fmt in FP4_FORMATS:
    if rec.out_of_time(f"FP4 GEMM kernel {fmt}"):
      continue
    each_case(rec, f"FP4 GEMM kernel {fmt}", fp4_kernel_case, rec, fmt, dry_run)


def native_case(rec, fmt: str, dry_run: bool, native: bool) -> None:
  """The native block-scaled GEMM of one format vs the emulated one (XLA-path decode)."""
  from benchmarks.gpu_check import _timing
  from lpjax import pallas

  m, n, k = shapes(dry_run)["timed"]
  repeats = 2 if dry_run else 10
  _, _, qa, qb = _operands(fmt, m, n, k)
  emulated, _ = _timing.compiled(reference, qa, qb, rec=rec)
  fast, compile_s = _timing.compiled(
      lambda u, v: pallas.native_matmul(u, v, fallback=not native), qa, qb, rec=rec)
  err = _rel_diff(_timing.run(fast, qa, qb, rec=rec), _timing.run(emulated, qa, qb, rec=rec))
  rec.check(f"{fmt}: native vs emulated within {TOLERANCE:g}", err <= TOLERANCE, f"{err:.3g}")
  t_emulated = _timing.median_s(emulated, qa, qb, repeats=repeats, rec=rec)
  t_native = _timing.median_s(fast, qa, qb, repeats=repeats, rec=rec)
  rec.row("native gemm", fmt=fmt, shape=f"{m}x{k} @ {k}x{n}",
          path="native" if native else "fallback (emulated)", compile_s=compile_s,
          native_ms=t_native * 1e3, emulated_ms=t_emulated * 1e3,
          native_tflops=2 * m * n * k / t_native / 1e12, speedup=t_emulated / t_native,
          max_rel_diff=err)
  if native:  # the fallback is the emulated GEMM itself: a ratio of it would mean nothing
    rec.figure(f"{fmt} native GEMM", t_emulated / t_native, "x the emulated one's speed")


def native_gemm(rec, dry_run: bool) -> None:
  """The native block-scaled GEMM vs the emulated one, on compute capability >= 10."""
  from lpjax import pallas

  cc = pallas.native.compute_capability()
  native = cc is not None and cc >= 10.0
  if not native and not dry_run:
    rec.note(f"native GEMM: skipped, compute capability {cc} < 10 (no FP4 / MXFP8 tensor cores)")
    return
  for fmt in NATIVE_FORMATS:
    if rec.out_of_time(f"native {fmt}"):
      continue
    each_case(rec, f"native GEMM {fmt}", native_case, rec, fmt, dry_run, native)
  if not native:
    rec.note("no GPU of compute capability >= 10: native_matmul ran its emulated fallback "
             "(the dry run checks the code path, not the tensor cores)")


def run(rec, dry_run: bool) -> None:
  fp4_kernel(rec, dry_run)
  native_gemm(rec, dry_run)
