"""Stage c: the Pallas kernels compiled for real (Triton; interpret mode in the dry run) vs the
XLA path of lpjax.quant on the same device, bit for bit; partitioned over several devices and
under shard_map when there are several.

`kernel_cases` is also what tests/benchmarks/gpu_check/test_gpu_check.py lowers for the "cuda" platform on
a CPU, so every kernel and shape this stage compiles on a GPU is known to lower.
"""

from __future__ import annotations

import dataclasses
import time

from benchmarks.gpu_check import _timing
from benchmarks.gpu_check._data import edge_data, same_bits
from benchmarks.gpu_check._record import in_order


@dataclasses.dataclass(frozen=True)
class KernelCase:
  name: str
  shape: tuple
  dtype: str
  kernel: object  # fn(x) with the Pallas kernels
  xla: object  # fn(x) with lpjax.quant's XLA path: the same bits expected


DRY_RUN_CASES = frozenset((
    "mxfp4 quantize rows RTN", "mxfp4 quantize cols SR", "mxfp4 fake_quant rows SR",
    "mxfp4 dequantize cols", "mxfp4 double_quantize SR", "nvfp4 quantize cols SR",
    "mxfp4 quantize odd shape SR", "mxfp4 quantize batched axis 1", "mxfp4 fake_quant bf16 SR",
    "nvfp4 hadamard_quantize RHT-16 rows", "mxfp4 hadamard_quantize RHT-32 cols SR x3/4"))


