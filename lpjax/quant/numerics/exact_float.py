"""Correctly rounded float32 products and reciprocals, subnormal results included, from float
arithmetic on normal numbers only: what `fp32_bits.mul` / `fp32_bits.recip` compute with
integer emulation, in about a third of the operations (it is the NVFP4 scale tail's exact branch,
compiled into every NVFP4 quantizer, so its size is compile time; docs/numerics.md §5).

Why every operation below is exact. XLA:CPU flushes subnormal float32 inputs and results to zero,
so no float operation here ever sees or makes one: a value is held as (significand, exponent), the
significand a float32 in [1, 2) and the exponent an int32, and the result's bits are assembled with
integer operations.

- `decompose`: a subnormal input's integer mantissa m < 2**23 converts to float32 exactly, and
  m = sig * 2**E(m) is read off its bits; a normal input's significand is its mantissa bits under
  the exponent of 1.0.
- `two_product(x, y)` for x, y in [1, 2) (Dekker's product): p = fl32(x * y) and e with
  x * y = p + e exactly. x = xh + xl with xh the top 12 significant bits (a bit mask, not a float
  operation) and xl < 2**-11 the other 12, so each partial product has at most 24 bits (exact).
  The sums are exact in the order written: xh*yh and p are within a factor 2 of each other, so
  their difference is exact (Sterbenz); adding xh*yl gives e - xl*y, a multiple of 2**-34 below
  2**-10 in magnitude (24 bits); adding xl*yh gives e - xl*yl, a multiple of 2**-34 below 2**-21;
  adding xl*yl gives e, representable (a multiple of 2**-46 of at most 2**-23). Every product
  and every sum is exact, so a backend that contracts a multiply and an add into an FMA computes
  the same values. `_short_product`: x has at most 12 significant bits, so xl = 0 and the sum
  stops after its second term.
- `recip_bits`: q = fl32(1 / x) for x in [1, 2); with the exact product 2q * x = p + e,
  2 - p is exact (Sterbenz: p is within 2**-22 of 2) and the remainder 2 - 2qx = (2 - p) - e is
  representable (the remainder of a correctly rounded quotient is), so its one rounding is exact.
  It is > 0 exactly when 1/x > q.
- `round_bits(p, err, k)`: the float32 of (p + err) * 2**k, p = fl32(p + err) > 0 at p's own
  precision. If p * 2**k is in the normal range it is the answer (p is already rounded to 24 bits;
  the exponent is added on the bits). Below it the answer is the integer RNE(v + err * 2**n),
  n = k + 149, v = p * 2**n < 2**23 (the subnormal mantissa): v's ulp is at most 1/2 there, so
  every midpoint k + 1/2 lies on v's grid and the exact value is on v's side of every midpoint other
  than v itself; v rounds like the exact value unless v is a midpoint, where err's sign decides
  (err == 0: to even; a non-zero err is at least 2**-48 here, so err * (v - r) keeps its sign,
  normal). n is clamped at -4: below it the exact value is under 2**-152 and v under
  1/4, both round to 0. Overflow (exponent >= 128) gives Inf's bits.

The integer routines stay the contract's reference; `tests/quant/test_exact_float.py` compares
these with them bit for bit over the whole float32 range.

Examples:
  >>> import jax.numpy as jnp
  >>> from lpjax.quant.numerics import fp32_bits as fb
  >>> a, b = fb.to_bits(jnp.float32(2.0 ** -130)), fb.to_bits(jnp.float32(3.0))
  >>> float(fb.from_bits(mul_bits(a, b))) == 3 * 2.0 ** -130   # a subnormal product, exact
  True
  >>> float(fb.from_bits(recip_bits(fb.to_bits(jnp.float32(2.0 ** 127))))) == 2.0 ** -127
  True
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lpjax.quant.numerics import fp32_bits as fb

U32 = jnp.uint32
I32 = jnp.int32
_ONE_BITS = 0x3F800000


def decompose(bits):
  """(sig, exp) with |value| = sig * 2**exp, sig a float32 in [1, 2), exp int32, of float32 bits
  other than zero (subnormals included; bits at or above Inf's read as exponent 128)."""
  bits = bits.astype(U32) & U32(fb.ABS_MASK)
  subnormal = bits < U32(1 << 23)
  # A subnormal's mantissa m < 2**23 is exactly a normal float32; m * 2**-149 is the value.
  src = jnp.where(subnormal, fb.to_bits(bits.astype(jnp.float32)), bits)
  sig = fb.from_bits((src & U32(0x7FFFFF)) | U32(_ONE_BITS))
  exp = (src >> 23).astype(I32) - 127 - jnp.where(subnormal, I32(149), I32(0))
  return sig, exp


def _high(x):
  """The top 12 significant bits of a positive float32 (a mask on the bits, exact)."""
  return fb.from_bits(fb.to_bits(x) & U32(0xFFFFF000))


def two_product(x, y):
  """(p, e): p = fl32(x * y) and x * y = p + e exactly, for x, y in [1, 2) (module docstring)."""
  p = x * y
  xh, yh = _high(x), _high(y)
  xl, yl = x - xh, y - yh
  e = ((xh * yh - p) + xh * yl + xl * yh) + xl * yl
  return p, e


def round_bits(p, err, k):
  """float32 bits of RNE((p + err) * 2**k), gradual underflow, Inf on overflow; p positive normal
  with p = fl32(p + err), k int32 (module docstring)."""
  pb = fb.to_bits(p)
  biased = (pb >> 23).astype(I32) + k
  normal = (pb.astype(I32) + (k << 23)).astype(U32)
  n = jnp.clip(k + 149, -4, 23)
  v = p * fb.from_bits(((n + 127) << 23).astype(U32))  # an exact power-of-two scaling
  r = jax.lax.round(v, jax.lax.RoundingMethod.TO_NEAREST_EVEN)
  d = v - r  # exact; +-1/2 at a midpoint, where r is the even neighbour
  # At a midpoint the exact value lies on err's side of v: one step further from r than d's
  # direction when err and d agree in sign (r + 2d), else r itself.
  r = jnp.where((jnp.abs(d) == jnp.float32(0.5)) & (err * d > 0), r + (d + d), r)
  out = jnp.where(biased >= 1, normal, r.astype(U32))
  return jnp.where(biased >= 255, U32(fb.INF_BITS), out)


def _short_product(x, y):
  """`two_product` for an x with at most 12 significant bits (xl = 0): (p, e), x * y = p + e."""
  p = x * y
  yh = _high(y)
  return p, (x * yh - p) + x * (y - yh)


def mul_bits(a_bits, b_bits, *, a_is_short_normal: bool = False):
  """fl32(a * b) of finite float32 bits (bits at or above Inf's read as exponent 128), as
  `fp32_bits.mul` computes it for finite operands. a_is_short_normal: the caller guarantees a is
  0 or normal with at most 12 significant bits (an e4m3 scale, an element value), which skips
  a's subnormal case and its split."""
  a_bits, b_bits = a_bits.astype(U32), b_bits.astype(U32)
  sign = (a_bits ^ b_bits) & U32(fb.SIGN_MASK)
  zero = ((a_bits & U32(fb.ABS_MASK)) == 0) | ((b_bits & U32(fb.ABS_MASK)) == 0)
  sb, eb = decompose(b_bits)
  if a_is_short_normal:
    a_abs = a_bits & U32(fb.ABS_MASK)
    sa = fb.from_bits((a_abs & U32(0x7FFFFF)) | U32(_ONE_BITS))
    p, e = _short_product(sa, sb)
    ea = (a_abs >> 23).astype(I32) - 127
  else:
    sa, ea = decompose(a_bits)
    p, e = two_product(sa, sb)
  return sign | jnp.where(zero, U32(0), round_bits(p, e, ea + eb))


def recip_bits(a_bits):
  """fl32(1 / a) of finite non-zero float32 bits, as `fp32_bits.recip` computes it."""
  a_bits = a_bits.astype(U32)
  sig, exp = decompose(a_bits)
  q = jnp.float32(1.0) / sig  # in (1/2, 1]
  p, e = two_product(q * jnp.float32(2.0), sig)  # q * 2 in (1, 2]: exact scaling
  r = (jnp.float32(2.0) - p) - e  # 2 - 2q*x = 2r, same sign as 1/x - q
  return (a_bits & U32(fb.SIGN_MASK)) | round_bits(q, r, -exp)
