"""Encode and decode a grouped array: scales per group, element codes per element.

Works on the grouped view of `layout.GroupLayout` (a reduction over `reduce_axes` with keepdims
gives the per-group values). With fast_path=False every step is exact integer arithmetic on
float32 bits (`fp32_bits`), except for the asymmetric uint4 format (see `_encode_uint4`); with
fast_path=True the per-element work (and NVFP4's block scales) runs in float32 with the same bits
(`fast_elements`, `scales_fast`).

Examples:
  >>> import jax.numpy as jnp
  >>> from lpjax.quant.formats import specs as formats
  >>> from lpjax.quant.numerics import fp32_bits
  >>> fmt = formats.get_format("mxfp4")
  >>> x = fp32_bits.to_bits(jnp.array([[1.0, -3.0, 0.25, 6.0]]))
  >>> enc = encode(x, fmt, (-1,), rounding="nearest_even", scale_mode="floor")
  >>> [hex(int(c)) for c in enc.codes[0]], int(enc.scales[0, 0])   # scale 2**0: byte 127
  (['0x2', '0xd', '0x0', '0x7'], 127)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.quant.codec import factor_tables as ft
from lpjax.quant.codec import fast_elements as fast
from lpjax.quant.codec import scales_fast as fast_scales
from lpjax.quant.formats import specs as formats
from lpjax.quant.numerics import fp32_bits as fb
from lpjax.quant.codec import scales_exact as sc
from lpjax.quant.numerics.materialize import materialize, opaque_zero as _opaque_zero

U32 = jnp.uint32


@dataclasses.dataclass
class Encoded:
  codes: Any  # uint32 element codes (sign included), grouped view
  scales: Any  # keepdims per-group: uint32 bytes (e8m0 / ue4m3) or float32 bits (fp32)
  tensor_amax_bits: Any = None  # NVFP4 amax_t (uint32 bits), else None
  zeros: Any = None  # uint4: float32 block minimum (keepdims), else None
  values: Any = None  # fast path with want_values: float32 bits of the dequantized values
  amax_bits: Any = None  # uint32 bits of max |x| per group (keepdims): what the scales came from


def _bad_group_masks(bad):
  """Per-group (keep, nan) uint32 masks: bits & keep | nan is NaN in groups with a NaN / Inf."""
  return (jnp.where(bad, U32(0), U32(0xFFFFFFFF)), jnp.where(bad, U32(sc.F32_NAN_BITS), U32(0)))


def _fast_elements(x_bits, abs_bits, rows, element, rounding, random_bits, want_values,
                   power_of_two=False):
  """The fast element path (`fast_elements`): (codes, dequantized value bits or None).

  `rows`: each group's factors and NaN masks (`factor_tables.look_up`). Bad groups (NaN / Inf) are
  masked with per-group AND / OR masks rather than a per-element select, which LLVM turns into a
  branch that stops XLA:CPU's loop from vectorizing.
  """
  negative = (x_bits >> 31) != 0
  s, s_sub = (ft.column(rows, j, jnp.float32) for j in (ft.S, ft.S_SUB))
  keep, nan = ft.column(rows, ft.KEEP), ft.column(rows, ft.NAN)
  v = fast.scaled_magnitude(abs_bits, s, s_sub)
  mag, value = fast.round_magnitude(v, element, rounding, negative=negative,
                                    random_bits=random_bits, nonzero=abs_bits != 0)
  codes = _with_sign(mag, negative, element) & keep
  if not want_values:
    return codes, None
  m_c, shift = ft.column(rows, ft.M_C, jnp.float32), ft.column(rows, ft.SHIFT)
  out = fast.apply_multiplier(value, m_c, shift, power_of_two=power_of_two,
                              wide=fast.is_wide(element))
  out = out | (x_bits & U32(fb.SIGN_MASK))
  out = (out & keep) | nan
  return codes, out if power_of_two else fast.canonical_nan(out)  # 2**k * value is never NaN


def _group_rows(s_bits, m_bits, bad, opaque_zero):
  """`factor_tables` rows computed per group (fp32 scales, whose factors are not a function of a
  byte): each column materialized once per group."""
  s, s_sub, keep, nan = materialize(fast.encode_factors(s_bits) + _bad_group_masks(bad),
                                    opaque_zero)
  m_c, shift = materialize(fast.decode_factors(m_bits), opaque_zero)
  return jnp.stack([fb.to_bits(s), fb.to_bits(s_sub), fb.to_bits(m_c), shift, keep,
                    nan], axis=-1)


def _with_sign(mag, negative, element):
  """Magnitude code + sign -> code: sign-magnitude for floats, two's complement for ints."""
  if element.kind == "int":
    mask = (1 << element.bits) - 1
    return jnp.where(negative, (U32(0) - mag) & mask, mag)
  return mag | (negative.astype(U32) << (element.bits - 1))