def kernel_cases(dry_run: bool, interpret: bool | None = None) -> list[KernelCase]:
  """The kernels this stage runs; `interpret` as the kernels take it (None: interpret off GPU)."""
  import jax
  import jax.numpy as jnp

  from lpjax import pallas, quant

  key, col_key = jax.random.key(5), jax.random.key(6)
  kw = dict(interpret=interpret)
  rows, odd, batch = ((32, 64), (5, 70), (2, 9, 64)) if dry_run else (
      (256, 512), (77, 300), (3, 50, 96))
  cases = []

  def add(name, shape, kernel, xla, dtype="float32"):
    cases.append(KernelCase(name, shape, dtype, kernel, xla))

  def sr(**extra):
    return dict(rounding="stochastic", key=key, **extra)

  for fmt in ("mxfp4", "nvfp4", "mxfp8_e4m3", "mxfp6_e2m3"):
    q = lambda x, fmt=fmt, **o: quant.quantize(x, fmt, impl="xla", **o)
    add(f"{fmt} quantize rows RTN", rows, lambda x, f=fmt: pallas.quantize(x, f, **kw), q)
    add(f"{fmt} quantize cols SR", rows, lambda x, f=fmt: pallas.quantize(x, f, axis=0, **sr(), **kw),
        lambda x, q=q: q(x, axis=0, **sr()))
    add(f"{fmt} fake_quant rows SR", rows, lambda x, f=fmt: pallas.fake_quant(x, f, **sr(), **kw),
        lambda x, f=fmt: quant.fake_quant(x, f, impl="xla", **sr()))
    add(f"{fmt} dequantize cols", rows,
        lambda x, q=q: pallas.dequantize(q(x, axis=0), jnp.bfloat16, **kw),
        lambda x, q=q: quant.dequantize(q(x, axis=0), jnp.bfloat16, impl="xla"))
    add(f"{fmt} double_quantize SR", rows,
        lambda x, f=fmt: pallas.double_quantize(x, f, **sr(col_key=col_key), **kw),
        lambda x, q=q: (q(x, axis=-1, **sr()), q(x, axis=-2, rounding="stochastic", key=col_key)))
    add(f"{fmt} quantize rows SR", rows, lambda x, f=fmt: pallas.quantize(x, f, **sr(), **kw),
        lambda x, q=q: q(x, **sr()))
    add(f"{fmt} quantize cols RTN", rows, lambda x, f=fmt: pallas.quantize(x, f, axis=0, **kw),
        lambda x, q=q: q(x, axis=0))
    add(f"{fmt} fake_quant cols RTN", rows, lambda x, f=fmt: pallas.fake_quant(x, f, axis=0, **kw),
        lambda x, f=fmt: quant.fake_quant(x, f, axis=0, impl="xla"))
    add(f"{fmt} double_quantize RTN", rows, lambda x, f=fmt: pallas.double_quantize(x, f, **kw),
        lambda x, q=q: (q(x, axis=-1), q(x, axis=-2)))
  for fmt in ("mxfp4", "nvfp4"):
    q = lambda x, fmt=fmt, **o: quant.quantize(x, fmt, impl="xla", **o)
    add(f"{fmt} quantize odd shape SR", odd, lambda x, f=fmt: pallas.quantize(x, f, **sr(), **kw),
        lambda x, q=q: q(x, **sr()))
    add(f"{fmt} quantize batched axis 1", batch,
        lambda x, f=fmt: pallas.quantize(x, f, axis=1, **kw), lambda x, q=q: q(x, axis=1))
    add(f"{fmt} fake_quant bf16 SR", rows,
        lambda x, f=fmt: pallas.fake_quant(x, f, **sr(), **kw),
        lambda x, f=fmt: quant.fake_quant(x, f, impl="xla", **sr()), dtype="bfloat16")
  add("mxfp4 quantize rceil toward_negative", rows,
      lambda x: pallas.quantize(x, "mxfp4", scale_mode="rceil", rounding="toward_negative", **kw),
      lambda x: quant.quantize(x, "mxfp4", scale_mode="rceil", rounding="toward_negative",
                               impl="xla"))
  signs16 = quant.random_signs(jax.random.key(7), 16)
  signs32 = quant.random_signs(jax.random.key(8), 32)
  add("nvfp4 hadamard_quantize RHT-16 rows", rows,
      lambda x: pallas.hadamard_quantize(x, "nvfp4", block=16, signs=signs16, **kw),
      lambda x: quant.quantize(quant.hadamard(x.astype(jnp.float32), 16, signs=signs16), "nvfp4",
                               impl="xla"))
  add("mxfp4 hadamard_quantize RHT-32 cols SR x3/4", rows,
      lambda x: pallas.hadamard_quantize(x, "mxfp4", block=32, signs=signs32, axis=0,
                                         prescale=0.75, **sr(), **kw),
      lambda x: quant.quantize(quant.hadamard(x.astype(jnp.float32), 32, axis=0, signs=signs32)
                               * jnp.float32(0.75), "mxfp4", axis=0, impl="xla", **sr()))
  add("mxfp4 hadamard_fake_quant RHT-32", rows,
      lambda x: pallas.hadamard_fake_quant(x, "mxfp4", block=32, signs=signs32, **kw),
      lambda x: quant.fake_quant(quant.hadamard(x.astype(jnp.float32), 32, signs=signs32),
                                 "mxfp4", impl="xla"))
  add("hadamard RHT-128 cols", rows, lambda x: pallas.hadamard(x, 128, axis=0, **kw),
      lambda x: quant.hadamard(x.astype(jnp.float32), 128, axis=0))
  # Interpret mode runs the kernels op by op on a CPU: the dry run keeps one case of each kind.
  return [c for c in cases if c.name in DRY_RUN_CASES] if dry_run else cases


def _shard_map(fn, mesh, in_specs, out_specs):
  """jax.shard_map without the varying-axes check (a pallas_call declares none); the keyword and
  the function's home changed across jax versions."""
  import jax
  if hasattr(jax, "shard_map"):
    try:
      return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    except TypeError:
      return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)
  from jax.experimental.shard_map import shard_map  # older jax
  return shard_map(fn, mesh, in_specs, out_specs, check_rep=False)


