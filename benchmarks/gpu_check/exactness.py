"""Stage b: the numerics contract on the device. lpjax.quant's XLA path (quantize: codes, scale
bytes, tensor scale; dequantize; fake_quant) on the default device vs on the host CPU, bit for bit.

The CPU side is what tests/quant checks against the independent numpy oracle for the same
formats, roundings and scale rules, so equal bits here carry that check over to the device.
Cases are grouped into one jitted function per (format, data) so that a GPU compiles ~40
programs, not ~300. GEMMs are not compared: their float accumulation order is the backend's.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from benchmarks.gpu_check import _timing

from benchmarks.gpu_check._data import edge_data, extreme_data, same_bits
from benchmarks.gpu_check._record import in_order

MX = ("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2")
NV = ("nvfp4", "nvfp4_16x16")
FP32_SCALED = ("fp8_e4m3", "fp8_e5m2", "int8_channel", "int4_channel", "int8_g128", "int4_g128",
               "uint4_g128")
ROUNDINGS = ("nearest_even", "nearest_away", "toward_zero", "toward_positive", "toward_negative",
             "stochastic")
SCALE_MODES = ("floor", "ceil", "even", "rceil")
EXTREME_ROUNDINGS = ("nearest_even", "toward_positive", "stochastic")
# Custom block formats of tests/quant/test_oracle_parity.py: "custom:<element>:<scale>:<block>".
CUSTOM = ("custom:e2m1:ue4m3:32", "custom:e4m3:e8m0:64", "custom:e3m2:e8m0:16")


def get_format(name: str):
  """A preset's name as is; a "custom:..." name as the QuantFormat it spells."""
  if not name.startswith("custom:"):
    return name
  from lpjax import quant
  _, element, scale, block = name.split(":")
  return quant.QuantFormat(element=element, scale=scale, block_size=int(block))


@dataclasses.dataclass(frozen=True)
class Group:
  fmt: str
  data: str  # a key of data_sets()
  roundings: tuple = ROUNDINGS
  scale_modes: tuple = (None,)
  axis: int = -1
  hadamard: int = 0  # quantize quant.hadamard(x, block) instead of x

  @property
  def label(self) -> str:
    extra = f", axis {self.axis}" if self.axis != -1 else ""
    return f"{self.fmt} on {self.data}{extra}" + (f", RHT-{self.hadamard}" if self.hadamard else "")


def data_sets(dry_run: bool) -> dict:
  """Named inputs (numpy; float32 unless named for another dtype)."""
  import ml_dtypes
  shape = (8, 64) if dry_run else (16, 128)
  out = dict(edge=edge_data(shape, 0), extreme=extreme_data(shape, 1),
             ragged=edge_data((5, 45) if dry_run else (13, 117), 4),
             batched=edge_data((2, 37, 3) if dry_run else (3, 117, 5), 5))
  out["extreme_nv"] = (out["extreme"] * np.float32(2.0 ** -10)).astype(np.float32)  # below the
  # overflow of NVFP4's decode multiplier fl32(s_b) * amax_t (tests/quant/test_oracle_parity.py)
  out["bf16"] = edge_data(shape, 3, exp_range=24).astype(ml_dtypes.bfloat16)
  out["fp16"] = edge_data(shape, 2, exp_range=4).astype(np.float16)
  return out


