"""The fast element path: float32 arithmetic that gives the exact integer codec's bits on every input.

The exact codec (`group_codec.py` with `fp32_bits.py`) emulates every per-element step with integer
operations, ~90 (MXFP4) to ~160 (NVFP4) of them, because XLA:CPU flushes float32 subnormals to
zero. This module does the per-element work with a few dozen vectorizable float32 operations, and is
bit-identical to the exact codec. Per-group values are computed once per block: e8m0 exponents
with the integer routines (a few operations), NVFP4's two-level scales in float32 too
(`scales_fast.py`, which falls back to the integer routines for tensors it cannot prove exact).

Why each float operation is exact (IEEE float32, round-to-nearest-even, on a backend that may flush
subnormal inputs and results to zero, e.g. XLA:CPU, or may not, e.g. GPUs):

1. Powers of two are built from bits (`_pow2`), never computed, so 2**e is exact for -126 <= e
   <= 127.
2. `v = fl32(|x| * S)` for the group's encode multiplier S (2**-k for e8m0, S_enc_b for NVFP4,
   max / amax for fp32 scales). A float product of two normal numbers is correctly rounded whenever
   the result is normal, and that is what the exact codec computes (`fp32_bits.mul_by_scale`, or
   the exact x * 2**-k for e8m0, which is then representable). It is one multiply: XLA rewrites
   a chain (a * C1) * C2 of compile-time constants as a * (C1 * C2), which rounds differently.
   Three cases need care:
   - S is always normal: S = 2**-k with k <= 126 (k = E(amax) - emax <= 127 - 2 in every scale
     mode), S_enc_b >= 6 / FLT_MAX, max / amax >= 6 / FLT_MAX. Only a fixed scale exponent of 127
     gives a subnormal S, and that format keeps the exact codec (`supports`).
   - x subnormal (|x| = mant * 2**-149): v = fl32(float(mant) * (S * 2**-149)); float(mant) is
     exact (mant < 2**23), and S * 2**-149 is normal and exact when S >= 2**23. When S < 2**23 the
     true product is below 2**-103; it is replaced by 0, see 4.
   - v below 2**-126 (a "tiny" product) may be flushed to 0 or kept as a subnormal.
3. Rounding v onto the element grid: lead = the exponent field of v (v >= 2**-126 or v == 0),
   ulp = 2**(max(lead, emin) - mbits). t = v / ulp is an exact power-of-two scaling (t < 2**(mbits
   + 2)), `floor`, `ceil` and `round` (half to even) are exact, and ties away compare the exact frac = t - floor(t) with 0.5. The code is (binade << mbits) + q, as
   in the exact codec (a carry of q moves to the next binade by itself). v is clipped at the
   element's max_value first (exact): every v above it saturates in every mode, and max_value is
   on the grid, so a v at or below it rounds to at most max_value in every mode (no clip after).
   Stochastic rounding: F = floor(frac(t) * 2**32) is read off t's bits, shifted (`fraction_bits`),
   and the rounding-up rule R >= 2**32 - F is the exact codec's integer comparison.
4. Tiny products (2.): every element grid has steps >= 2**-16, so any value below 2**-100 rounds to 0
   in the nearest and toward-zero modes, and gets F = 0 (never rounds up) in stochastic rounding,
   whether it was flushed or not. In the directed modes a tiny non-zero product rounds away from
   zero to the smallest step; e8m0 rounds the exact m = x / 2**k, which is non-zero for every
   non-zero x, so q = max(q, x != 0) restores it. (For NVFP4 and fp32 scales the contract rounds
   fl32(x * S), which is 0 when the exact product is at most 2**-150; that needs the exact codec,
   so the directed modes use it there: `supports`.)
5. Decoding: out = fl32(value * M) for the group's decode multiplier M (2**k, the NVFP4 multiplier,
   or 1 / enc). value = q * ulp is exact (q a small integer). When M >= 2**-100 the product is normal
   (value >= 2**-16) and correctly rounded by the hardware. When M < 2**-100 the product may be
   subnormal: with M_c = M * 2**149 (exact: an integer below 2**49), P = fl32(value * M_c); if P >=
   2**23 the result is normal and its bits are P's minus 149 in the exponent field; otherwise, for
   the formats of `decodes`, P is exact and round(P) is the subnormal's mantissa, rounded to
   nearest even as IEEE does (for M = 2**k, P is an integer already; for elements wider than
   e2m1, P may be rounded, so the subnormal is rounded from the exact product, formed as two exact
   halves and Fast2Sum: `_round_even_of_sum`). A NaN product (NVFP4's
   M = inf times value 0) is made the canonical NaN.
6. Groups with a NaN or Inf are masked with per-group AND / OR masks (codes 0, values NaN), not a
   per-element select, which LLVM turns into a branch that keeps XLA:CPU's loop scalar.

The tests run the whole exact suite on both paths (`lpjax.quant.reference_arithmetic`) and cover
each case above by name (tests/quant/test_fast_codec.py).
"""

