"""The Stable-SPAM paper's W4A4 fake quantizers (docs/numerics.md §7), as plain jnp functions.

Not formats of the core (no packed codes): they exist to reproduce that paper's "FP4" and "INT4"
runs. Groups of `group` consecutive elements run along `axis` (the GEMM's contraction axis: the
paper's code views row-major (out, in) weights and (..., in) activations as rows of 256); a
length that is not a multiple of the group is zero-padded, as the core does for blocks.

- `fp4_fake_quant`: per group, the `topk` (2) largest |x| are kept exact; the other values are
  rounded half to even onto the 9-level grid {0, ±1/4, ±1/2, ±3/4, ±1} x alpha, alpha = the
  absmax of those remaining values (clamped to >= 1e-6 as in the reference code).
- `int4_fake_quant`: symmetric absmax int4 with the top-2 kept: codes round(x * 7 / alpha)
  clamped to [-8, 7], values code * (alpha * fl32(1/7)) (reference: Q-GaLore's
  `fake_topk_quantize`).
- `uint4_fake_quant`: asymmetric min/max uint4 with an integer zero point (reference:
  `_quantize_tensor` of the Stable-SPAM code): scale = max(hi - lo, 1e-5) * fl32(1/15),
  zero = clip(-round(lo / scale), 0, 15), code = clip(round(x / scale) + zero, 0, 15),
  value = (code - zero) * scale.

All arithmetic is float32 (round half to even, like torch.round). `OperandQuant(fmt=name)` accepts
the names in `NAMES`: "ssp_fp4_g256", "ssp_int4_g256", "ssp_uint4_g256".

Examples:
  >>> import jax.numpy as jnp
  >>> x = jnp.array([10.0, -7.0, 0.3, -0.5, 0.62, 1.0, 0.0, 0.12])
  >>> fp4_fake_quant(x, group=8).tolist()   # 10 and -7 kept; alpha = 1: steps of 1/4
  [10.0, -7.0, 0.25, -0.5, 0.5, 1.0, 0.0, 0.0]
  >>> quantize_ssp(x, "ssp_int4_g256").tolist()[:4]  # alpha = 1, steps of 1/7; -3.5 -> -4 (half even)
  [10.0, -7.0, 0.2857142984867096, -0.5714285969734192]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

NAMES = ("ssp_fp4_g256", "ssp_int4_g256", "ssp_uint4_g256")
_ALPHA_MIN = 1e-6  # reference code: absmax.clamp(min=1e-6)
_SPAN_MIN = 1e-5  # reference code: (max - min).clamp(min=1e-5)
# Divisions by the constants 7 and 15 are multiplications by their float32 reciprocals (XLA
# rewrites x / 7 so anyway, depending on fusion; this makes it explicit and deterministic). The
# reference code divides, which can differ by one ulp.
_INV7 = np.float32(1.0 / 7.0)
_INV15 = np.float32(1.0 / 15.0)


def _grouped(x, group: int, axis: int):
  """x -> (..., n_groups, group) along `axis` (zero-padded), and the inverse map."""
  x = jnp.moveaxis(x, axis, -1)
  n = x.shape[-1]
  pad = (-n) % group
  if pad:
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])
  shape = x.shape

  def ungroup(g):
    return jnp.moveaxis(g.reshape(shape)[..., :n], -1, axis)

  return x.reshape(shape[:-1] + (shape[-1] // group, group)), ungroup  # not -1: empty x too


def _topk_mask(g, topk: int):
  """True at the `topk` largest |g| of each group (ties: the lowest index, like torch.topk)."""
  mag = jnp.abs(g)
  idx = jax.lax.broadcasted_iota(jnp.int32, g.shape, g.ndim - 1)
  keep = jnp.zeros(g.shape, bool)
  for _ in range(topk):
    m = jnp.max(jnp.where(keep, -1.0, mag), axis=-1, keepdims=True)
    first = jnp.min(jnp.where((mag == m) & ~keep, idx, g.shape[-1]), axis=-1, keepdims=True)
    keep = keep | (idx == first)
  return keep


def _split_outliers(x, group: int, topk: int, axis: int):
  """Groups of x, the top-k mask, the remaining values and their absmax alpha (per group)."""
  g, ungroup = _grouped(x.astype(jnp.float32), group, axis)
  keep = _topk_mask(g, topk) if topk else jnp.zeros(g.shape, bool)
  rest = jnp.where(keep, 0.0, g)
  alpha = jnp.maximum(jnp.max(jnp.abs(rest), axis=-1, keepdims=True), _ALPHA_MIN)
  return g, ungroup, keep, rest, alpha


def fp4_fake_quant(x, *, group: int = 256, topk: int = 2, axis: int = -1):
  """The SSP "FP4" quantizer: top-k kept, the rest on {0, ±1/4, ±1/2, ±3/4, ±1} x alpha."""
  dtype = x.dtype
  g, ungroup, keep, rest, alpha = _split_outliers(x, group, topk, axis)
  step = alpha * 0.25  # exact
  q = jnp.round(rest / step) * step  # |rest| <= alpha: no clipping needed
  return ungroup(jnp.where(keep, g, q)).astype(dtype)


def int4_fake_quant(x, *, group: int = 256, topk: int = 2, axis: int = -1):
  """The SSP "INT4" activation quantizer: symmetric absmax int4 per group, top-k kept."""
  dtype = x.dtype
  g, ungroup, keep, rest, alpha = _split_outliers(x, group, topk, axis)
  codes = jnp.clip(jnp.round(rest * (7.0 / alpha)), -8.0, 7.0)
  return ungroup(jnp.where(keep, g, codes * (alpha * _INV7))).astype(dtype)


def uint4_fake_quant(x, *, group: int = 256, axis: int = -1):
  """The SSP "INT4" weight quantizer: asymmetric min/max uint4 with an integer zero point."""
  dtype = x.dtype
  g, ungroup = _grouped(x.astype(jnp.float32), group, axis)
  lo = jnp.min(g, axis=-1, keepdims=True)
  hi = jnp.max(g, axis=-1, keepdims=True)
  scale = jnp.maximum(hi - lo, _SPAN_MIN) * _INV15
  zero = jnp.clip(-jnp.round(lo / scale), 0.0, 15.0)
  codes = jnp.clip(jnp.round(g / scale) + zero, 0.0, 15.0)
  return ungroup((codes - zero) * scale).astype(dtype)


def quantize_ssp(x, name: str, *, axis: int = -1):
  """Fake-quantizes `x` with the SSP quantizer `name` (one of `NAMES`) along `axis`."""
  if name == "ssp_fp4_g256":
    return fp4_fake_quant(x, group=256, axis=axis)
  if name == "ssp_int4_g256":
    return int4_fake_quant(x, group=256, axis=axis)
  if name == "ssp_uint4_g256":
    return uint4_fake_quant(x, group=256, axis=axis)
  raise ValueError(f"Unknown SSP quantizer {name!r}; valid: {', '.join(NAMES)}.")
