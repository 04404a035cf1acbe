"""Element formats and rounding of the numpy oracle (docs/numerics.md sections 1-4 and 6).

Part of `numpy_oracle` (which re-exports every name here): the element grids (fp4/fp6/fp8,
integers, NF4), their code tables, e8m0 values, and rounding of exact float64 values onto a grid
with every rounding mode, stochastic rounding from given uint32 bits included. Written from the
contract alone; imports nothing of lpjax.
"""

from __future__ import annotations

import dataclasses

import numpy as np

F32 = np.float32
FLT_MAX = np.float32(np.finfo(np.float32).max)
TWO32 = 1 << 32

ROUNDINGS = ("nearest_even", "nearest_away", "toward_zero", "toward_positive",
             "toward_negative", "stochastic")
SCALE_MODES = ("floor", "ceil", "even", "rceil")

# bitsandbytes NF4 grid (csrc/kernels.cu), rounded to float32.
NF4_GRID = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=np.float32)


# --------------------------------------------------------------------------------------------
# Element formats
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FloatElem:
  name: str
  ebits: int
  mbits: int
  bias: int
  max: float
  kind: str = "float"

  @property
  def bits(self):
    return 1 + self.ebits + self.mbits

  @property
  def emin(self):  # exponent of the minimum normal binade
    return 1 - self.bias

  @property
  def emax(self):  # exponent of the largest normal binade (the OCP "emax_elem")
    return int(np.floor(np.log2(self.max)))


@dataclasses.dataclass(frozen=True)
class IntElem:
  name: str
  bits: int
  max: int       # symmetric saturation bound (int) or top code (uint)
  kind: str      # "int", "uint" or "nf4"


ELEMENTS = {
    "e2m1": FloatElem("e2m1", 2, 1, 1, 6.0),
    "e2m3": FloatElem("e2m3", 2, 3, 1, 7.5),
    "e3m2": FloatElem("e3m2", 3, 2, 3, 28.0),
    "e4m3": FloatElem("e4m3", 4, 3, 7, 448.0),
    "e5m2": FloatElem("e5m2", 5, 2, 15, 57344.0),
    "int8": IntElem("int8", 8, 127, "int"),
    "int4": IntElem("int4", 4, 7, "int"),
    "uint4": IntElem("uint4", 4, 15, "uint"),
    "nf4": IntElem("nf4", 4, 1, "nf4"),
}

# max_elem used by fp32 scales (docs/quant.md "fp32 scales").
FP32_SCALE_MAX = {"e4m3": 448.0, "e5m2": 57344.0, "int8": 127.0, "int4": 7.0, "nf4": 1.0}


def float_value(elem: FloatElem, code):
  """Exact float64 value of float-element codes (NaN / Inf per ml_dtypes' fn / IEEE flavours)."""
  code = np.asarray(code, dtype=np.int64)
  sign = (code >> (elem.ebits + elem.mbits)) & 1
  expf = (code >> elem.mbits) & ((1 << elem.ebits) - 1)
  mant = code & ((1 << elem.mbits) - 1)
  sub = np.ldexp(mant.astype(np.float64), elem.emin - elem.mbits)
  nrm = np.ldexp((mant + (1 << elem.mbits)).astype(np.float64), expf - elem.bias - elem.mbits)
  mag = np.where(expf == 0, sub, nrm)
  top = (1 << elem.ebits) - 1
  if elem.name == "e4m3":  # fn: only S.1111.111 is NaN, no Inf
    mag = np.where((expf == top) & (mant == (1 << elem.mbits) - 1), np.nan, mag)
  elif elem.name == "e5m2":  # IEEE-like
    mag = np.where(expf == top, np.where(mant == 0, np.inf, np.nan), mag)
  return np.where(sign == 1, -mag, mag)


def decode_table(name: str) -> np.ndarray:
  """Value of every code of an element format, float32, length 2^bits."""
  e = ELEMENTS[name]
  codes = np.arange(1 << e.bits)
  if e.kind == "float":
    return float_value(e, codes).astype(np.float32)
  if e.kind == "int":
    return np.where(codes >= (1 << (e.bits - 1)), codes - (1 << e.bits), codes).astype(np.float32)
  if e.kind == "uint":
    return codes.astype(np.float32)
  return NF4_GRID.copy()


def e8m0_value(byte):
  """float64 value of e8m0 scale bytes (0xFF = NaN)."""
  b = np.asarray(byte, dtype=np.int64)
  return np.where(b == 255, np.nan, np.ldexp(1.0, b - 127))


# --------------------------------------------------------------------------------------------
# Rounding
# --------------------------------------------------------------------------------------------