from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp

from lpjax.quant.numerics import fp32_bits as fb

U32 = jnp.uint32
I32 = jnp.int32
F32 = jnp.float32

_REFERENCE = contextvars.ContextVar("lpjax_quant_reference_arithmetic", default=False)


@contextlib.contextmanager
def reference_arithmetic():
  """Within this context, quantizers trace the all-integer reference codec instead of the fast path.

  Both give the same bits; the reference exists to prove it (the test suite runs on both) and to
  fall back on if a backend ever broke IEEE float32 semantics. It applies when a function is
  traced, so call or `jax.jit` the function inside the context.

  Example:
    >>> import jax.numpy as jnp
    >>> from lpjax import quant
    >>> x = jnp.linspace(-3.0, 3.0, 64).reshape(2, 32)
    >>> with quant.reference_arithmetic():
    ...   slow = quant.fake_quant(x, "nvfp4")
    >>> bool((slow == quant.fake_quant(x, "nvfp4")).all())
    True
  """
  token = _REFERENCE.set(True)
  try:
    yield
  finally:
    _REFERENCE.reset(token)


def reference_active() -> bool:
  """True inside `reference_arithmetic()`: traces made now take the exact integer path. A cache of
  traces (e.g. a jitted quantizer) keys on it."""
  return _REFERENCE.get()


def use_fast_path(fmt, rounding: str) -> bool:
  """Whether the fast element path runs for `fmt` and `rounding` (see `supports`)."""
  return not reference_active() and supports(fmt, rounding)


def supports(fmt, rounding: str) -> bool:
  """Float elements with e8m0 scales in every rounding mode; ue4m3 / fp32 scales except directed.

  Integer, uint4 and nf4 elements keep the exact codec (their quantizers are not on the training
  path), as do the directed modes with non-power-of-two scales (module docstring, 4).
  """
  if fmt.element.kind != "float" or fmt.fixed_scale_exponent == 127:  # 2**-127: subnormal S
    return False
  if fmt.scale == "e8m0":
    return True
  return rounding not in ("toward_positive", "toward_negative")


def decodes(fmt) -> bool:
  """Whether the fast path decodes fmt's values (`apply_multiplier`): every float element.

  Module docstring, 5: a subnormal product must be rounded from the exact value * M * 2**149.
  With M = 2**k that is a power-of-two scaling. For e2m1 (value = c * 2**j, c in {1, 3}) the
  product P < 2**23 is exact in float32. Wider elements (e4m3, e5m2, FP6: up to 4 significant
  bits, so up to 28 bits in the product) pass `wide=True` and round it from two exact halves.
  """
  return fmt.element.kind == "float"


def is_wide(element) -> bool:
  """Whether element values have more than 2 significant bits (every float element but e2m1), so
  a subnormal decode product needs `apply_multiplier(wide=True)` (module docstring, 5)."""
  return element.name != "e2m1"


def _round_even(t):
  """round-half-even of t >= 0 to an integer (float32), exactly (one IEEE roundeven).

  Not the magic-number form (t + 2**23) - 2**23: XLA folds that to t once 2**23 is a compile-time
  constant, and with an opaque 2**23 it still does when the opaque zero is constant-folded.
  """
  return jax.lax.round(t, jax.lax.RoundingMethod.TO_NEAREST_EVEN)


def _pow2(e):
  """2.0**e as float32 for int32 -126 <= e <= 127, built from its bits."""
  return fb.from_bits(((e + 127).astype(U32)) << 23)


def pow2_bits(e):
  """float32 bits of 2.0**e for int32 -127 <= e <= 127 (2**-127 is the subnormal 0x00400000)."""
  e = e.astype(I32)
  return jnp.where(e >= -126, (jnp.maximum(e, -126) + 127).astype(U32) << 23, U32(0x400000))


