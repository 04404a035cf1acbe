"""NVFP4's two-level block scales (docs/numerics.md §5) in float32, with the exact bits of `_scales`.

`_scales.nvfp4_block_scales` computes s_b, S_enc_b and the decode multiplier with integer
emulation of every IEEE operation (~300 integer ops per block), because a tensor of tiny values
can make the intermediate products subnormal. For every tensor whose amax_t is 0 or at least
2**-100 none of them is, and then each float32 operation below is one correctly rounded IEEE
operation on normal numbers, i.e. the same value (with s_b_val in [2**-9, 448] or 0):

- p = fl32(amax_b * c), c = fl32(S_enc * fl32(1/6)) per tensor: `_fast_codec.scaled_magnitude`
  (exact for subnormal amax_b too; a product below 2**-126 rounds to s_b = 0 either way).
- s_b = e4m3 round-half-even of p, saturated: `_fast_codec.round_magnitude`.
- t = fl32(s_b_val * fl32(1 / S_enc)): fl32(1 / S_enc) = amax_t / 2688 rounded, so with amax_t
  >= 2**-100, t >= 2**-9 * 2**-112 is normal, and t <= FLT_MAX / 6.
- S_enc_b = min(fl32(1 / t), FLT_MAX), FLT_MAX when t == 0: 1 / t >= 6 / FLT_MAX is normal.
- decode multiplier fl32(fl32(s_b_val * amax_t) * fl32(1/2688)): >= 2**-120 when not 0; for
  amax_t >= 2**64 both paths form it at amax_t * 2**-64 and scale the result back by 2**64
  (exact: every intermediate is normal), so it never overflows.

`block_scales` picks this path per tensor with `lax.cond` and falls back to `_scales` otherwise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lpjax.quant import _fast_codec as fast
from lpjax.quant import _formats as formats
from lpjax.quant import _fp32_bits as fb
from lpjax.quant import _scales as sc

U32 = jnp.uint32
_E4M3 = formats.ELEMENT_FORMATS["e4m3"]
_SMALLEST_SAFE_AMAX_T = 0x0D800000  # float32 bits of 2**-100


def in_range(amax_t_bits):
  """Whether the float path is exact for this tensor: amax_t == 0 or 2**-100 <= amax_t < inf."""
  return (amax_t_bits == 0) | ((amax_t_bits >= U32(_SMALLEST_SAFE_AMAX_T))
                               & (amax_t_bits < U32(fb.INF_BITS)))


def _decode_multiplier(s_b_val, amax_t_bits, use_tensor_scale):
  if not use_tensor_scale:
    return fb.to_bits(s_b_val)
  # amax_t >= 2**64 (a per-tensor choice): the product at amax_t * 2**-64, scaled back after
  # (powers of two, exact on these normal values), so it cannot overflow (§5).
  big = amax_t_bits >= U32(sc.BIG_AMAX_T_BITS)
  down = jnp.where(big, jnp.float32(2.0**-64), jnp.float32(1.0))
  up = jnp.where(big, jnp.float32(2.0**64), jnp.float32(1.0))
  h = s_b_val * (fb.from_bits(amax_t_bits) * down)
  # XLA rewrites (a * C1) * C2 as a * (C1 * C2) when amax_t is a compile-time constant; a K that
  # XLA cannot prove constant (h >= 0, so its sign bit is 0) keeps the contract's order.
  k = fb.from_bits(U32(sc.f32_const_bits(1.0 / 2688.0)) | (fb.to_bits(h) >> 31))
  g = (h * k) * up
  return jnp.where(amax_t_bits == 0, fb.to_bits(s_b_val), fb.to_bits(g))


def _float_block_scales(amax_block_bits, s_enc_bits, amax_t_bits, use_tensor_scale):
  c = fb.mul(s_enc_bits, U32(sc.f32_const_bits(1.0 / 6.0)))  # per tensor, exact
  p = fast.scaled_magnitude(amax_block_bits, *fast.encode_factors(c))
  s_b, s_b_val = fast.round_magnitude(p, _E4M3, "nearest_even", negative=None)
  t = s_b_val * fb.from_bits(fb.recip(s_enc_bits))
  flt_max = fb.from_bits(U32(sc.FLT_MAX_BITS))
  s_enc_b = jnp.where(t == 0, flt_max, jnp.minimum(jnp.float32(1.0) / t, flt_max))
  return s_b, fb.to_bits(s_enc_b), _decode_multiplier(s_b_val, amax_t_bits, use_tensor_scale)


def _exact_block_scales(amax_block_bits, s_enc_bits, amax_t_bits, use_tensor_scale):
  s_b, s_enc_b = sc.nvfp4_block_scales(amax_block_bits, s_enc_bits)
  return s_b, s_enc_b, sc.nvfp4_decode_scale(s_b, amax_t_bits, use_tensor_scale)


def block_scales(amax_block_bits, s_enc_bits, amax_t_bits, use_tensor_scale: bool):
  """(s_b bytes, S_enc_b bits, decode multiplier bits) per block, as `_scales` computes them."""
  if amax_t_bits is None:
    amax_t_bits = U32(0)
  args = (amax_block_bits, s_enc_bits, amax_t_bits)
  if not use_tensor_scale:  # S_enc = 1: always in range
    return _float_block_scales(*args, False)
  return jax.lax.cond(in_range(amax_t_bits),
                      lambda *a: _float_block_scales(*a, True),
                      lambda *a: _exact_block_scales(*a, True), *args)


def decode_multiplier(s_b, amax_t_bits, use_tensor_scale: bool):
  """Per-block decode multiplier bits from s_b bytes, as `_scales.nvfp4_decode_scale` computes it."""
  def float_path(s_b, amax_t_bits):
    s_b_val = fb.from_bits(sc.decode_bits(s_b, "e4m3") & U32(fb.ABS_MASK))
    return _decode_multiplier(s_b_val, amax_t_bits, use_tensor_scale)

  if not use_tensor_scale:
    return float_path(s_b, U32(0))
  return jax.lax.cond(in_range(amax_t_bits), float_path,
                      lambda s, a: sc.nvfp4_decode_scale(s, a, True), s_b, amax_t_bits)
