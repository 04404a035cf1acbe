"""Exact IEEE float32 arithmetic on bit patterns, so subnormals survive on every backend.

XLA:CPU flushes float32 subnormals to zero in float arithmetic (inputs and results), while integer
ops, bitcasts and selects keep their bits (docs/numerics.md §4). The quantizers therefore represent a
value as ``sig * 2**exp`` (uint32 significand, int32 exponent) and round with integer operations.

The central routine is `round_to_grid`: it rounds a magnitude onto the grid of a minifloat, an
integer format, or float32 itself, in any rounding mode of docs/numerics.md §6.

Examples:
  >>> import jax.numpy as jnp
  >>> a, b = to_bits(jnp.float32(2.0 ** -130)), to_bits(jnp.float32(3.0))
  >>> float(from_bits(mul(a, b))) == 3 * 2.0 ** -130   # a subnormal product, exact
  True
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

U32 = jnp.uint32
I32 = jnp.int32
SIGN_MASK = 0x80000000
ABS_MASK = 0x7FFFFFFF
INF_BITS = 0x7F800000


@dataclasses.dataclass(frozen=True)
class Grid:
  """The grid a magnitude is rounded onto: ``(2**mbits + f) * 2**(e - mbits)`` per binade e >= emin.

  For an integer format the grid is the integers: emin = mbits = 0 would grow the ulp with the
  binade, so integers are modelled as a float with a huge mantissa (ulp 1 everywhere up to 2**31).
  """

  mbits: int  # mantissa bits
  emin: int  # smallest normal binade; below it the ulp stays 2**(emin - mbits) (subnormals)
  sat_exp: int  # a magnitude >= 2**(sat_exp + 1) saturates whatever the rounding
  max_code: int  # magnitude code of the largest value (float32: the Inf pattern)
  is_int: bool = False

  @classmethod
  def for_element(cls, element) -> "Grid":
    if element.kind == "float":
      return cls(element.mbits, element.emin, element.emax, element.max_magnitude_code)
    # int / uint codes are the integers themselves, ulp 1.
    sat_exp = int(element.max_value).bit_length() - 1
    return cls(31, 31, sat_exp, element.max_magnitude_code, is_int=True)


FP32_GRID = Grid(mbits=23, emin=-126, sat_exp=127, max_code=INF_BITS)


def to_bits(x):
  return jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.float32), U32)


def from_bits(bits):
  return jax.lax.bitcast_convert_type(bits.astype(U32), jnp.float32)


def split(bits):
  """float32 bits -> (negative, sig, exp) with |value| = sig * 2**exp exactly (finite inputs)."""
  bits = bits.astype(U32)
  negative = (bits >> 31) != 0
  biased = ((bits >> 23) & 0xFF).astype(I32)
  mant = bits & 0x7FFFFF
  sig = jnp.where(biased > 0, mant | 0x800000, mant)
  exp = jnp.maximum(biased, 1) - 150
  return negative, sig, exp


def bit_length(v):
  """Number of significant bits of a uint32 (0 for 0)."""
  return (32 - jax.lax.clz(v.astype(U32))).astype(I32)


def _shl(v, s):
  """v << s for 0 <= s, as 0 when s >= 32 (explicit, not relying on backend shift semantics)."""
  return jnp.where(s >= 32, U32(0), v << jnp.clip(s, 0, 31).astype(U32))


def _shr(v, s):
  return jnp.where(s >= 32, U32(0), v >> jnp.clip(s, 0, 31).astype(U32))


def round_to_grid(sig, exp, grid: Grid, rounding: str, *, negative=None, random_bits=None,
                  sticky=None):
  """Rounds |v| = (sig + tail) * 2**exp onto `grid` and returns the saturated magnitude code.

  Args:
    sig: uint32 significand (any width below 2**31).
    exp: int32 exponent of sig's unit.
    grid: the target grid.
    rounding: a mode of docs/numerics.md §6.
    negative: bool, the value's sign (directed modes).
    random_bits: uint32, for "stochastic": round up iff R >= 2**32 - F, F = floor(frac * 2**32).
    sticky: bool, True when bits below sig's unit were already dropped (tail > 0, tail < 1).

  Returns:
    uint32 magnitude code: float grids `((binade - emin) << mbits) + q` (the IEEE-style encoding
    without sign, carries included), integer grids q; saturated to grid.max_code.
  """
  sig = sig.astype(U32)
  exp = exp.astype(I32)
  lead = bit_length(sig) - 1 + exp  # exponent of the leading bit (sig > 0)
  ulp_exp = jnp.maximum(lead, grid.emin) - grid.mbits
  shift = ulp_exp - exp  # right shift that brings sig to ulp units
  left = jnp.maximum(-shift, 0)
  right = jnp.maximum(shift, 0)
  q = jnp.where(shift <= 0, _shl(sig, left), _shr(sig, right))
  # F: the first 32 bits of the fraction; lost: whether bits beyond them are non-zero.
  frac_hi = jnp.where(right <= 32, _shl(sig, 32 - right), _shr(sig, right - 32))
  frac_hi = jnp.where(right == 0, U32(0), frac_hi)
  lost = jnp.where(right <= 32, False, _shl(sig, 64 - right) != 0)
  lost = jnp.where(right - 32 >= 32, sig != 0, lost)
  if sticky is not None:
    lost = lost | sticky
  half = U32(0x80000000)
  if rounding == "nearest_even":
    up = (frac_hi > half) | ((frac_hi == half) & (lost | ((q & 1) == 1)))
  elif rounding == "nearest_away":
    up = frac_hi >= half
  elif rounding == "toward_zero":
    up = jnp.zeros_like(q, bool)
  elif rounding in ("toward_positive", "toward_negative"):
    inexact = (frac_hi != 0) | lost
    up = inexact & (negative if rounding == "toward_negative" else ~negative)
  elif rounding == "stochastic":
    up = random_bits.astype(U32) > ~frac_hi  # R >= 2**32 - F; never when F == 0
  else:
    raise ValueError(f"Unknown rounding mode {rounding!r}.")
  q = q + up.astype(U32)
  if grid.is_int:
    code = q
  else:
    binade = jnp.clip(ulp_exp + grid.mbits - grid.emin, 0, 255).astype(U32)
    code = (binade << grid.mbits) + q
  too_big = lead > grid.sat_exp
  code = jnp.where(too_big | (code > grid.max_code), U32(grid.max_code), code)
  return jnp.where(sig == 0, U32(0), code)


def pack_fp32(negative, sig, exp, sticky=None):
  """Rounds (sig + tail) * 2**exp to float32 bits: IEEE nearest-even, gradual underflow, Inf."""
  mag = round_to_grid(sig, exp, FP32_GRID, "nearest_even", sticky=sticky)
  return mag | (negative.astype(U32) << 31)


def _normalize(sig, exp):
  """Shifts a non-zero significand up to 24 bits (bit 23 set), keeping the value."""
  s = jnp.clip(24 - bit_length(sig), 0, 24)
  return sig << s.astype(U32), exp - s


def _nonfinite_product(a_bits, b_bits, out):
  """IEEE special cases of a * b: NaN operands or Inf * 0 give NaN, Inf * non-zero gives Inf."""
  a_abs, b_abs = a_bits & U32(ABS_MASK), b_bits & U32(ABS_MASK)
  sign = (a_bits ^ b_bits) & U32(SIGN_MASK)
  nan = (a_abs > INF_BITS) | (b_abs > INF_BITS) | ((a_abs == INF_BITS) & (b_abs == 0)) | (
      (b_abs == INF_BITS) & (a_abs == 0))
  inf = (a_abs == INF_BITS) | (b_abs == INF_BITS)
  out = jnp.where(inf, sign | U32(INF_BITS), out)
  return jnp.where(nan, U32(0x7FC00000), out)


def mul(a_bits, b_bits):
  """The IEEE float32 product fl32(a * b), exactly (subnormals, Inf and NaN included)."""
  a_bits, b_bits = a_bits.astype(U32), b_bits.astype(U32)
  na, sa, ea = split(a_bits)
  nb, sb, eb = split(b_bits)
  negative = na ^ nb
  zero = (sa == 0) | (sb == 0)
  sa, ea = _normalize(jnp.maximum(sa, 1), ea)
  sb, eb = _normalize(jnp.maximum(sb, 1), eb)
  # 24 x 24 -> 48-bit product from 12-bit halves, as hi * 2**24 + lo.
  ah, al = sa >> 12, sa & 0xFFF
  bh, bl = sb >> 12, sb & 0xFFF
  mid = ah * bl + al * bh  # < 2**25
  lo = al * bl + ((mid & 0xFFF) << 12)  # < 2**25
  hi = ah * bh + (mid >> 12) + (lo >> 24)
  lo = lo & 0xFFFFFF
  # P in [2**46, 2**48): keep its top 31 bits, the rest goes to sticky.
  sig = (hi << 7) | (lo >> 17)
  sticky = (lo & 0x1FFFF) != 0
  out = pack_fp32(negative, sig, ea + eb + 17, sticky)
  out = jnp.where(zero, negative.astype(U32) << 31, out)
  return _nonfinite_product(a_bits, b_bits, out)


def scale_parts(s_bits):
  """Splits a positive finite non-zero float32 s into (s' in [1, 2) as float32, e) with s = s' 2**e.

  Computed once per block; `mul_by_scale` then multiplies elements by s cheaply and exactly.
  """
  _, sig, exp = split(s_bits)
  sig, exp = _normalize(jnp.maximum(sig, 1), exp)
  significand = from_bits(U32(127 << 23) | (sig & 0x7FFFFF))
  return significand, exp + 23


def mul_by_scale(x_bits, significand, exp):
  """fl32(x * s) of finite x and s = significand * 2**exp (from `scale_parts`), as bits.

  x is first multiplied by 2**exp exactly (integer exponent arithmetic), then by the significand in
  float32, an exact IEEE multiply of normal numbers. When x * 2**exp is below the normal range the
  product is below 2**-125: the result is then 0 if fl32(x * s) is 0 and otherwise the smallest
  subnormal, with x's sign. That stand-in is not fl32(x * s), but it rounds exactly like it onto
  every element grid (their steps are >= 2**-16): to zero, or away from zero in a directed mode.
  """
  negative, sig, xexp = split(x_bits)
  zero = sig == 0
  sig, xexp = _normalize(jnp.maximum(sig, 1), xexp)
  biased = xexp + exp + 150
  sign = negative.astype(U32) << 31
  shifted = (jnp.clip(biased, 1, 254).astype(U32) << 23) | (sig & 0x7FFFFF)
  product = to_bits(from_bits(shifted) * significand) & U32(ABS_MASK)
  product = jnp.where(biased >= 255, U32(INF_BITS), product)
  product = jnp.where(biased <= 0, _tiny_product_is_nonzero(sig, xexp + exp, significand)
                      .astype(U32), product)
  return jnp.where(zero, sign, sign | product)


def _tiny_product_is_nonzero(sig, exp, significand):
  """fl32(sig * 2**exp * significand) != 0, i.e. the exact product exceeds 2**-150 (ties to 0)."""
  sig_s = (to_bits(significand) & 0x7FFFFF) | 0x800000  # significand = sig_s * 2**-23
  ah, al = sig >> 12, sig & 0xFFF
  bh, bl = sig_s >> 12, sig_s & 0xFFF
  mid = ah * bl + al * bh
  lo = al * bl + ((mid & 0xFFF) << 12)
  hi = ah * bh + (mid >> 12) + (lo >> 24)
  lo = lo & 0xFFFFFF
  # product = (hi * 2**24 + lo) * 2**(exp - 23), with hi * 2**24 + lo in [2**46, 2**48).
  j = -150 - (exp - 23)  # nonzero iff hi * 2**24 + lo > 2**j
  edge = U32(1) << jnp.clip(j - 24, 0, 31).astype(U32)
  at_edge = (hi > edge) | ((hi == edge) & (lo > 0))
  return (j < 46) | ((j <= 47) & at_edge)


def mul_small(sig_a, exp_a, negative_a, b_bits):
  """fl32(a * b) exactly, for finite a = sig_a * 2**exp_a with sig_a < 2**7 (an element value)."""
  b_bits = b_bits.astype(U32)
  nb, sb, eb = split(b_bits)
  out = pack_fp32(negative_a ^ nb, sig_a.astype(U32) * sb, exp_a + eb)
  a_bits = jnp.where(sig_a == 0, U32(0), U32(0x3F800000)) | (negative_a.astype(U32) << 31)
  return _nonfinite_product(a_bits, b_bits, out)


def div(a_bits, b_bits, steps: int = 26):
  """The IEEE float32 quotient fl32(a / b) of finite a, b (x / 0 -> Inf), by restoring division."""
  na, sa, ea = split(a_bits)
  nb, sb, eb = split(b_bits)
  negative = na ^ nb
  a_zero, b_zero = sa == 0, sb == 0
  sa, ea = _normalize(jnp.maximum(sa, 1), ea)  # both significands in [2**23, 2**24)
  sb, eb = _normalize(jnp.maximum(sb, 1), eb)
  q = (sa >= sb).astype(U32)
  rem = sa - q * sb

  def step(_, carry):  # one bit of q = floor(sa * 2**steps / sb); rem is the remainder
    q, rem = carry
    rem = rem << 1
    bit = rem >= sb
    return (q << 1) | bit.astype(U32), jnp.where(bit, rem - sb, rem)

  # A loop, not unrolled: keeps the HLO small (this runs per block or per tensor, not per element).
  q, rem = jax.lax.fori_loop(0, steps, step, (q, rem))
  out = pack_fp32(negative, q, ea - eb - steps, rem != 0)
  sign = negative.astype(U32) << 31
  out = jnp.where(b_zero, sign | INF_BITS, out)
  return jnp.where(a_zero, sign, out)


def recip(a_bits):
  """The IEEE float32 reciprocal fl32(1 / a) of finite a (0 -> Inf)."""
  return div(jnp.full_like(a_bits, 0x3F800000, dtype=U32), a_bits)


def recip_normal(a_bits):
  """fl32(1 / a) for finite non-zero a whose reciprocal is not subnormal (overflow gives Inf).

  Much cheaper than `recip`: the hardware divides the normalized significand 1 / [1, 2), which is
  an exact IEEE operation on normal numbers everywhere, and the exponent is patched on the bits.
  """
  negative, sig, exp = split(a_bits)
  sig, exp = _normalize(jnp.maximum(sig, 1), exp)
  significand = from_bits(U32(127 << 23) | (sig & 0x7FFFFF))  # in [1, 2)
  r = to_bits(jnp.float32(1.0) / significand)  # in (0.5, 1]
  biased = ((r >> 23) & 0xFF).astype(I32) - exp - 23
  out = (jnp.clip(biased, 0, 255).astype(U32) << 23) | (r & 0x7FFFFF)
  out = jnp.where(biased >= 255, U32(INF_BITS), out)
  return out | (negative.astype(U32) << 31)


def ldexp(bits, k):
  """fl32(a * 2**k) exactly, for finite a and int32 k (gradual underflow, overflow to Inf)."""
  negative, sig, exp = split(bits)
  return pack_fp32(negative, sig, exp + k)


def exponent(abs_bits):
  """floor(log2(a)) of a finite positive float32 given as bits (subnormals included)."""
  _, sig, exp = split(abs_bits)
  return bit_length(sig) - 1 + exp


def is_power_of_two(abs_bits):
  _, sig, _ = split(abs_bits)
  return (sig & (sig - 1)) == 0