def _as_float(bits):
  return fb.from_bits(bits)


# --- per-group factors (computed once per group, exactly) ----------------------------------------


def encode_factors(s_bits):
  """Per-group float32 factors (s, s_sub) of the encode multiplier S (normal, finite, > 0).

  v = fl32(|x| * s) for normal x and v = fl32(float(mant) * s_sub) for subnormal x (module
  docstring, 2).
  """
  s_bits = s_bits.astype(U32) & U32(fb.ABS_MASK)
  # S * 2**-149 for subnormal x: exact when S >= 2**23 (subtract 149 from the exponent field).
  big = s_bits >= U32(150 << 23)
  s_sub = jnp.where(big, _as_float(s_bits - U32(149 << 23)), jnp.float32(0.0))
  return _as_float(s_bits), s_sub


def decode_factors(m_bits):
  """Per-group (m_c float32, shift uint32) of the decode multiplier M (finite, >= 0).

  M >= 2**-100: m_c = M and shift = 0. Smaller M: m_c = M * 2**149 exactly and shift = 149 << 23,
  the exponent-field offset `apply_multiplier` takes off a normal product (docstring, 5).
  """
  m_bits = m_bits.astype(U32) & U32(fb.ABS_MASK)
  shifted = m_bits < U32((127 - 100) << 23)
  normal = m_bits >= U32(0x800000)
  scaled = jnp.where(normal, _as_float(m_bits + U32(149 << 23)), m_bits.astype(F32))
  return (jnp.where(shifted, scaled, _as_float(m_bits)),
          jnp.where(shifted, U32(_SHIFT_BITS), U32(0)))


_SHIFT_BITS = 149 << 23  # 0x4A800000; plus its bit 0x800000, 0x4B000000 = float32 bits of 2**23
_TWO_23_BITS = 0x4B000000


# --- per-element work -----------------------------------------------------------------------------


def scaled_magnitude(abs_bits, s, s_sub):
  """v = fl32(|x| * S) as float32 (0 or >= 2**-126 when exact; tiny values may flush).

  One multiply: a chain (|x| * c1) * c2 would be reassociated by XLA when c1 and c2 are
  compile-time constants.
  """
  sub = abs_bits < U32(0x800000)
  # abs_bits < 2**31: a signed conversion (one instruction on x86, unlike uint32 -> float32).
  base = jnp.where(sub, abs_bits.astype(I32).astype(F32), _as_float(abs_bits))
  return base * jnp.where(sub, s_sub, s)


def round_magnitude(v, element, rounding: str, *, negative, random_bits=None, nonzero=None):
  """Rounds v >= 0 onto a float element grid: (magnitude code uint32, value float32), saturated.

  `nonzero` (bool, x != 0) is needed by the directed modes only (module docstring, 4).
  """
  grid = fb.Grid.for_element(element)
  v = jnp.minimum(v, jnp.float32(element.max_value))  # saturation (module docstring, 3)
  lead = (fb.to_bits(v) >> 23).astype(I32) - 127
  binade = jnp.maximum(lead, grid.emin)
  ulp_exp = binade - grid.mbits
  t = v * _pow2(-ulp_exp)
  if rounding == "nearest_even":
    q = _round_even(t)
  elif rounding == "nearest_away":
    floor = jnp.floor(t)
    q = floor + (t - floor >= jnp.float32(0.5)).astype(F32)
  elif rounding == "toward_zero":
    q = jnp.floor(t)
  elif rounding in ("toward_positive", "toward_negative"):
    away = ~negative if rounding == "toward_positive" else negative
    up = jnp.maximum(jnp.ceil(t), nonzero.astype(F32))
    q = jnp.where(away, up, jnp.floor(t))
  elif rounding == "stochastic":
    floor = jnp.floor(t)
    up = random_bits.astype(U32) > ~fraction_bits(t)  # R >= 2**32 - F, as fp32_bits.round_to_grid
    q = floor + up.astype(F32)
  else:
    raise ValueError(f"Unknown rounding mode {rounding!r}.")
  code = (((binade - grid.emin).astype(U32)) << grid.mbits) + q.astype(I32).astype(U32)
  code = jnp.minimum(code, U32(grid.max_code))
  return code, q * _pow2(ulp_exp)