def sharded_cases(interpret, n_devices: int, dry_run: bool = False):
  """(name, fn(x) -> (kernel outputs, XLA outputs), shape) on a 1-D mesh of every device."""
  import jax
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  from lpjax import pallas, quant

  mesh = Mesh(np.array(jax.devices()[:n_devices]), ("d",))
  rows = NamedSharding(mesh, P("d"))
  key = jax.random.key(9)
  shape = (8 * n_devices, 64) if dry_run else (32 * n_devices, 256)

  def partitioned(x):  # the kernels' custom_partitioning rule: each device its own rows
    x = jax.lax.with_sharding_constraint(x, rows)
    k = pallas.quantize(x, "nvfp4", rounding="stochastic", key=key, interpret=interpret)
    return (k, pallas.fake_quant(x, "mxfp4", interpret=interpret)), (
        quant.quantize(x, "nvfp4", rounding="stochastic", key=key, impl="xla"),
        quant.fake_quant(x, "mxfp4", impl="xla"))

  def per_shard(x):
    k = pallas.quantize(x, "mxfp4", rounding="stochastic", key=key, interpret=interpret)
    r = quant.quantize(x, "mxfp4", rounding="stochastic", key=key, impl="xla")
    return (k.codes, k.scales), (r.codes, r.scales)

  spec = P("d")
  under_shard_map = _shard_map(per_shard, mesh, (spec,), ((spec, spec), (spec, spec)))
  return [("partitioned over devices: nvfp4 SR quantize, mxfp4 fake_quant", partitioned, shape),
          ("under shard_map: mxfp4 SR quantize per shard", under_shard_map, shape)]


def run(rec, dry_run: bool) -> None:
  import jax
  import jax.numpy as jnp

  gpu = jax.default_backend() == "gpu"
  interpret = None if gpu else True  # compiled with Triton on a GPU, interpreted elsewhere
  rec.note("kernels compiled with Triton" if gpu else "kernels in Pallas interpret mode (no GPU)")

  def compare(case):
    x = jnp.asarray(edge_data(case.shape, 11, exp_range=8)).astype(case.dtype)
    kernel, compile_k = _timing.compiled(case.kernel, x)
    xla, compile_x = _timing.compiled(case.xla, x)
    start = time.perf_counter()
    ok_why = same_bits(jax.device_get(kernel(x)), jax.device_get(xla(x)))
    return ok_why, compile_k + compile_x, time.perf_counter() - start

  same = total = 0
  for case, result in in_order(rec, kernel_cases(dry_run, interpret), compare,
                               workers=1 if dry_run else 6, label=lambda c: c.name):
    if isinstance(result, Exception):
      ok, why = False, f"{type(result).__name__}: {result}"[:500]
    else:
      (ok, why), compile_s, run_s = result
      rec.add_time(compile_s=compile_s, run_s=run_s)  # summed over threads: CPU-seconds
    rec.check(case.name, ok, why)
    rec.row("kernels", case=case.name, shape="x".join(map(str, case.shape)), dtype=case.dtype,
            same_bits=ok)
    same, total = same + ok, total + 1
    rec.figure("kernels bit-identical to XLA", 100.0 * same / total, f"% of {total}",
               goal="100%", met=same == total)  # kept up to date
  n = jax.device_count()
  if n > 1:
    for name, fn, shape in sharded_cases(interpret, n, dry_run):
      if rec.out_of_time(name):
        continue
      x = jnp.asarray(edge_data(shape, 12, exp_range=8))
      try:
        exe, _ = _timing.compiled(fn, x, rec=rec)
        kernel_out, xla_out = _timing.run(exe, x, rec=rec)
        ok, why = same_bits(kernel_out, xla_out)
      except Exception as e:  # noqa: BLE001
        ok, why = False, f"{type(e).__name__}: {e}"[:500]
      rec.check(f"{name} ({n} devices)", ok, why)
      rec.row("kernels", case=f"{name} ({n} devices)", shape="x".join(map(str, shape)),
              dtype="float32", same_bits=ok)
      same, total = same + ok, total + 1
      rec.figure("kernels bit-identical to XLA", 100.0 * same / total, f"% of {total}",
                 goal="100%", met=same == total)
  else:
    rec.note("one device: the partitioned and shard_map cases need several (not run)")
