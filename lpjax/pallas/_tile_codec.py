"""The quantizer of `lpjax.quant.codec.group_codec`, restated for one kernel tile with ops Triton can lower.

A tile holds whole scaling groups in a grouped view (a keepdims reduction over `axis` gives one
value per group). Encoding and decoding call the same exact-integer routines as the XLA path
(`fp32_bits.split`, `round_to_grid`, `scales.e8m0_exponent`, ...), so the bits agree by
construction. Three things differ, because a Triton kernel cannot run them:

- `materialize.materialize` (an XLA:CPU fusion workaround that divides by an opaque 1) is left out; it
  returns its input unchanged.
- NVFP4's per-tensor values (S_enc, 1/S_enc: a 26-step restoring division) are computed once on the
  host side (`nvfp4_tensor_constants`) and passed in.
- `fp32_bits.recip_normal` divides in float32, which the Triton backend lowers to the approximate
  `div.full.f32`; `recip_exact` computes the same IEEE quotient by integer restoring division.

Examples:
  >>> import jax.numpy as jnp
  >>> from lpjax.quant.formats import specs as formats
  >>> from lpjax.quant.numerics import fp32_bits
  >>> bits = fp32_bits.to_bits(jnp.array([[1.0, -3.0, 0.25, 6.0]]))
  >>> codes, scales = encode(bits, formats.get_format("mxfp4"), 1, rounding="nearest_even",
  ...                        scale_mode="floor")
  >>> [hex(int(c)) for c in codes[0]], int(scales[0, 0])
  (['0x2', '0xd', '0x0', '0x7'], 127)
  >>> fp32_bits.from_bits(decode(codes, scales, formats.get_format("mxfp4")))[0].tolist()
  [1.0, -3.0, 0.0, 6.0]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lpjax.quant.formats import specs as formats
from lpjax.quant.numerics import fp32_bits as fb
from lpjax.quant.numerics import rng
from lpjax.quant.codec import scales_exact as sc

U32 = jnp.uint32
I32 = jnp.int32
E8M0_NAN = sc.E8M0_NAN
UE4M3_NAN = sc.UE4M3_NAN
_E4M3_GRID = fb.Grid.for_element(formats.ELEMENT_FORMATS["e4m3"])
_RECIP_STEPS = 26  # quotient bits beyond the first, as fp32_bits.div


def with_sign(mag, negative, element):
  """Sign-magnitude code of a float element (docs/numerics.md §4: the sign bit of x, zeros included)."""
  return mag | (negative.astype(U32) << (element.bits - 1))


def _normalize(sig, exp):
  s = jnp.clip(24 - fb.bit_length(sig), 0, 24)
  return sig << s.astype(U32), exp - s


def recip_exact(a_bits):
  """fl32(1 / a) for finite non-zero float32 bits `a` (IEEE nearest-even, overflow to Inf).

  The quotient 2**49 / sig is computed bit by bit (unrolled restoring division, as
  `fp32_bits.div`) and rounded once with its sticky bit, so it equals the IEEE quotient wherever
  `fp32_bits.recip_normal` is defined, with integer operations only.
  """
  negative, sig, exp = fb.split(a_bits)
  sig, exp = _normalize(jnp.maximum(sig, 1), exp)  # sig in [2**23, 2**24)
  one = U32(1 << 23)
  q = (one >= sig).astype(U32)
  rem = one - q * sig
  for _ in range(_RECIP_STEPS):
    rem = rem << 1
    bit = rem >= sig
    q = (q << 1) | bit.astype(U32)
    rem = jnp.where(bit, rem - sig, rem)
  return fb.pack_fp32(negative, q, -23 - exp - _RECIP_STEPS, rem != 0)


def nvfp4_tensor_constants(amax_t_bits, use_tensor_scale: bool):
  """Per-tensor NVFP4 values (docs/numerics.md §5), computed once outside the kernel.

  Returns uint32 bits (c_significand, c_exp, recip_s_enc): S_enc * fl32(1/6) split by
  `fp32_bits.scale_parts`, and fl32(1 / S_enc), exactly as `scales.nvfp4_block_scales` uses them.
  """
  s_enc = sc.nvfp4_encode_scale(amax_t_bits, use_tensor_scale)
  c = fb.mul(s_enc, U32(sc.f32_const_bits(1.0 / 6.0)))
  significand, c_exp = fb.scale_parts(c)
  return fb.to_bits(significand), c_exp.astype(U32), fb.recip(s_enc)


def nvfp4_block_scales(amax_bits, c_significand_bits, c_exp, recip_s_enc_bits):
  """(s_b ue4m3 bytes, S_enc_b bits) per block: `scales.nvfp4_block_scales` with its per-tensor
  values passed in and `recip_exact` for the reciprocal."""
  p = fb.mul_by_scale(amax_bits, fb.from_bits(c_significand_bits), c_exp.astype(I32))
  _, sig, exp = fb.split(p)
  s_b = fb.round_to_grid(sig, exp, _E4M3_GRID, "nearest_even")  # saturates at 448
  negative, s_b_sig, s_b_exp = sc.decode_sig_exp(s_b, "e4m3")
  t = fb.mul_small(s_b_sig, s_b_exp, negative, recip_s_enc_bits)
  # t < 2**126, so 1 / t is never subnormal (as in scales.nvfp4_block_scales).
  s_enc_b = jnp.where(t == 0, U32(sc.FLT_MAX_BITS),
                      jnp.minimum(recip_exact(t), U32(sc.FLT_MAX_BITS)))
  return s_b, s_enc_b


def encode(x_bits, fmt, axis: int, *, rounding: str, scale_mode, random_bits=None, nvfp4=None):
  """Codes and per-group scale bytes (both uint32, scales keepdims) of grouped float32 bits.

  Args:
    x_bits: uint32 float32 bit patterns, grouped: a reduction over `axis` spans one group.
    fmt: a block format with e8m0 or ue4m3 scales and float elements.
    axis: the group axis of `x_bits`.
    rounding, scale_mode: as `lpjax.quant.quantize` (validated by the caller).
    random_bits: uint32 like x_bits, for rounding="stochastic".
    nvfp4: ue4m3 scales: the triple of `nvfp4_tensor_constants` (scalars or broadcastable).
  """
  element = fmt.element
  grid = fb.Grid.for_element(element)
  amax = jnp.max(x_bits & U32(fb.ABS_MASK), axis=axis, keepdims=True)
  bad = amax >= U32(fb.INF_BITS)  # NaN or Inf in the group: the whole group is NaN (§4, §5)
  if fmt.scale == "e8m0":
    k = sc.e8m0_exponent(amax, element, scale_mode)
    negative, sig, exp = fb.split(x_bits)
    mag = fb.round_to_grid(sig, exp - k, grid, rounding, negative=negative,
                           random_bits=random_bits)
    scales = jnp.where(bad, U32(E8M0_NAN), (k + 127).astype(U32))
  elif fmt.scale == "ue4m3":
    s_b, s_enc_b = nvfp4_block_scales(amax, *nvfp4)
    significand, s_exp = fb.scale_parts(s_enc_b)
    v = fb.mul_by_scale(x_bits, significand, s_exp)
    negative, sig, vexp = fb.split(v)
    mag = fb.round_to_grid(sig, vexp, grid, rounding, negative=negative,
                           random_bits=random_bits)
    scales = jnp.where(bad, U32(UE4M3_NAN), s_b)
  else:
    raise NotImplementedError(f"tile_codec.encode: {fmt.scale} scales have no kernel.")
  codes = jnp.where(bad, U32(0), with_sign(mag, negative, element))
  return codes, scales


def decode(codes, scales, fmt, amax_t_bits=None):
  """Exact float32 bits of grouped codes (uint32) with keepdims scale bytes (uint32)."""
  element = fmt.element
  negative, sig, exp = sc.decode_sig_exp(codes, element.name)
  if fmt.scale == "e8m0":
    out = fb.pack_fp32(negative, sig, exp + scales.astype(I32) - 127)
    bad = scales == U32(E8M0_NAN)
  else:
    multiplier = sc.nvfp4_decode_scale(scales, amax_t_bits, fmt.tensor_scale)
    out = fb.mul_small(sig, exp, negative, multiplier)
    bad = scales == U32(UE4M3_NAN)
  return jnp.where(bad, U32(sc.F32_NAN_BITS), out)


def pack_nibbles(codes, axis: int):
  """Two 4-bit codes per byte along `axis` (even length): element 2i low, 2i+1 high (§1).

  A sum of shifted nibbles (they never overlap), since Triton has no strided slices of values.
  """
  shape = codes.shape
  pairs = codes.reshape(shape[:axis] + (shape[axis] // 2, 2) + shape[axis + 1:])
  shift = jax.lax.broadcasted_iota(U32, pairs.shape, axis + 1) * U32(4)
  return jnp.sum(pairs << shift, axis=axis + 1, dtype=U32)


def unpack_nibbles(packed, axis: int):
  """Inverse of `pack_nibbles`: uint32 codes, twice as many along `axis`."""
  shape = packed.shape
  wide = shape[:axis + 1] + (2,) + shape[axis + 1:]
  pairs = jnp.broadcast_to(jnp.expand_dims(packed.astype(U32), axis + 1), wide)
  shift = jax.lax.broadcasted_iota(U32, wide, axis + 1) * U32(4)
  nibbles = (pairs >> shift) & U32(0xF)
  return nibbles.reshape(shape[:axis] + (2 * shape[axis],) + shape[axis + 1:])


def random_bits(flat_index, a, m):
  """The stochastic-rounding bits of `lpjax.quant.numerics.rng` for uint32 flat indices and a
  key's stream words (a, m) (`rng.stream_words`)."""
  return rng.hash_bits(flat_index, a, m)