def fraction_bits(t):
  """F = floor(frac(t) * 2**32) as uint32 for float32 t >= 0 (module docstring, 3), from t's bits.

  t = mant * 2**(e - 150) with mant = 2**23 | (its 23 fraction bits) and e its exponent field, so
  t * 2**32 = mant * 2**(e - 118) and F is that product mod 2**32 (the integer part of t shifts
  out of the word), floored: mant << (e - 118) or mant >> (118 - e). A shift by 32 or more gives
  0 (XLA's shifts, as x86's variable shifts), so both are taken and ORed. t = 0 and subnormal t
  (e = 0, t < 2**-126) give 0, as floor(frac * 2**32) does. Cheaper than floor, subtract,
  multiply, floor and a float to uint32 conversion (which XLA clamps).
  """
  bits = fb.to_bits(t)
  e = bits >> 23
  mant = (bits & U32(0x7FFFFF)) | U32(0x800000)
  return (mant << (e - U32(118))) | (mant >> (U32(118) - e))


def _round_even_of_sum(value, m_c):
  """round-half-even of the exact value * m_c (an integer-valued m_c < 2**49, value with at most
  12 significant bits, the product below about 2**23), without its float32 rounding.

  m_c = m_hi + m_lo, m_hi its top 12 significant bits: a = value * m_hi and b = value * m_lo are
  exact (at most 24 bits each), |b| < |a|, so s = fl32(a + b) and err = b - (s - a) (Fast2Sum)
  give a + b = s + err exactly, every operation on normal values (b >= 2**-16 * 2**-23 or 0).
  s is the float nearest the true product t, so t and s round to the same integer unless s is a
  tie (k + 1/2, representable below 2**23): then the sign of err decides. Contracting a product
  into an FMA with the sum changes nothing, since the products are exact.
  """
  m_hi = fb.from_bits(fb.to_bits(m_c) & U32(0xFFFFF000))
  m_lo = m_c - m_hi  # exact: the low 12 significand bits
  a = value * m_hi
  b = value * m_lo
  s = a + b
  err = b - (s - a)
  fl = jnp.floor(s)
  tie = (s - fl) == jnp.float32(0.5)
  q = _round_even(s)
  return jnp.where(tie & (err > 0), fl + 1, jnp.where(tie & (err < 0), fl, q))


def apply_multiplier(value, m_c, shift, *, power_of_two: bool, wide: bool = False):
  """float32 bits of fl32(value * M) for value >= 0 and `decode_factors` (m_c, shift).

  power_of_two: M is a power of two (e8m0), so a subnormal product P is an exact integer already.
  wide: values with more than 2 significant bits (`is_wide(element)`): a subnormal result is
  rounded from the exact product (`_round_even_of_sum`), since fl32(value * m_c) may
  already be rounded.
  """
  p = value * m_c
  p_bits = fb.to_bits(p)
  normal_bits = p_bits - shift
  # A subnormal result: shifted and P < 2**23, i.e. normal_bits below 0x800000 (2**23's bits less
  # 149 << 23), compared as int32 (P_bits < shift wraps negative). Unshifted (shift 0): P_bits below
  # 0x800000, i.e. P = 0 (M >= 2**-100 and value >= 2**-16 or 0), which both branches map to 0; a
  # NaN P (0x7FC00000) is not. One compare with a constant: a per-group bound (2**23 where shifted)
  # cost five scalar instructions per vector of elements on x86 (form it, broadcast it), and a
  # per-group bool ANDed with a per-element compare a dozen mask conversions.
  subnormal = normal_bits.astype(I32) < I32(0x800000)
  if wide and not power_of_two:
    rounded = _round_even_of_sum(value, m_c).astype(I32).astype(U32)
  else:
    # round-half-even of 0 <= P < 2**23 (an integer already for M = 2**k; exact for e2m1, module
    # docstring 5) as the bits of P + 2**23 less those of 2**23: exact, since P + 2**23 rounds to
    # an integer (and an FMA of the exact product with 2**23 gives the same sum). XLA's float to
    # int conversion would clamp and test for NaN on every element.
    rounded = fb.to_bits(p + jnp.float32(2.0 ** 23)) - U32(_TWO_23_BITS)
  return jnp.where(subnormal, rounded, normal_bits)


def canonical_nan(out_bits):
  """Any NaN as 0x7FC00000, the exact codec's NaN (M = inf times value 0 gives a signed NaN)."""
  return jnp.where((out_bits & U32(fb.ABS_MASK)) > U32(fb.INF_BITS), U32(0x7FC00000), out_bits)