def groups(dry_run: bool) -> list[Group]:
  """What is compared: every format x rounding x e8m0 scale mode of tests/quant, edge cases."""
  rs = ("nearest_even", "stochastic")
  if dry_run:
    return [Group("mxfp4", "edge", rs, scale_modes=SCALE_MODES), Group("nvfp4", "edge", rs),
            Group("fp8_e4m3", "edge", rs), Group("int4_g128", "edge", rs),
            Group("mxfp4", "ragged", rs), Group("nvfp4", "batched", rs, axis=1),
            Group("mxfp4", "bf16", rs), Group("mxfp4", "edge", rs, hadamard=32)]
  out = []
  for fmt in MX:
    out += [Group(fmt, "edge", scale_modes=SCALE_MODES),
            Group(fmt, "extreme", EXTREME_ROUNDINGS, scale_modes=SCALE_MODES)]
  for fmt in NV:
    out += [Group(fmt, "edge"), Group(fmt, "extreme_nv")]
  for fmt in FP32_SCALED:
    out += [Group(fmt, "edge"), Group(fmt, "extreme", EXTREME_ROUNDINGS)]
  out.append(Group("nf4", "edge", ("nearest_even",)))
  out += [Group(fmt, "edge") for fmt in CUSTOM]
  for fmt in ("mxfp4", "nvfp4", "mxfp8_e4m3"):
    out += [Group(fmt, "ragged", rs), Group(fmt, "batched", rs, axis=1),
            Group(fmt, "batched", rs, axis=0), Group(fmt, "bf16", rs), Group(fmt, "fp16", rs)]
  out += [Group("mxfp4", "edge", rs, hadamard=32), Group("nvfp4", "edge", rs, hadamard=16)]
  return out


def group_fn(group: Group):
  """fn(x, key) -> {case name: outputs} for every case of the group (one program)."""
  import jax
  import jax.numpy as jnp

  from lpjax import quant

  fmt = get_format(group.fmt)

  def fn(x, key):
    if group.hadamard:
      signs = quant.random_signs(jax.random.fold_in(key, 7), group.hadamard)
      x = quant.hadamard(x.astype(jnp.float32), group.hadamard, axis=group.axis, signs=signs)
    out = {}
    for rounding in group.roundings:
      for mode in group.scale_modes:
        kw = dict(axis=group.axis, rounding=rounding, impl="xla")
        if mode is not None:
          kw["scale_mode"] = mode
        if rounding == "stochastic":
          kw["key"] = key
        name = rounding + (f"/{mode}" if mode else "")
        q = quant.quantize(x, fmt, **kw)
        out[f"{name} quantize"] = q
        out[f"{name} dequantize"] = quant.dequantize(q, jnp.float32, impl="xla")
        if mode in (None, SCALE_MODES[0]) and rounding in ("nearest_even", "stochastic"):
          out[f"{name} fake_quant"] = quant.fake_quant(x, fmt, **kw)
    return out

  return fn


def run(rec, dry_run: bool) -> None:
  import jax

  device = jax.devices()[0]
  try:
    cpu = jax.devices("cpu")[0]
  except RuntimeError as e:
    raise RuntimeError("stage b needs the host CPU backend beside the GPU (JAX_PLATFORMS must "
                       f"include cpu): {e}") from e
  if device.platform == "cpu" and not dry_run:
    rec.note("The default device is the CPU: this compares the CPU with itself.")
  data = data_sets(dry_run)
  key = jax.random.key(1234)

  def both(group):  # XLA compiles outside the GIL: groups compile side by side in threads
    fn, x = group_fn(group), data[group.data]
    outs, compile_s, run_s = [], 0.0, 0.0
    for where in (device, cpu):
      args = jax.device_put((x, key), where)
      exe, seconds = _timing.compiled(fn, *args)
      start = time.perf_counter()
      outs.append(jax.device_get(exe(*args)))
      compile_s, run_s = compile_s + seconds, run_s + time.perf_counter() - start
    return outs[0], outs[1], compile_s, run_s

  total = same = 0
  for group, result in in_order(rec, groups(dry_run), both, workers=1 if dry_run else 6,
                                label=lambda g: g.label):
    if isinstance(result, Exception):
      rec.check(group.label, False, f"{type(result).__name__}: {result}"[:500])
      continue
    on_device, on_cpu, compile_s, run_s = result
    rec.add_time(compile_s=compile_s, run_s=run_s)  # summed over threads: CPU-seconds
    identical = 0
    for name in on_cpu:
      ok, why = same_bits(on_device[name], on_cpu[name])
      identical += ok
      rec.check(f"{group.label}: {name}", ok, why)
    total, same = total + len(on_cpu), same + identical
    rec.row("cases", group=group.label, cases=len(on_cpu), bit_identical=identical)
    rec.figure("bit-identical", 100.0 * same / total, f"% of {total} cases", goal="100%",
               met=same == total)  # kept up to date: a stage cut short still reports it
  if not total:
    rec.figure("bit-identical", None, goal="100%")