def _scaled_codes(x_bits, scale_bits, element, rounding, random_bits, opaque_zero):
  """Codes of fl32(x * scale) rounded onto the element grid (NVFP4 and fp32-scale formats).

  `scale_bits` is per group (keepdims): it is split once per group, then every element is
  multiplied exactly and cheaply (`fp32_bits.mul_by_scale`).
  """
  significand, exp = fb.scale_parts(scale_bits)
  significand_bits, exp = materialize((fb.to_bits(significand), exp), opaque_zero)
  v = fb.mul_by_scale(x_bits, fb.from_bits(significand_bits), exp.astype(jnp.int32))
  negative, sig, vexp = fb.split(v)
  grid = fb.Grid.for_element(element)
  mag = fb.round_to_grid(sig, vexp, grid, rounding, negative=negative, random_bits=random_bits)
  return _with_sign(mag, negative, element)


def _nf4_codes(x_bits, enc_bits):
  """Nearest NF4 level of fl32(x * enc), ties to the even index (magnitudes compared as bits)."""
  v = fb.mul(x_bits, enc_bits)
  negative = (v >> 31) != 0
  grid = formats.NF4_GRID
  mids = ((grid[:-1] + grid[1:]) / np.float32(2)).astype(np.float32)
  # Compare v with each midpoint exactly through an order-preserving map of the float bits.
  key = jnp.where(negative, ~v, v | U32(0x80000000))
  code = jnp.zeros(v.shape, U32)
  for i, mid in enumerate(mids):
    mid_bits = int(np.float32(mid).view(np.uint32))
    mid_key = (~mid_bits & 0xFFFFFFFF) if mid < 0 or (mid == 0 and np.signbit(mid)) else mid_bits | 0x80000000
    code = code + ((key > U32(mid_key)) | ((key == U32(mid_key)) & (i % 2 == 1))).astype(U32)
  return code


def _encode_uint4(x, reduce_axes, rounding, random_bits):
  """Asymmetric uint4 (min/max). Float arithmetic: subnormal inputs may flush on XLA:CPU."""
  xf = fb.from_bits(x)
  # Exact min / max through an order-preserving map of the bits (float compares flush subnormals).
  order = jnp.where((x >> 31) != 0, ~x, x | U32(0x80000000))
  unorder = lambda k: jnp.where((k >> 31) != 0, k & U32(0x7FFFFFFF), ~k)
  lo = fb.from_bits(unorder(jnp.min(order, axis=reduce_axes, keepdims=True)))
  hi = fb.from_bits(unorder(jnp.max(order, axis=reduce_axes, keepdims=True)))
  # A group spanning more than FLT_MAX (hi - lo overflows) is computed at half scale: halving is
  # exact for these magnitudes (|lo|, |hi| > 1e31), so the codes are those of unbounded float32.
  half = jnp.isinf(hi - lo) & ~jnp.isnan(hi - lo)
  h = jnp.where(half, jnp.float32(0.5), jnp.float32(1.0))
  span = hi * h - lo * h
  enc = jnp.where(span > 0, jnp.float32(15.0) / span, jnp.float32(1.0))
  v = fb.to_bits((xf * h - lo * h) * enc)
  negative, sig, exp = fb.split(v)
  grid = fb.Grid.for_element(formats.ELEMENT_FORMATS["uint4"])
  codes = fb.round_to_grid(sig, exp, grid, rounding, negative=negative, random_bits=random_bits)
  scale = (jnp.float32(1.0) / enc) * jnp.where(half, jnp.float32(2.0), jnp.float32(1.0))
  return codes, fb.to_bits(scale), lo