def round_units(m, rounding, negative, rbits=None):
  """Round m >= 0 (float64, exact, in units of the last place) to an integer (float64).

  negative: sign of the value being rounded (for the directed modes).
  rbits: uint32 random bits (stochastic only).
  """
  m = np.asarray(m, dtype=np.float64)
  fl = np.floor(m)
  frac = m - fl                      # exact
  if rounding == "nearest_even":
    up = (frac > 0.5) | ((frac == 0.5) & (np.fmod(fl, 2.0) == 1.0))
  elif rounding == "nearest_away":
    up = frac >= 0.5
  elif rounding == "toward_zero":
    up = np.zeros(m.shape, dtype=bool)
  elif rounding == "toward_positive":
    up = (frac > 0) & ~negative
  elif rounding == "toward_negative":
    up = (frac > 0) & negative
  elif rounding == "stochastic":
    if rbits is None:
      raise ValueError("stochastic rounding needs rbits")
    big_f = np.floor(frac * 2.0 ** 32).astype(np.int64)   # first 32 bits of the fraction, exact
    r = np.asarray(rbits, dtype=np.uint32).astype(np.int64)
    up = (big_f > 0) & (r >= TWO32 - big_f)
  else:
    raise ValueError(f"unknown rounding {rounding!r}")
  return fl + up


def round_float_elem(elem: FloatElem, v, rounding, rbits=None, negative=None):
  """Round float64 values v (exact; may be +-inf) to elem with saturation.

  Returns (magnitude float64 in [0, max], sign bool). The sign is v's sign bit unless `negative`
  is given.
  """
  v = np.asarray(v, dtype=np.float64)
  neg = np.signbit(v) if negative is None else np.asarray(negative, dtype=bool)
  a = np.abs(v)
  a = np.where(np.isnan(a), 0.0, a)
  a = np.minimum(a, 4.0 * elem.max)   # anything >= 2*max saturates anyway; keeps m finite
  _, ex = np.frexp(a)                 # a = f * 2^ex, f in [0.5, 1)
  binade = np.maximum(np.where(a > 0, ex - 1, elem.emin), elem.emin)
  ulp_exp = binade - elem.mbits
  m = np.ldexp(a, -ulp_exp)
  n = round_units(m, rounding, neg, rbits)
  q = np.minimum(np.ldexp(n, ulp_exp), elem.max)
  return q, neg


def encode_float_elem(elem: FloatElem, mag, neg):
  """Code bits of representable magnitudes mag (float64) with sign neg."""
  mag = np.asarray(mag, dtype=np.float64)
  _, ex = np.frexp(mag)
  e = ex - 1
  normal = mag >= 2.0 ** elem.emin
  sub_mant = np.ldexp(mag, elem.mbits - elem.emin)
  nrm_mant = np.ldexp(mag, elem.mbits - np.where(normal, e, 0)) - (1 << elem.mbits)
  expf = np.where(normal, e + elem.bias, 0)
  mant = np.where(normal, nrm_mant, sub_mant)
  assert np.all(mant == np.round(mant)), "magnitude not representable"
  code = ((neg.astype(np.int64) << (elem.ebits + elem.mbits))
          | (expf.astype(np.int64) << elem.mbits) | mant.astype(np.int64))
  return code.astype(np.uint8)


def round_int(elem: IntElem, v, rounding, rbits=None):
  """Round float64 v to int/uint codes with saturation. Returns (integer value, code uint8)."""
  v = np.asarray(v, dtype=np.float64)
  neg = np.signbit(v)
  a = np.minimum(np.abs(v), 4.0 * elem.max)
  a = np.where(np.isnan(a), 0.0, a)
  n = round_units(a, rounding, neg, rbits)
  if elem.kind == "uint":
    val = np.clip(np.where(neg, -n, n), 0, elem.max)
    return val, val.astype(np.int64).astype(np.uint8)
  n = np.minimum(n, elem.max)
  val = np.where(neg, -n, n) + 0.0        # -0 -> code 0
  code = np.mod(val.astype(np.int64), 1 << elem.bits).astype(np.uint8)
  return val, code


def round_nf4(v):
  """Nearest NF4 grid index (ties to the even index; ties never occur in the tests)."""
  v = np.asarray(v, dtype=np.float64)
  g = NF4_GRID.astype(np.float64)
  d = np.abs(v[..., None] - g)
  best = d.min(axis=-1, keepdims=True)
  cand = d == best
  idx = np.argmax(cand, axis=-1)
  two = cand.sum(axis=-1) > 1
  idx = np.where(two & (idx % 2 == 1), idx + 1, idx)
  return idx.astype(np.uint8)


def e4m3_rne_sat(t):
  """ue4m3 (NVFP4 block scale) of non-negative float32 t: RNE, saturating at 448.

  Returns (value float32, byte uint8)."""
  e = ELEMENTS["e4m3"]
  t = np.asarray(t, dtype=np.float64)
  mag, neg = round_float_elem(e, t, "nearest_even")
  code = encode_float_elem(e, mag, np.zeros(mag.shape, dtype=bool))
  return mag.astype(np.float32), code
