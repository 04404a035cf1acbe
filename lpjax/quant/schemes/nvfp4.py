"""NVFP4 quantizers of the 2025-2026 recipes: "Four over Six" block scales and MS-EDEN.

Both produce NVFP4 data (e2m1 elements, ue4m3 scales per 16 elements, one fp32 tensor scale)
but choose the block scales differently from the plain rule of `lpjax.quant.quantize`
(docs/numerics.md §7b gives the definitions, their sources and the exact float operations):

* `four_over_six` (Cook et al. 2025, arXiv 2512.02010; also the forward of Quartet II): every
  block is encoded twice, with its amax mapped onto 6 and onto 4, and the encoding with the
  smaller squared error is kept (ties keep 6). The tensor scale maps the tensor amax onto
  6 x 256 (not 6 x 448), so the map-to-4 scale (x 1.5) stays inside E4M3.
* `ms_eden` (Quartet II, arXiv 2601.22813, "MS-EDEN"): the backward quantizer of Quartet II.
  After the GEMM's random Hadamard transform, each block is rounded to nearest with its amax
  mapped onto 6 / ((17/16) 0.93); per Hadamard group the EDEN factor
  sum(x^2) / sum(x q(x)) corrects the length of the rounded vector, and is folded into the
  block scales, which are then rounded stochastically onto the E4M3 grid. Unbiased in
  expectation over the random rotation and the scale rounding.

Every operation is float32 with a fixed order (sums over a block or group are pairwise trees),
so `tests/quant/test_nvfp4_schemes.py` re-derives the values bit for bit in numpy.

Examples:
  >>> import jax.numpy as jnp
  >>> from lpjax.quant import dequantize, quantize
  >>> x = jnp.array([[1.0, 2.0, 3.0, 4.0] * 4])   # amax 4: on the map-to-4 grid
  >>> [round(v, 4) for v in dequantize(quantize(x, "nvfp4"), jnp.float32)[0, :4].tolist()]
  [1.0, 2.0, 2.6667, 4.0]
  >>> [round(v, 4) for v in four_over_six(x, tile=False, rounding="nearest_even", key=None)[0, :4].tolist()]
  [1.0, 2.0, 3.0, 4.0]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.quant.numerics import rng

SCHEMES = ("four_over_six", "ms_eden")
BLOCK = 16  # elements per block scale (NVFP4)
E2M1_MAX = 6.0
FOUR_OVER_SIX_SCALE_MAX = 256.0  # E4M3 value the tensor amax's block maps onto (x 1.5 <= 448)
EDEN_SCALE_MAX = 255.99  # Quartet II: room for the EDEN correction to raise a scale
EDEN_VAL_MAX = float(np.float32(6.0 / ((17.0 / 16.0) * 0.93)))  # ~6.072: amax's target (clips to 6)
F32 = jnp.float32


def recip(c: float) -> np.float32:
  """float32(1 / c): a division by a constant is a multiplication by this (XLA compiles it so)."""
  return np.float32(1.0 / np.float64(c))


def tree_sum(x):
  """Sum over the last axis (a power of two long) as a pairwise tree: a fixed float order."""
  while x.shape[-1] > 1:
    x = x[..., 0::2] + x[..., 1::2]
  return x[..., 0]


def round_e2m1(v, rounding: str, u=None):
  """v (float32, |v| <= ~6.4) rounded onto the e2m1 grid, clipped to +-6; every step exact.

  The grid step is 0.5 below 2, 1 below 4 and 2 above: v / step is exact (a power of two) and
  its integer rounding is computed from floor (t - floor(t) is exact for |t| < 2^23).
  `u`: uniform [0, 1) per element, for rounding="stochastic": up when u < t - floor(t) (an exact
  comparison; unbiased to the 2^-24 resolution of u).
  """
  a = jnp.abs(v)
  step = jnp.where(a < 2, F32(0.5), jnp.where(a < 4, F32(1.0), F32(2.0)))
  t = a / step
  fl = jnp.floor(t)
  if rounding == "nearest_even":
    n = jnp.round(t)  # half to even
  elif rounding == "nearest_away":
    n = fl + (t - fl >= 0.5).astype(F32)
  elif rounding == "nearest_toward_zero":  # QuEST's kernel (lpjax.quant.schemes.quest)
    n = fl + (t - fl > 0.5).astype(F32)
  elif rounding == "stochastic":
    n = fl + (u < t - fl).astype(F32)
  else:
    raise ValueError(f"rounding {rounding!r}: these schemes round 'nearest_even', 'nearest_away' "
                     "or 'stochastic'.")
  q = jnp.minimum(n * step, F32(E2M1_MAX))
  return jnp.where(v < 0, -q, q)


def _uniform(key, shape):
  """Uniform [0, 1) float32 with 24 random bits each (exact), from the counter hash."""
  bits = rng.random_bits(key, shape)
  return (bits >> 8).astype(F32) * F32(2.0**-24)


def _to_e4m3(v):
  """float32 -> nearest E4M3 value (ties to even, subnormals included) as float32."""
  return v.astype(jnp.float8_e4m3fn).astype(F32)


def _blocks(x, tile: bool):
  """x (..., R, C) float32 -> (blocks (..., n, 16 or 256), undo) with zero padding."""
  if not tile:
    pad = (-x.shape[-1]) % BLOCK
    xp = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])
    shape = xp.shape
    return xp.reshape(shape[:-1] + (shape[-1] // BLOCK, BLOCK)), lambda b: b.reshape(shape)[..., :x.shape[-1]]
  if x.ndim < 2:
    raise ValueError("16x16 tiles need an operand with at least two axes.")
  pr, pc = (-x.shape[-2]) % BLOCK, (-x.shape[-1]) % BLOCK
  xp = jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, pr), (0, pc)])
  *lead, r, c = xp.shape
  t = xp.reshape(*lead, r // BLOCK, BLOCK, c // BLOCK, BLOCK)
  t = jnp.moveaxis(t, -3, -2).reshape(*lead, r // BLOCK, c // BLOCK, BLOCK * BLOCK)

  def undo(b):
    b = b.reshape(*lead, r // BLOCK, c // BLOCK, BLOCK, BLOCK)
    b = jnp.moveaxis(b, -2, -3).reshape(*lead, r, c)
    return b[..., :x.shape[-2], :x.shape[-1]]

  return t, undo


def four_over_six(x, *, tile: bool, rounding: str, key):
  """Four over Six NVFP4 fake quantization along the last axis (16x16 tiles if `tile`).

  Args:
    x: float32 array; blocks of 16 along the last axis (or 16x16 tiles over the last two).
    tile: 16x16 tiles (weights, so that Q(W)^T == Q(W^T)).
    rounding: "nearest_even" (the Four over Six paper), "nearest_away" (Quartet II's kernel) or
      "stochastic" (gradients; each candidate with its own random draw).
    key: jax.random key for rounding="stochastic".

  Returns:
    The dequantized values, float32, x's shape.
  """
  x = x.astype(F32)
  b, undo = _blocks(x, tile)
  amax = jnp.max(jnp.abs(b)) if b.size else F32(0)
  dec = amax * recip(E2M1_MAX * FOUR_OVER_SIX_SCALE_MAX)  # fp32 tensor decode scale
  enc = F32(E2M1_MAX * FOUR_OVER_SIX_SCALE_MAX) / amax
  bamax = jnp.max(jnp.abs(b), axis=-1, keepdims=True)
  us = ((None, None) if rounding != "stochastic" else
        (_uniform(jax.random.fold_in(key, 0), b.shape), _uniform(jax.random.fold_in(key, 1), b.shape)))
  candidates = []
  for target, u in zip((6.0, 4.0), us):
    s = _to_e4m3((bamax * recip(target)) * enc)
    step = s * dec
    q = jnp.where(s > 0, round_e2m1(b / jnp.where(s > 0, step, F32(1)), rounding, u), F32(0))
    deq = q * step
    candidates.append((deq, tree_sum(jnp.square(deq - b))[..., None]))
  (deq6, err6), (deq4, err4) = candidates
  out = jnp.where(err4 < err6, deq4, deq6)
  out = jnp.where(amax > 0, out, b)  # an all-zero tensor stays as it is
  return undo(out)


def ms_eden(x, *, group: int, key):
  """MS-EDEN NVFP4 fake quantization along the last axis (x already rotated by the GEMM's RHT).

  Args:
    x: float32 array, its last axis a multiple of `group` (the GEMM's RHT pads it).
    group: the Hadamard block: the EDEN correction is one factor per `group` elements.
    key: jax.random key of the stochastic scale rounding (one uniform per block of 16).

  Returns:
    The dequantized values, float32, x's shape.
  """
  x = x.astype(F32)
  if group % BLOCK or x.shape[-1] % group:
    raise ValueError(f"ms_eden needs the last axis ({x.shape[-1]}) to be a multiple of its "
                     f"Hadamard group ({group}), itself a multiple of {BLOCK}.")
  lead, n = x.shape[:-1], x.shape[-1]
  g = x.reshape(lead + (n // group, group // BLOCK, BLOCK))
  amax = jnp.max(jnp.abs(g)) if g.size else F32(0)
  d = jnp.where(amax == 0, F32(1), (amax * recip(EDEN_SCALE_MAX)) * recip(EDEN_VAL_MAX))
  s = _to_e4m3((jnp.max(jnp.abs(g), axis=-1, keepdims=True) * recip(EDEN_VAL_MAX)) / d)
  s = jnp.where(s == 0, F32(1), s)
  xs = g / (s * d)
  q = round_e2m1(xs, "nearest_away")
  flat = lambda v: v.reshape(v.shape[:-2] + (group,))
  num = tree_sum(flat(xs * xs))
  den = tree_sum(flat(xs * q))
  corr = jnp.where(den == 0, F32(1), num / jnp.where(den == 0, F32(1), den))
  cs = s * corr[..., None, None]  # (.., groups, blocks, 1)
  # Stochastic rounding of the corrected scale between its E4M3 neighbours.
  bits = jax.lax.bitcast_convert_type(cs.astype(jnp.float8_e4m3fn), jnp.uint8).astype(jnp.int32)
  at = lambda b: jax.lax.bitcast_convert_type(jnp.clip(b, 0, 0x7E).astype(jnp.uint8),
                                              jnp.float8_e4m3fn).astype(F32)
  cur = at(bits)
  up = jnp.where(cur > cs, cur, at(bits + 1))
  down = jnp.where(cur > cs, at(bits - 1), cur)
  p_up = (cs - down) / (up - down)
  u = _uniform(key, cs.shape[:-1])[..., None]
  scale = jnp.where(u < p_up, up, down)
  return ((q * scale) * d).reshape(x.shape)