_LANES = 8  # uint32 words in a 256-bit vector register


def group_amax(x_bits, reduce_axes):
  """max |x| bits over `reduce_axes` (keepdims) of uint32 float32 bits, vectorized on XLA:CPU.

  XLA:CPU vectorizes a reduction across its outputs, so a reduction over a minor axis of 32 (16)
  loads one word at a time, eight groups to a vector (~1.4 instructions per element, mostly
  shuffles). When the minor axis alone is reduced (1-D blocks along the last axis), the group's
  8-word runs are combined first with whole-vector maxima, then the 8 lanes of the result, in one
  loop: ~5 instructions per 8 elements. `p | (p >> 31)` leaves p unchanged (abs bits are below
  2**31) and keeps XLA from merging the two reductions back into one. A max in another order: the
  same bits. (Tiles keep the plain reduction: slicing their rows made XLA copy x.)
  """
  abs_bits = x_bits & U32(fb.ABS_MASK)
  n = x_bits.ndim
  axes = {a % n for a in reduce_axes}
  minor = x_bits.shape[-1] if n else 0
  if axes != {n - 1} or n < 2 or minor % _LANES or minor == _LANES:
    return jnp.max(abs_bits, axis=reduce_axes, keepdims=True)
  runs = abs_bits.reshape(abs_bits.shape[:-1] + (minor // _LANES, _LANES))
  lanes = jnp.max(runs, axis=n - 1, keepdims=True)
  return jnp.max(lanes | (lanes >> 31), axis=-1)


def _finite_tensor_amax(x_bits, block_amax):
  """max |x| over the finite values: the max of the block amaxes, unless some block holds a NaN or
  Inf; only then is x read again (a full reduction that skips non-finite values)."""
  # The operand is x as float32 (the bitcasts cancel): a uint32 operand would be a full-size copy.
  # The max of the block amaxes is taken once: the condition and the usual result.
  block_max = jnp.max(block_amax)
  return jax.lax.cond(
      block_max >= U32(fb.INF_BITS),
      lambda x, _: sc.finite_tensor_amax_bits(fb.to_bits(x) & U32(fb.ABS_MASK)),
      lambda _, m: m, fb.from_bits(x_bits), block_max)


def encode(x_bits, fmt, reduce_axes, *, rounding, scale_mode, random_bits=None,
           tensor_amax_bits=None, fast_path=False, want_values=False) -> Encoded:
  """Quantizes grouped float32 bits `x_bits` per docs/numerics.md §4-6 and docs/quant.md.

  fast_path: run the per-element work in float32 (`fast_elements`; same bits, the caller checks
  `fast_elements.use_fast_path`). want_values: also return the dequantized values (fast path only).
  """
  element = fmt.element
  want_values = want_values and fast.decodes(fmt)
  abs_bits = x_bits & U32(fb.ABS_MASK)
  amax = group_amax(x_bits, reduce_axes)
  opaque_zero = _opaque_zero(amax)  # 0 at run time: abs bits are < 2**31
  if not (fast_path and fmt.scale == "e8m0"):  # there, the scale byte is materialized instead
    (amax,) = materialize((amax,), opaque_zero)
  bad = amax >= U32(fb.INF_BITS)  # NaN or Inf in the group: the whole group is NaN
  negative = (x_bits >> 31) != 0
  result = Encoded(codes=None, scales=None, amax_bits=amax)

  if fmt.scale == "e8m0":
    if fmt.fixed_scale_exponent is None:
      if fast_path and scale_mode == "rceil":  # same k from two thresholds (scales_fast)
        k = fast_scales.rceil_exponent(amax, element)
      else:
        k = sc.e8m0_exponent(amax, element, scale_mode)
      if not fast_path:  # the fast path materializes the scale byte below
        (k,) = materialize((k,), opaque_zero)
    else:  # a fixed power-of-two scale: the amax only flags NaN / Inf (QuantFormat)
      k = jnp.full(amax.shape, fmt.fixed_scale_exponent, jnp.int32)
    k = k.astype(jnp.int32)
    if fast_path:
      (byte,) = materialize((jnp.where(bad, U32(sc.E8M0_NAN), (k + 127).astype(U32)),),
                            opaque_zero)
      codes, result.values = _fast_elements(
          x_bits, abs_bits, ft.look_up(ft.e8m0_rows(), byte), element, rounding, random_bits,
          want_values, power_of_two=True)
    else:
      _, sig, exp = fb.split(x_bits)
      mag = fb.round_to_grid(sig, exp - k, fb.Grid.for_element(element), rounding,
                             negative=negative, random_bits=random_bits)
      codes = _with_sign(mag, negative, element)
      byte = jnp.where(bad, U32(sc.E8M0_NAN), (k + 127).astype(U32))
    result.scales = byte
  elif fmt.scale == "ue4m3":
    tensor_bad = False
    if fmt.tensor_scale and tensor_amax_bits is None:
      tensor_amax_bits = _finite_tensor_amax(x_bits, amax)
    elif fmt.tensor_scale:  # a given amax_t of NaN / Inf: every block is NaN (docs/numerics.md §5)
      tensor_bad = tensor_amax_bits >= U32(fb.INF_BITS)
      bad = bad | tensor_bad
    if fast_path:
      s_enc = fast_scales.encode_scale(tensor_amax_bits, fmt.tensor_scale)

      def scale_bytes():  # from amax alone, so that the conditional's operands are no larger
        group_bad = (amax >= U32(fb.INF_BITS)) | tensor_bad
        s_b = fast_scales.block_scale_bytes(amax, s_enc, tensor_amax_bits)
        return jnp.where(group_bad, U32(sc.UE4M3_NAN), s_b)

      rows, byte = ft.ue4m3_rows(s_enc, tensor_amax_bits, fmt.tensor_scale, scale_bytes)
      if not fmt.tensor_scale:
        (byte,) = materialize((byte,), opaque_zero)
      codes, result.values = _fast_elements(x_bits, abs_bits, ft.look_up(rows, byte), element,
                                            rounding, random_bits, want_values)
    else:
      s_enc = sc.nvfp4_encode_scale(tensor_amax_bits, fmt.tensor_scale)
      s_b, s_enc_b = materialize(sc.nvfp4_block_scales(amax, s_enc), opaque_zero)
      codes = _scaled_codes(x_bits, s_enc_b, element, rounding, random_bits, opaque_zero)
      byte = jnp.where(bad, U32(sc.UE4M3_NAN), s_b)
    result.scales = byte
    result.tensor_amax_bits = tensor_amax_bits if fmt.tensor_scale else None
  elif element.kind == "uint":
    codes, scale_bits, lo = _encode_uint4(x_bits, reduce_axes, rounding, random_bits)
    bad = bad | jnp.isnan(lo)
    result.scales = jnp.where(bad, U32(sc.F32_NAN_BITS), scale_bits)
    result.zeros = jnp.where(bad, jnp.float32(jnp.nan), lo)
  else:  # fp32 scales: fp8 per tensor, int per channel / group, nf4
    (enc,) = materialize((sc.fp32_encode_scale(amax, element.max_value),), opaque_zero)
    scale = fb.recip(enc)
    if element.kind == "lut":
      codes = _nf4_codes(x_bits, enc)
    elif fast_path:
      rows = _group_rows(enc, scale, bad, opaque_zero)
      codes, result.values = _fast_elements(x_bits, abs_bits, rows, element, rounding,
                                            random_bits, want_values)
    else:
      codes = _scaled_codes(x_bits, enc, element, rounding, random_bits, opaque_zero)
    result.scales = jnp.where(bad, U32(sc.F32_NAN_BITS), scale)
  result.codes = codes if fast_path else jnp.where(bad, U32(0), codes)  # fast: already masked
  return result


def _fast_decode(codes, m_bits, element, opaque_zero, power_of_two=False):
  """fl32(value(code) * M) bits with the fast path's multiply (`fast_elements.apply_multiplier`)."""
  value_bits = sc.decode_bits(codes, element.name)
  (m_bits,) = materialize((m_bits,), opaque_zero)
  m_c, shift = fast.decode_factors(m_bits)
  out = fast.apply_multiplier(fb.from_bits(value_bits & U32(fb.ABS_MASK)), m_c, shift,
                              power_of_two=power_of_two, wide=fast.is_wide(element))
  out = out | (value_bits & U32(fb.SIGN_MASK))
  return out if power_of_two else fast.canonical_nan(out)


def decode(codes, scales, fmt, *, tensor_amax_bits=None, zeros=None, fast_path=False):
  """Exact float32 bits of the dequantized grouped values (`scales` keepdims, as from encode).

  fast_path: multiply in float32 (`fast_elements`, same bits) for float elements.
  """
  element = fmt.element
  fast_path = fast_path and fast.decodes(fmt)
  if element.kind == "uint":
    # fl32(code * scale) exactly (bit arithmetic, so XLA cannot contract it into an FMA with the
    # add), then + lo in float32 (which flushes a subnormal lo on XLA:CPU; see docs/quant.md).
    product = fb.mul_small(codes.astype(U32), jnp.zeros(codes.shape, jnp.int32),
                           jnp.zeros(codes.shape, bool), scales)
    plain = fb.from_bits(product) + zeros
    # Where that overflows (a group spanning more than FLT_MAX): at half scale, then doubled and
    # saturated; the same value as unbounded float32 arithmetic, clamped to +-FLT_MAX.
    half = fb.mul_small(codes.astype(U32), jnp.zeros(codes.shape, jnp.int32),
                        jnp.zeros(codes.shape, bool), fb.to_bits(fb.from_bits(scales) * 0.5))
    flt_max = jnp.float32(np.finfo(np.float32).max)
    halved = jnp.clip((fb.from_bits(half) + zeros * jnp.float32(0.5)) * jnp.float32(2.0),
                      -flt_max, flt_max)
    return fb.to_bits(jnp.where(jnp.isinf(plain), halved, plain))
  if fmt.scale == "e8m0":
    bad = scales == sc.E8M0_NAN
    if fast_path:
      m_bits = fast.pow2_bits(jnp.minimum(scales.astype(jnp.int32), 254) - 127)
      out = _fast_decode(codes, m_bits, element, _opaque_zero(scales), power_of_two=True)
    else:
      negative, sig, exp = sc.decode_sig_exp(codes, element.name)
      out = fb.pack_fp32(negative, sig, exp + scales.astype(jnp.int32) - 127)
  else:
    if fmt.scale == "ue4m3":
      if fast_path:
        multiplier = fast_scales.decode_multiplier(scales, tensor_amax_bits, fmt.tensor_scale)
      else:
        multiplier = sc.nvfp4_decode_scale(scales, tensor_amax_bits, fmt.tensor_scale)
      bad = scales == sc.UE4M3_NAN
      (multiplier,) = materialize((multiplier,), _opaque_zero(scales))
    else:
      multiplier = scales
      bad = (scales & U32(fb.ABS_MASK)) > U32(fb.INF_BITS)
    if fast_path:
      out = _fast_decode(codes, jnp.where(bad, U32(0), multiplier), element,
                         _opaque_zero(scales))
    elif element.kind == "lut":
      out = fb.mul(sc.decode_bits(codes, element.name), multiplier)
    else:
      negative, sig, exp = sc.decode_sig_exp(codes, element.name)
      out = fb.mul_small(sig, exp, negative, multiplier)
  if fast_path:  # per-group masks, not a per-element select (see _fast_elements)
    keep, nan = materialize(_bad_group_masks(bad), _opaque_zero(scales))
    return (out & keep) | nan
  return jnp.where(bad, U32(sc.F32_NAN_BITS), out)
