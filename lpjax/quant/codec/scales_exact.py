"""Block scales: e8m0 exponents (docs/numerics.md §4), NVFP4's two-level scales (§5), fp32 scales.

Every function works on float32 bit patterns with the exact integer arithmetic of `fp32_bits`, so
subnormal amaxes and scales give the same bytes on CPU (which flushes subnormals) and GPU.

Examples:
  >>> import jax.numpy as jnp
  >>> from lpjax.quant.formats import specs as formats
  >>> from lpjax.quant.numerics import fp32_bits
  >>> amax = fp32_bits.to_bits(jnp.float32(6.0))
  >>> int(e8m0_exponent(amax, formats.ELEMENT_FORMATS["e2m1"], "floor"))  # 6 = 1.5 * 2**2; k = 2 - 2
  0
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from lpjax.quant.formats import specs as formats
from lpjax.quant.numerics import fp32_bits as fb
from lpjax.quant.formats import tables

E8M0_NAN = 0xFF
UE4M3_NAN = 0x7F
FLT_MAX_BITS = 0x7F7FFFFF
F32_NAN_BITS = 0x7FC00000


def f32_const_bits(value: float) -> int:
  """The bits of fl32(value), computed on the host (no flushing)."""
  return int(np.float32(value).view(np.uint32))


def e8m0_exponent(amax_bits, element, scale_mode: str, *, clamp: bool = True):
  """The block scale exponent k (int32, clamped to [-127, 127]) of docs/numerics.md §4
  (clamp=False: the exponent before that clamp, for the monitor's `clamped_scales`)."""
  if scale_mode == "floor":
    k = fb.exponent(amax_bits) - element.emax
  elif scale_mode == "ceil":
    k = fb.exponent(amax_bits) + (~fb.is_power_of_two(amax_bits)).astype(jnp.int32) - element.emax
  elif scale_mode == "even":
    # Round amax half-up to the element's mantissa bits on the bit pattern (torchao EVEN); a carry
    # past the largest exponent leaves exponent field 255, which the clamp below makes finite.
    rounded = amax_bits + jnp.uint32(1 << (fb.FP32_GRID.mbits - element.mbits - 1))
    k = ((rounded >> 23) & 0xFF).astype(jnp.int32) - 127 - element.emax
    k = jnp.where(amax_bits < 0x800000, fb.exponent(amax_bits) - element.emax, k)  # subnormal amax
  elif scale_mode == "rceil":
    ratio = fb.mul(amax_bits, jnp.uint32(f32_const_bits(1.0 / element.max_value)))
    k = fb.exponent(ratio) + (~fb.is_power_of_two(ratio)).astype(jnp.int32)
  else:
    raise ValueError(f"Unknown e8m0 scale mode {scale_mode!r}.")
  # amax == 0 has exponent -150 above, which clamps to -127: scale byte 0x00 (§4).
  return jnp.clip(k, -127, 127) if clamp else k


def finite_tensor_amax_bits(abs_bits):
  """max |x| over the finite values, as bits (NVFP4 amax_t)."""
  return jnp.max(jnp.where(abs_bits < fb.INF_BITS, abs_bits, 0), initial=jnp.uint32(0))


def nvfp4_encode_scale(amax_t_bits, use_tensor_scale: bool):
  """S_enc of §5 as bits: min(448 * 6 / amax_t, FLT_MAX), 1 when amax_t == 0 or no tensor scale."""
  one = jnp.uint32(f32_const_bits(1.0))
  if not use_tensor_scale:
    return one
  s_enc = fb.div(jnp.uint32(f32_const_bits(448.0 * 6.0)), amax_t_bits)
  s_enc = jnp.minimum(s_enc, jnp.uint32(FLT_MAX_BITS))
  return jnp.where(amax_t_bits == 0, one, s_enc)


def nvfp4_block_scales(amax_block_bits, s_enc_bits):
  """Returns (s_b ue4m3 bytes as uint32, S_enc_b bits): the per-block part of §5."""
  e4m3 = fb.Grid.for_element(formats.ELEMENT_FORMATS["e4m3"])
  c = fb.mul(s_enc_bits, jnp.uint32(f32_const_bits(1.0 / 6.0)))  # per tensor
  p = fb.mul_by_scale(amax_block_bits, *fb.scale_parts(c))  # exact wherever it can matter
  _, sig, exp = fb.split(p)
  s_b = fb.round_to_grid(sig, exp, e4m3, "nearest_even")  # ue4m3 byte, saturated at 448
  return s_b, nvfp4_block_encode_scale(s_b, fb.recip(s_enc_bits))


def nvfp4_block_encode_scale(s_b, recip_s_enc_bits):
  """S_enc_b bits of §5 from the s_b bytes and the bits of fl32(1 / S_enc)."""
  negative, s_b_sig, s_b_exp = decode_sig_exp(s_b, "e4m3")
  t = fb.mul_small(s_b_sig, s_b_exp, negative, recip_s_enc_bits)
  # t <= 448 * FLT_MAX / 2688 < 2**126, so 1 / t is never subnormal: recip_normal is exact.
  return jnp.where(t == 0, jnp.uint32(FLT_MAX_BITS),
                   jnp.minimum(fb.recip_normal(t), jnp.uint32(FLT_MAX_BITS)))


BIG_AMAX_T_BITS = 0x5F800000  # float32 bits of 2**64: from here the decode product is rescaled


def nvfp4_decode_scale(s_b, amax_t_bits, use_tensor_scale: bool):
  """Per-block decode multiplier bits: (fl32(s_b) * amax_t) * fl32(1/2688), or s_b (§5)."""
  negative, sig, exp = decode_sig_exp(s_b, "e4m3")
  s_b_bits = fb.pack_fp32(negative, sig, exp)
  if not use_tensor_scale:
    return s_b_bits
  # amax_t >= 2**64: the product is formed at amax_t * 2**-64 and the result scaled back, so a
  # huge amax_t cannot overflow it (same bits wherever the plain product is finite; §5).
  big = amax_t_bits >= jnp.uint32(BIG_AMAX_T_BITS)
  shift = jnp.uint32(64 << 23)
  g = fb.mul(fb.mul_small(sig, exp, negative, jnp.where(big, amax_t_bits - shift, amax_t_bits)),
             jnp.uint32(f32_const_bits(1.0 / 2688.0)))
  g = jnp.where(big & ((g & jnp.uint32(fb.ABS_MASK)) != 0) & ((g & jnp.uint32(fb.ABS_MASK))
                                                               < jnp.uint32(fb.INF_BITS)),
                g + shift, g)
  return jnp.where(amax_t_bits == 0, s_b_bits, g)


def fp32_encode_scale(amax_bits, max_value: float):
  """enc = min(fl32(max_elem / amax), FLT_MAX), 1 when amax == 0 (docs/quant.md, fp32 scales)."""
  enc = fb.div(jnp.uint32(f32_const_bits(max_value)), amax_bits)
  enc = jnp.minimum(enc, jnp.uint32(FLT_MAX_BITS))
  return jnp.where(amax_bits == 0, jnp.uint32(f32_const_bits(1.0)), enc)


def decode_bits(codes, element_name: str):
  """float32 bit patterns of element codes.

  Float and integer formats decode arithmetically (a per-element gather does not vectorize on
  XLA:CPU); nf4 looks its grid up. Saturated quantizers never emit the NaN/Inf codes of e4m3/e5m2,
  so those are not special-cased here (decode_table has them).
  """
  element = formats.ELEMENT_FORMATS[element_name]
  codes = codes.astype(jnp.uint32)
  if element.kind == "lut":
    return jnp.asarray(tables.decode_bits_table(element_name))[codes.astype(jnp.int32)]
  if element.kind in ("int", "uint"):
    value = codes.astype(jnp.int32)
    if element.kind == "int":
      half = 1 << (element.bits - 1)
      value = jnp.where(value >= half, value - (1 << element.bits), value)
    return fb.to_bits(value.astype(jnp.float32))
  mb = element.mbits
  sign = (codes >> (element.bits - 1)) << 31
  efield = (codes >> mb) & ((1 << (element.bits - 1 - mb)) - 1)
  mant = codes & ((1 << mb) - 1)
  normal = ((efield + (element.emin - 1 + 127)) << 23) | (mant << (23 - mb))
  # Subnormal codes: mant * 2**(emin - mb), a product of normal float32 values, so exact anywhere.
  subnormal = fb.to_bits(mant.astype(jnp.float32) * jnp.float32(2.0 ** (element.emin - mb)))
  return sign | jnp.where(efield == 0, subnormal, normal)


def decode_sig_exp(codes, element_name: str):
  """(negative, sig, exp) of element codes with |value| = sig * 2**exp, sig < 2**7 (not nf4)."""
  element = formats.ELEMENT_FORMATS[element_name]
  codes = codes.astype(jnp.uint32)
  if element.kind in ("int", "uint"):
    value = codes.astype(jnp.int32)
    if element.kind == "int":
      value = jnp.where(value >= (1 << (element.bits - 1)), value - (1 << element.bits), value)
    return value < 0, jnp.abs(value).astype(jnp.uint32), jnp.zeros_like(value)
  if element.kind != "float":
    raise ValueError(f"{element_name} values have no short significand; use decode_bits.")
  mb = element.mbits
  negative = (codes >> (element.bits - 1)) != 0
  efield = ((codes >> mb) & ((1 << (element.bits - 1 - mb)) - 1)).astype(jnp.int32)
  mant = codes & ((1 << mb) - 1)
  sig = jnp.where(efield == 0, mant, mant | (1 << mb))
  exp = jnp.maximum(efield, 1) + (element.emin - 1 - mb)
  return negative, sig, exp
