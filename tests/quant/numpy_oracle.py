"""Independent numpy re-derivation of `lpjax.quant` (docs/numerics.md sections 1-6, docs/quant.md).

This is the test oracle. It is written from the contract alone and must not import lpjax.

Arithmetic strategy:
- MX (e8m0) formats: everything is exact. x / 2^k and the element grid live comfortably inside
  float64, so rounding is done on exact float64 values (m = |v| / ulp is exact, frac(m) too).
- NVFP4, fp32-scale and uint4 formats: the contract defines these as IEEE fp32 formulas. numpy
  float32 arithmetic on the host CPU is IEEE with gradual underflow (no flush to zero), so the
  formulas are written literally with np.float32 operands. Only the final rounding of the fp32
  value v onto the element grid is done in (exact) float64.
- Stochastic rounding takes the uint32 random bits (one per element of x, x's shape) as input.

The element formats and rounding primitives are in `numpy_oracle_elements`, the bit-exact
comparisons and the test data in `numpy_oracle_checks` (both re-exported here); this module holds
the block formats and quantize / dequantize.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from numpy_oracle_elements import *  # noqa: E402,F401,F403  (re-exported: tests use O.<name>)
from numpy_oracle_checks import *  # noqa: E402,F401,F403  (re-exported as well)


# --------------------------------------------------------------------------------------------
# Formats
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Fmt:
  element: str
  scale: str          # "e8m0", "ue4m3", "fp32"
  block_size: int = 0
  granularity: str = "block"   # "block", "channel", "tensor"
  tile: bool = False
  tensor_scale: bool = False


PRESETS = {
    "mxfp4": Fmt("e2m1", "e8m0", 32),
    "mxfp6_e2m3": Fmt("e2m3", "e8m0", 32),
    "mxfp6_e3m2": Fmt("e3m2", "e8m0", 32),
    "mxfp8_e4m3": Fmt("e4m3", "e8m0", 32),
    "mxfp8_e5m2": Fmt("e5m2", "e8m0", 32),
    "nvfp4": Fmt("e2m1", "ue4m3", 16, tensor_scale=True),
    "nvfp4_16x16": Fmt("e2m1", "ue4m3", 16, tile=True, tensor_scale=True),
    "fp8_e4m3": Fmt("e4m3", "fp32", 0, "tensor"),
    "fp8_e5m2": Fmt("e5m2", "fp32", 0, "tensor"),
    "int8_channel": Fmt("int8", "fp32", 0, "channel"),
    "int4_channel": Fmt("int4", "fp32", 0, "channel"),
    "int8_g128": Fmt("int8", "fp32", 128),
    "int4_g128": Fmt("int4", "fp32", 128),
    "uint4_g128": Fmt("uint4", "fp32", 128),
    "nf4": Fmt("nf4", "fp32", 64),
}


def get_fmt(fmt) -> Fmt:
  return PRESETS[fmt] if isinstance(fmt, str) else fmt


def elem_bits(fmt) -> int:
  return ELEMENTS[get_fmt(fmt).element].bits


# --------------------------------------------------------------------------------------------
# Blocking helpers (work on the blocked axis moved last)
# --------------------------------------------------------------------------------------------

def _pad_last(a, mult, value=0):
  n = a.shape[-1]
  p = (-n) % mult
  if p:
    a = np.concatenate([a, np.full(a.shape[:-1] + (p,), value, dtype=a.dtype)], axis=-1)
  return a


def _abs_bits(x32):
  return x32.view(np.uint32) & np.uint32(0x7FFFFFFF)


def _group_stats(xb):
  """xb: (..., nb, B) float32. Returns amax (float32, exact incl. subnormals), nonfinite flag."""
  ab = _abs_bits(xb)
  nonfinite = np.any(ab >= np.uint32(0x7F800000), axis=-1)
  amax_bits = np.where(ab >= np.uint32(0x7F800000), np.uint32(0), ab).max(axis=-1)
  return amax_bits.view(np.float32), amax_bits, nonfinite


def pack_fp4(codes, axis=-1):
  """Two 4-bit codes per byte along axis: element 2i low nibble, 2i+1 high nibble."""
  c = np.moveaxis(np.asarray(codes, dtype=np.uint8), axis, -1)
  c = _pad_last(c, 2)
  packed = (c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)
  return np.moveaxis(packed.astype(np.uint8), -1, axis)


def unpack_fp4(packed, n, axis=-1):
  p = np.moveaxis(np.asarray(packed, dtype=np.uint8), axis, -1)
  out = np.stack([p & 0xF, p >> 4], axis=-1).reshape(p.shape[:-1] + (2 * p.shape[-1],))[..., :n]
  return np.moveaxis(out.astype(np.uint8), -1, axis)


# --------------------------------------------------------------------------------------------
# e8m0 scale
# --------------------------------------------------------------------------------------------

def _ceil_log2(a64):
  """ceil(log2 a) for a > 0 (float64 exact); -inf-ish (-100000) for a == 0."""
  f, ex = np.frexp(a64)
  r = np.where(f == 0.5, ex - 1, ex)
  return np.where(a64 > 0, r, -100000)


def e8m0_exponent(amax32, elem: FloatElem, scale_mode):
  """Unclamped... then clamped block exponent k (int64) for float32 block amax values."""
  amax32 = np.asarray(amax32, dtype=np.float32)
  bits = amax32.view(np.uint32).astype(np.int64)
  if scale_mode == "floor":
    k = (bits >> 23) - 127 - elem.emax
  elif scale_mode == "ceil":
    k = _ceil_log2(amax32.astype(np.float64)) - elem.emax
  elif scale_mode == "even":
    rb = (bits + (1 << (22 - elem.mbits))) & 0x7F800000
    k = (rb >> 23) - 127 - elem.emax
  elif scale_mode == "rceil":
    with np.errstate(all="ignore"):
      p = amax32 * (F32(1) / F32(elem.max))          # IEEE fp32 product, gradual underflow
    k = _ceil_log2(p.astype(np.float64))
  else:
    raise ValueError(f"unknown scale_mode {scale_mode!r}")
  return np.clip(k, -127, 127)


# --------------------------------------------------------------------------------------------
# quantize
# --------------------------------------------------------------------------------------------

def quantize(x, fmt, axis=-1, rounding="nearest_even", scale_mode=None, rbits=None,
             tensor_amax=None):
  """Oracle quantize. x: float array (bf16/fp16/fp32/fp64; rounded/upcast to float32).

  Returns a dict: codes (packed like QArray.codes), codes_unpacked (one code per element, x's
  shape), scales, tensor_scale, zeros, values (dequantized float32, x's shape).
  """
  f = get_fmt(fmt)
  x32 = np.asarray(x).astype(np.float32)
  if rounding == "stochastic":
    rbits = np.asarray(rbits, dtype=np.uint32)
    assert rbits.shape == x32.shape
  else:
    rbits = np.zeros(x32.shape, dtype=np.uint32)
  ndim = x32.ndim
  elem = ELEMENTS[f.element]

  if f.tile:
    return _quantize_tile(x32, f, rounding, rbits, tensor_amax)
  if f.granularity == "tensor":
    ax = ndim - 1 if ndim else 0
    flat = x32.reshape(1, -1)
    res = _quantize_rows(flat, f, elem, flat.shape[-1], rounding, scale_mode,
                         rbits.reshape(1, -1), tensor_amax)
    out = {k: (v.reshape(()) if k in ("scales", "zeros") and v is not None else v)
           for k, v in res.items()}
    out["codes_unpacked"] = res["codes_unpacked"].reshape(x32.shape)
    out["values"] = res["values"].reshape(x32.shape)
    out["codes"] = (pack_fp4(out["codes_unpacked"], axis=-1) if elem.bits == 4
                    else out["codes_unpacked"])
    return out

  ax = axis % ndim
  xm = np.moveaxis(x32, ax, -1)
  rm = np.moveaxis(rbits, ax, -1)
  n = xm.shape[-1]
  bsz = n if f.granularity == "channel" else f.block_size
  res = _quantize_rows(xm, f, elem, bsz, rounding, scale_mode, rm, tensor_amax)
  out = {}
  for k, v in res.items():
    out[k] = np.moveaxis(v, -1, ax) if (v is not None and np.ndim(v) == ndim) else v
  out["codes"] = (pack_fp4(out["codes_unpacked"], axis=ax) if elem.bits == 4
                  else out["codes_unpacked"])
  return out


def _quantize_rows(xm, f, elem, bsz, rounding, scale_mode, rm, tensor_amax):
  """Blocks of bsz along the last axis of xm (already float32, blocked axis last)."""
  n = xm.shape[-1]
  xp = _pad_last(xm, bsz)
  rp = _pad_last(rm, bsz)
  nb = xp.shape[-1] // bsz
  xb = xp.reshape(xp.shape[:-1] + (nb, bsz))
  rb = rp.reshape(xb.shape)
  if f.scale == "e8m0":
    codes, scales, vals = _mx_blocks(xb, elem, rounding, scale_mode or "floor", rb)
    tscale, zeros = None, None
  elif f.scale == "ue4m3":
    amax_t = _tensor_amax(xm, f, tensor_amax)
    codes, scales, vals = _nv_blocks(xb, elem, rounding, rb, amax_t, f.tensor_scale)
    tscale, zeros = (np.float32(amax_t) if f.tensor_scale else None), None
  elif elem.kind == "uint":
    codes, scales, zeros, vals = _uint_blocks(xb, elem, rounding, rb)
    tscale = None
  else:
    codes, scales, vals = _fp32_blocks(xb, elem, rounding, rb)
    tscale, zeros = None, None
  codes = codes.reshape(xp.shape)[..., :n]
  vals = vals.reshape(xp.shape)[..., :n]
  return {"codes_unpacked": codes, "scales": scales, "tensor_scale": tscale, "zeros": zeros,
          "values": vals}


def _mx_blocks(xb, elem, rounding, scale_mode, rb):
  amax, _, nonfinite = _group_stats(xb)
  k = e8m0_exponent(amax, elem, scale_mode)
  scale_byte = np.where(nonfinite, 255, k + 127).astype(np.uint8)
  x64 = xb.astype(np.float64)
  v = np.ldexp(x64, -k[..., None])            # exact
  if elem.kind != "float":
    raise ValueError("e8m0 scales need a float element")
  mag, neg = round_float_elem(elem, v, rounding, rb)
  codes = encode_float_elem(elem, mag, neg)
  codes = np.where(nonfinite[..., None], np.uint8(0), codes)
  val = np.where(neg, -mag, mag) * np.ldexp(1.0, k)[..., None]
  with np.errstate(all="ignore"):
    val32 = val.astype(np.float32)
  val32 = np.where(nonfinite[..., None], np.float32(np.nan), val32)
  return codes, scale_byte, val32


def _tensor_amax(xm, f, tensor_amax):
  if not f.tensor_scale:
    return F32(448.0 * 6.0)
  if tensor_amax is not None:
    return F32(tensor_amax)
  a = np.abs(xm.astype(np.float32))
  a = a[np.isfinite(a)]
  return F32(a.max()) if a.size else F32(0)


def _nv_scale(block_amax, amax_t):
  """§5: block ue4m3 (value, byte) and the fp32 encode multiplier S_enc_b."""
  with np.errstate(all="ignore"):
    amax_t = F32(amax_t)
    s_enc = F32(1) if amax_t == 0 else np.minimum(F32(2688) / amax_t, FLT_MAX)
    s_enc = F32(s_enc)
    t = block_amax.astype(np.float32) * F32(s_enc * (F32(1) / F32(6)))
    s_b, s_byte = e4m3_rne_sat(t)
    denom = s_b * (F32(1) / s_enc)
    s_enc_b = np.minimum(F32(1) / denom, FLT_MAX).astype(np.float32)
  return s_b, s_byte, s_enc_b


def _nv_decode_mult(s_b, amax_t, tensor_scale):
  with np.errstate(all="ignore"):
    amax_t = F32(amax_t)
    if amax_t == 0:
      return s_b.astype(np.float32)
    # amax_t >= 2**64: (s_b * amax_t) is formed at amax_t * 2**-64 and scaled back after the
    # multiply by fl32(1/2688): the same bits wherever fl32(s_b * amax_t) is finite, and finite
    # where it would overflow.
    k = F32(2.0**64) if amax_t >= F32(2.0**64) else F32(1)
    return ((((s_b.astype(np.float32) * (amax_t / k)).astype(np.float32)
              * (F32(1) / F32(2688))).astype(np.float32)) * k).astype(np.float32)


def _nv_blocks(xb, elem, rounding, rb, amax_t, tensor_scale):
  amax, _, nonfinite = _group_stats(xb)
  s_b, s_byte, s_enc_b = _nv_scale(amax, amax_t)
  with np.errstate(all="ignore"):
    v = (xb * s_enc_b[..., None]).astype(np.float32)      # fp32 product, may be +-inf
  mag, neg = round_float_elem(elem, v.astype(np.float64), rounding, rb,
                              negative=np.signbit(xb))
  codes = encode_float_elem(elem, mag, neg)
  codes = np.where(nonfinite[..., None], np.uint8(0), codes)
  mult = _nv_decode_mult(s_b, amax_t, tensor_scale)
  ev = np.where(neg, -mag, mag).astype(np.float32)
  with np.errstate(all="ignore"):
    val = (ev * mult[..., None]).astype(np.float32)
  val = np.where(nonfinite[..., None], np.float32(np.nan), val)
  s_byte = np.where(nonfinite, np.uint8(0x7F), s_byte).astype(np.uint8)
  return codes, s_byte, val


def _fp32_blocks(xb, elem, rounding, rb):
  amax, _, nonfinite = _group_stats(xb)
  max_elem = F32(FP32_SCALE_MAX[elem.name])
  with np.errstate(all="ignore"):
    enc = np.where(amax == 0, F32(1), np.minimum(max_elem / amax, FLT_MAX)).astype(np.float32)
    v = (xb * enc[..., None]).astype(np.float32)
    scale = (F32(1) / enc).astype(np.float32)
  v64 = v.astype(np.float64)
  if elem.kind == "float":
    mag, neg = round_float_elem(elem, v64, rounding, rb, negative=np.signbit(xb))
    codes = encode_float_elem(elem, mag, neg)
    ev = np.where(neg, -mag, mag).astype(np.float32)
  elif elem.kind == "int":
    ev, codes = round_int(elem, v64, rounding, rb)
    ev = ev.astype(np.float32)
  else:  # nf4
    if rounding != "nearest_even":
      raise ValueError("nf4 supports nearest_even only")
    codes = round_nf4(v64)
    ev = NF4_GRID[codes]
  codes = np.where(nonfinite[..., None], np.uint8(0), codes).astype(np.uint8)
  with np.errstate(all="ignore"):
    val = (ev * scale[..., None]).astype(np.float32)
  val = np.where(nonfinite[..., None], np.float32(np.nan), val)
  scale = np.where(nonfinite, np.float32(np.nan), scale).astype(np.float32)
  return codes, scale, val


def _uint_blocks(xb, elem, rounding, rb):
  ab = _abs_bits(xb)
  nonfinite = np.any(ab >= np.uint32(0x7F800000), axis=-1)
  with np.errstate(all="ignore"):
    lo = xb.min(axis=-1).astype(np.float32)
    hi = xb.max(axis=-1).astype(np.float32)
    # A span above FLT_MAX: the group at half scale (exact halving), scale doubled back.
    h = np.where(np.isposinf((hi - lo).astype(np.float32)), F32(0.5), F32(1)).astype(np.float32)
    lo_h, hi_h = (lo * h).astype(np.float32), (hi * h).astype(np.float32)
    d = (hi_h - lo_h).astype(np.float32)
    enc = np.where(hi == lo, F32(1), F32(15) / d).astype(np.float32)
    v = (((xb * h[..., None]).astype(np.float32) - lo_h[..., None]).astype(np.float32)
         * enc[..., None]).astype(np.float32)
    scale = ((F32(1) / enc).astype(np.float32) / h).astype(np.float32)
  val_int, codes = round_int(elem, v.astype(np.float64), rounding, rb)
  codes = np.where(nonfinite[..., None], np.uint8(0), codes).astype(np.uint8)
  with np.errstate(all="ignore"):
    val = ((val_int.astype(np.float32) * scale[..., None]).astype(np.float32)
           + lo[..., None]).astype(np.float32)
    # Where that overflows: at half scale, doubled and saturated to +-FLT_MAX.
    halved = ((val_int.astype(np.float32) * (scale * F32(0.5)).astype(np.float32)[..., None])
              .astype(np.float32) + (lo * F32(0.5)).astype(np.float32)[..., None]).astype(np.float32)
    halved = np.clip((halved * F32(2)).astype(np.float32), -FLT_MAX, FLT_MAX).astype(np.float32)
    val = np.where(np.isinf(val), halved, val).astype(np.float32)
  val = np.where(nonfinite[..., None], np.float32(np.nan), val)
  scale = np.where(nonfinite, np.float32(np.nan), scale).astype(np.float32)
  return codes, scale, lo, val


def _quantize_tile(x32, f, rounding, rbits, tensor_amax):
  """16x16 tiles over the last two axes (NVFP4 weights)."""
  elem = ELEMENTS[f.element]
  b = f.block_size
  *lead, m, n = x32.shape
  amax_t = _tensor_amax(x32, f, tensor_amax)
  pm, pn = (-m) % b, (-n) % b
  xp = np.pad(x32, [(0, 0)] * len(lead) + [(0, pm), (0, pn)])
  rp = np.pad(rbits, [(0, 0)] * len(lead) + [(0, pm), (0, pn)])
  mb, nb = xp.shape[-2] // b, xp.shape[-1] // b
  # (..., mb, b, nb, b) -> (..., mb, nb, b*b)
  def tiles(a):
    a = a.reshape(tuple(lead) + (mb, b, nb, b))
    a = np.moveaxis(a, -3, -2)
    return a.reshape(tuple(lead) + (mb, nb, b * b))
  def untile(a):
    a = a.reshape(tuple(lead) + (mb, nb, b, b))
    a = np.moveaxis(a, -2, -3)
    return a.reshape(tuple(lead) + (mb * b, nb * b))[..., :m, :n]
  codes, scales, vals = _nv_blocks(tiles(xp), elem, rounding, tiles(rp), amax_t, f.tensor_scale)
  cu = untile(codes)
  return {"codes_unpacked": cu, "codes": pack_fp4(cu, axis=-1), "scales": scales,
          "tensor_scale": np.float32(amax_t) if f.tensor_scale else None, "zeros": None,
          "values": untile(vals)}


def dequantize_codes(fmt, codes_unpacked, scales, axis=-1, tensor_scale=None, zeros=None):
  """Decode unpacked codes with given block scales (MX e8m0 only; used by constructed tests)."""
  f = get_fmt(fmt)
  assert f.scale == "e8m0"
  elem = ELEMENTS[f.element]
  c = np.moveaxis(np.asarray(codes_unpacked), axis, -1)
  s = np.moveaxis(np.asarray(scales), axis, -1)
  sv = np.repeat(e8m0_value(s), f.block_size, axis=-1)[..., :c.shape[-1]]
  val = float_value(elem, c) * sv
  with np.errstate(all="ignore"):
    return np.moveaxis(val.astype(np.float32), -1, axis)
