"""NVFP4's two-level block scales (docs/numerics.md §5) in float32, with the exact bits of `_scales`.

`_scales.nvfp4_block_scales` computes s_b, S_enc_b and the decode multiplier with integer
emulation of every IEEE operation (~300 integer ops per block), because a tensor of tiny values
can make the intermediate products subnormal. Here:

- The per-tensor values S_enc, c = fl32(S_enc * fl32(1/6)) and fl32(1 / S_enc) keep the integer
  routines, computed once per tensor (`_materialize`: not copied into every per-block fusion).
- p = fl32(amax_b * c) and s_b, its e4m3 round-half-even saturated at 448, are float32 for every
  tensor: `_fast_codec.scaled_magnitude` then `round_magnitude`. c is always normal (S_enc lies in
  [2688 / FLT_MAX, FLT_MAX] or is 1, or is 0 for a given tensor_amax of inf, where both paths give
  p = 0), which is all `scaled_magnitude` needs to be exact, subnormal amax_b included; a product
  below 2**-126 (flushed or not) rounds to s_b = 0 either way.
- The tail t, S_enc_b and the multiplier is float32 for every tensor whose amax_t is 0 or at least
  2**-100; then each float32 operation below is one correctly rounded IEEE operation on normal
  numbers, i.e. the same value (with s_b_val in [2**-9, 448] or 0):
  - t = fl32(s_b_val * fl32(1 / S_enc)): fl32(1 / S_enc) = amax_t / 2688 rounded, so with amax_t
    >= 2**-100, t >= 2**-9 * 2**-112 is normal, and t <= FLT_MAX / 6.
  - S_enc_b = min(fl32(1 / t), FLT_MAX), FLT_MAX when t == 0: 1 / t >= 6 / FLT_MAX is normal.
  - decode multiplier fl32(fl32(s_b_val * amax_t) * fl32(1/2688)): >= 2**-120 when not 0; for
    amax_t >= 2**64 both paths form it at amax_t * 2**-64 and scale the result back by 2**64
    (exact: every intermediate is normal), so it never overflows.
  Other tensors (amax_t below 2**-100, or a given tensor_amax of inf or NaN) take the integer
  routines for the tail (`lax.cond`, per tensor).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lpjax.quant import _fast_codec as fast
from lpjax.quant import _formats as formats
from lpjax.quant import _fp32_bits as fb
from lpjax.quant import _scales as sc
from lpjax.quant._materialize import materialize, opaque_zero

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


def _per_tensor(values, amax_t_bits):
  """Per-tensor scalars computed once. XLA would otherwise fuse their integer emulation (hundreds of
  scalar operations each) into every per-block consumer, and compile it again in each fusion."""
  return materialize(values, opaque_zero(amax_t_bits))


def _float_tail(s_b_val, recip_s_enc, amax_t_bits, use_tensor_scale):
  t = s_b_val * fb.from_bits(recip_s_enc)
  flt_max = fb.from_bits(U32(sc.FLT_MAX_BITS))
  s_enc_b = jnp.where(t == 0, flt_max, jnp.minimum(jnp.float32(1.0) / t, flt_max))
  return fb.to_bits(s_enc_b), _decode_multiplier(s_b_val, amax_t_bits, use_tensor_scale)


def _exact_tail(s_b, recip_s_enc, amax_t_bits, use_tensor_scale):
  """S_enc_b and the decode multiplier with `_scales`' integer arithmetic (as in
  `_scales.nvfp4_block_scales` from t on, and `_scales.nvfp4_decode_scale`)."""
  negative, sig, exp = sc.decode_sig_exp(s_b, "e4m3")
  t = fb.mul_small(sig, exp, negative, recip_s_enc)
  s_enc_b = jnp.where(t == 0, U32(sc.FLT_MAX_BITS),
                      jnp.minimum(fb.recip_normal(t), U32(sc.FLT_MAX_BITS)))
  return s_enc_b, sc.nvfp4_decode_scale(s_b, amax_t_bits, use_tensor_scale)


def block_scales(amax_block_bits, s_enc_bits, amax_t_bits, use_tensor_scale: bool):
  """(s_b bytes, S_enc_b bits, decode multiplier bits) per block, as `_scales` computes them.

  p and s_b are float32 for every tensor (c is always normal); t, S_enc_b and the multiplier are
  float32 when `in_range(amax_t)` and `_scales`' integer arithmetic otherwise (a `lax.cond`).
  """
  if amax_t_bits is None:
    amax_t_bits = U32(0)
  c, recip_s_enc = _per_tensor(
      (fb.mul(s_enc_bits, U32(sc.f32_const_bits(1.0 / 6.0))), fb.recip(s_enc_bits)), amax_t_bits)
  p = fast.scaled_magnitude(amax_block_bits, *fast.encode_factors(c))
  s_b, s_b_val = fast.round_magnitude(p, _E4M3, "nearest_even", negative=None)
  if not use_tensor_scale:  # S_enc = 1: always in range
    return (s_b,) + _float_tail(s_b_val, recip_s_enc, amax_t_bits, False)
  s_enc_b, m_bits = jax.lax.cond(
      in_range(amax_t_bits),
      lambda s_b, s_b_val, r, a: _float_tail(s_b_val, r, a, True),
      lambda s_b, s_b_val, r, a: _exact_tail(s_b, r, a, True),
      s_b, s_b_val, recip_s_enc, amax_t_bits)
  return s_b, s_enc_b, m_bits


def decode_multiplier(s_b, amax_t_bits, use_tensor_scale: bool):
  """Per-block decode multiplier bits from s_b bytes, as `_scales.nvfp4_decode_scale` computes it."""
  def float_path(s_b, amax_t_bits):
    s_b_val = fb.from_bits(sc.decode_bits(s_b, "e4m3") & U32(fb.ABS_MASK))
    return _decode_multiplier(s_b_val, amax_t_bits, use_tensor_scale)

  if not use_tensor_scale:
    return float_path(s_b, U32(0))
  return jax.lax.cond(in_range(amax_t_bits), float_path,
                      lambda s, a: sc.nvfp4_decode_scale(s, a, True), s_b, amax_t_bits)
