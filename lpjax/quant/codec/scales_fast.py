"""Block scales with the exact bits of `scales_exact`, at a fraction of its cost: NVFP4's two-level scales
(docs/numerics.md §5) in float32, and the e8m0 "rceil" exponent (§4) from two thresholds.

NVFP4.

`scales_exact.nvfp4_block_scales` computes s_b, S_enc_b and the decode multiplier with integer
emulation of every IEEE operation (~300 integer ops per block), because a tensor of tiny values
can make the intermediate products subnormal. Here:

- The per-tensor values are float32 too, each computed once per tensor (`materialize`: not copied
  into every per-block fusion, and opaque to XLA's reassociation of float expressions):
  S_enc = min(fl32(2688 / amax_t), FLT_MAX) is one IEEE division whenever amax_t is normal (its
  result is at least 2688 / FLT_MAX, normal, or overflows to inf, clamped); a subnormal amax_t
  gives inf whether flushed to 0 or not, clamped to FLT_MAX as the exact quotient is. A given
  tensor_amax of inf or NaN is read as `scales_exact` reads its bits: a number with exponent 128.
  c = fl32(S_enc * fl32(1/6)) is a product of normal numbers with a normal result (>= 2**-120).
  fl32(1 / S_enc) is formed in float32 where it is normal (in the float tail below) and with the
  integer routine in the exact tail, where it can be subnormal.
- p = fl32(amax_b * c) and s_b, its e4m3 round-half-even saturated at 448, are float32 for every
  tensor: `fast_elements.scaled_magnitude` then `round_magnitude`. c is always normal, which is all
  `scaled_magnitude` needs to be exact, subnormal amax_b included; a product below 2**-126
  (flushed or not) rounds to s_b = 0 either way.
- The tail t, S_enc_b and the multiplier is float32 for every tensor whose amax_t is 0 or at least
  2**-100; then each float32 operation below is one correctly rounded IEEE operation on normal
  numbers, i.e. the same value (with s_b_val in [2**-9, 448] or 0):
  - t = fl32(s_b_val * fl32(1 / S_enc)): fl32(1 / S_enc) = amax_t / 2688 rounded, so with amax_t
    >= 2**-100, t >= 2**-9 * 2**-112 is normal, and t <= FLT_MAX / 6.
  - S_enc_b = min(fl32(1 / t), FLT_MAX), FLT_MAX when t == 0: 1 / t >= 6 / FLT_MAX is normal.
  - decode multiplier fl32(fl32(s_b_val * amax_t) * fl32(1/2688)): >= 2**-120 when not 0; for
    amax_t >= 2**64 both paths form it at amax_t * 2**-64 and scale the result back by 2**64
    (exact: every intermediate is normal), so it never overflows.
  Other tensors (amax_t below 2**-100, or a given tensor_amax of inf or NaN) need the exact
  routines. With a tensor scale every tensor now takes the exact routines for the tail (the
  float tail's bits wherever that one is exact): a `lax.cond` between the two traced and compiled
  both at every operand, about half of an E4M3-scaled U-Net step's quantizer instructions. The
  float tail serves S_enc = 1 (no tensor scale). Once S_enc and amax_t are fixed, the tail
  depends on a block only through its byte s_b, so both are computed for all 256 bytes (the exact
  one by `_tail_tables`, jitted on scalars, traced once per process instead of once per quantizer:
  tracing the tail per quantizer was a third of an NVFP4 LLaMA step's lowering time) and each
  block looks its byte up (`factor_tables.ue4m3_rows`): 256 entries of work per tensor whatever
  its size.

rceil. k = E(fl32(amax * c)) + (1 if that product is not a power of two), c = fl32(1 / max), i.e.
k = ceil(log2(r)) of the correctly rounded (gradual-underflow) product r, clamped to [-127, 127].
`scales_exact.e8m0_exponent` multiplies with integer emulation (~200 operations per block). k is a
non-decreasing step function of amax, so it is fixed by the bits F_j of the smallest amax with
k >= j: k >= j exactly when r > 2**(j-1), i.e. when amax * c exceeds 2**(j-1) plus half the float32
spacing above it (a tie rounds down to the even 2**(j-1)). For j >= -125 that bound is
2**(j-1) (1 + 2**-24), so the amax bounds double from one j to the next and are normal floats:
F_(j+1) = F_j + 2**23 on the bits, and k = -125 + ((bits - F_-125) >> 23) for bits >= F_-125.
Below that only -126 (bits >= F_-126) and -127 remain. F_-126 and F_-125 are computed on the host
with exact rational arithmetic (`_rceil_bounds`). Inf and NaN amaxes give 127, as the integer
routine's product does (their blocks are NaN either way).
"""

from __future__ import annotations

import fractions
import functools

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.quant.numerics import exact_float as xf
from lpjax.quant.codec import fast_elements as fast
from lpjax.quant.formats import specs as formats
from lpjax.quant.numerics import fp32_bits as fb
from lpjax.quant.codec import scales_exact as sc
from lpjax.quant.numerics.materialize import materialize, opaque_zero

U32 = jnp.uint32
_E4M3 = formats.ELEMENT_FORMATS["e4m3"]


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


def encode_scale(amax_t_bits, use_tensor_scale: bool):
  """S_enc bits, as `scales_exact.nvfp4_encode_scale` computes them: min(fl32(2688 / amax_t), FLT_MAX),
  1 when amax_t == 0, computed once per tensor (module docstring)."""
  one = U32(sc.f32_const_bits(1.0))
  if not use_tensor_scale:
    return one
  # Bits at or above inf's: the integer routine reads them as the number with exponent 128 (inf
  # is 2**128), so the quotient is formed at exponent 126 and scaled by 2**-2 (normal, exact).
  beyond = amax_t_bits >= U32(fb.INF_BITS)
  divisor = fb.from_bits(jnp.where(beyond, amax_t_bits - U32(2 << 23), amax_t_bits))
  quotient = jnp.float32(448.0 * 6.0) / divisor
  s_enc = fb.to_bits(jnp.where(beyond, quotient * jnp.float32(0.25), quotient))
  s_enc = jnp.where(amax_t_bits == 0, one, jnp.minimum(s_enc, U32(sc.FLT_MAX_BITS)))
  (s_enc,) = materialize((s_enc,), opaque_zero(amax_t_bits))
  return s_enc


def _float_tail(s_b_val, s_enc_bits, amax_t_bits, use_tensor_scale):
  t = s_b_val * (jnp.float32(1.0) / fb.from_bits(s_enc_bits))
  flt_max = fb.from_bits(U32(sc.FLT_MAX_BITS))
  s_enc_b = jnp.where(t == 0, flt_max, jnp.minimum(jnp.float32(1.0) / t, flt_max))
  return fb.to_bits(s_enc_b), _decode_multiplier(s_b_val, amax_t_bits, use_tensor_scale)


def _times_e4m3(a_bits, m_bits):
  """fl32(a * m) for an e4m3 value a (0 or normal, at most 4 significant bits, either sign) and a
  finite m >= 0 (subnormal included), the bits `exact_float.mul_bits(a, m, a_is_short_normal=True)`
  gives, subnormal products included: `fast_elements.apply_multiplier` on |a| (module docstring 5
  there: exact for values of at most 12 significant bits and any finite multiplier), a's sign put
  back. 69 compiled instructions against `mul_bits`'s 109 (on 256 elements), in a table built at
  every operand that has a tensor scale (`_tail_tables`), so its operation count is compile time."""
  m_c, shift = fast.decode_factors(m_bits)
  magnitude = fast.apply_multiplier(fb.from_bits(a_bits & U32(fb.ABS_MASK)), m_c, shift,
                                    power_of_two=False, wide=True)
  return (a_bits & U32(fb.SIGN_MASK)) | magnitude


def _exact_decode_multiplier(s_b, amax_t_bits):
  """`scales_exact.nvfp4_decode_scale` (with a tensor scale) for any amax_t, the same bits:
  h = fl32(s_b * amax_t) by `_times_e4m3`, then fl32(h * fl32(1/2688)) by `exact_float`
  (subnormal results included); amax_t >= 2**64 is used as amax_t * 2**-64 and the result scaled
  back; s_b itself when amax_t == 0."""
  s_b_bits = sc.decode_bits(s_b, "e4m3")  # exactly the float32 of every e4m3 code
  big = amax_t_bits >= U32(sc.BIG_AMAX_T_BITS)
  shift = U32(64 << 23)
  h = _times_e4m3(s_b_bits, jnp.where(big, amax_t_bits - shift, amax_t_bits))
  g = xf.mul_bits(h, U32(sc.f32_const_bits(1.0 / 2688.0)))
  g_abs = g & U32(fb.ABS_MASK)
  g = jnp.where(big & (g_abs != 0) & (g_abs < U32(fb.INF_BITS)), g + shift, g)
  return jnp.where(amax_t_bits == 0, s_b_bits, g)


def _exact_tail(s_b, s_enc_bits, amax_t_bits, use_tensor_scale):
  """S_enc_b and the decode multiplier exactly as `scales_exact` computes them, for any amax_t: the
  products by an e4m3 value by `_times_e4m3`, 1 / S_enc (which can be subnormal here) by
  `exact_float`, 1 / t by `fp32_bits.recip_normal` as `scales_exact.nvfp4_block_encode_scale`
  does. Compiled into every NVFP4 quantizer with a tensor scale (on the 256 entries of
  `_tail_tables`), so its operation count is compile time."""
  del use_tensor_scale  # only called with a tensor scale
  (recip_s_enc,) = materialize((xf.recip_bits(s_enc_bits),), opaque_zero(amax_t_bits))
  t = _times_e4m3(sc.decode_bits(s_b, "e4m3"), recip_s_enc)
  s_enc_b = jnp.where(t == 0, U32(sc.FLT_MAX_BITS),
                      jnp.minimum(fb.recip_normal(t), U32(sc.FLT_MAX_BITS)))
  return s_enc_b, _exact_decode_multiplier(s_b, amax_t_bits)


# Every byte a scale can hold (s_b is 0 .. 0x7E; 0x7F marks a NaN group), the tail tables' index.
_SCALE_BYTES = 256


def _scale_bytes(amax_t_bits):
  """0..255 as uint32, opaque to XLA (+ a run-time zero): a constant iota would let XLA fold the
  integer routines over it at compile time, in every quantizer."""
  return jnp.arange(_SCALE_BYTES, dtype=U32) + opaque_zero(amax_t_bits)


@jax.jit
def _tail_tables(s_enc_bits, amax_t_bits):
  """(S_enc_b bits, decode multiplier bits) of this tensor for every scale byte 0..255, by
  `_exact_tail`: once S_enc and amax_t are fixed, the tail depends on a block only through its
  byte. Jitted on scalars, so it is traced once per process whatever the tensor's shape."""
  return _exact_tail(_scale_bytes(amax_t_bits), s_enc_bits, amax_t_bits, True)


@jax.jit
def _decode_table(amax_t_bits):
  """Decode multiplier bits of this tensor for every scale byte 0..255 (`_tail_tables`)."""
  return _exact_decode_multiplier(_scale_bytes(amax_t_bits), amax_t_bits)


def _look_up(table, s_b):
  """table[s_b] per block: a gather from the 256-entry table (s_b holds one byte)."""
  index = (s_b.astype(U32) & U32(_SCALE_BYTES - 1)).astype(jnp.int32)
  return table.at[index].get(mode="promise_in_bounds")


def _scalar(bits):
  """A per-tensor value as a uint32 scalar (the tables' jit cache key is its shape)."""
  return jnp.reshape(bits, ()).astype(U32)


def _table_multiplier(s_b, amax_t_bits):
  """The exact decode multiplier per block, looked up from the tensor's `_decode_table`."""
  return _look_up(_decode_table(_scalar(amax_t_bits)), s_b)


def _block_scale(amax_block_bits, s_enc_bits, amax_t_bits):
  """(s_b byte, its float32 value) per block: p = fl32(amax_b * c), rounded to e4m3."""
  # c = fl32(S_enc * fl32(1/6)): a product of normal numbers with a normal result. S_enc comes out
  # of `materialize`, so XLA cannot rewrite (2688 / amax_t) * C into one rounding.
  c = fb.to_bits(fb.from_bits(s_enc_bits) * jnp.float32(1.0 / 6.0))
  (c,) = materialize((c,), opaque_zero(amax_t_bits))
  p = fast.scaled_magnitude(amax_block_bits, *fast.encode_factors(c))
  return fast.round_magnitude(p, _E4M3, "nearest_even", negative=None)


def block_scale_bytes(amax_block_bits, s_enc_bits, amax_t_bits):
  """The s_b byte per block (p and s_b in float32 for every tensor, module docstring); the tail
  (S_enc_b, the multiplier) is a function of the byte, tabulated per tensor by
  `factor_tables.ue4m3_rows`."""
  return _block_scale(amax_block_bits, s_enc_bits, U32(0) if amax_t_bits is None else amax_t_bits)[0]


def decode_multiplier(s_b, amax_t_bits, use_tensor_scale: bool):
  """Per-block decode multiplier bits from s_b bytes, as `scales_exact.nvfp4_decode_scale` computes it."""
  def float_path(s_b, amax_t_bits):
    s_b_val = fb.from_bits(sc.decode_bits(s_b, "e4m3") & U32(fb.ABS_MASK))
    return _decode_multiplier(s_b_val, amax_t_bits, use_tensor_scale)

  if not use_tensor_scale:
    return float_path(s_b, U32(0))
  # With a tensor scale: the exact table's entry (the float path's bits wherever that one is
  # exact), one gather per block; not a cond tracing and compiling both at every operand.
  return _table_multiplier(s_b, amax_t_bits)


def _rceil_k(bits: int, c: fractions.Fraction, clamp: bool = True) -> int:
  """k of the rceil rule for amax with float32 bits `bits` (host, exact rational arithmetic);
  clamp=False: before the clamp to [-127, 127] (an amax whose product underflows to 0: -150)."""
  if bits == 0:
    return -127 if clamp else -150
  product = fractions.Fraction(float(np.uint32(bits).view(np.float32))) * c
  e = product.numerator.bit_length() - product.denominator.bit_length()  # floor(log2) or one more
  if fractions.Fraction(2) ** e > product:
    e -= 1
  spacing = fractions.Fraction(2) ** (max(e, -126) - 23)
  n = product / spacing
  q = n.numerator // n.denominator
  rest = n - q
  q += 1 if rest > fractions.Fraction(1, 2) or (rest == fractions.Fraction(1, 2) and q % 2) else 0
  r = q * spacing  # fl32(amax * c), gradual underflow
  if r == 0:
    return -127 if clamp else -150
  k = r.numerator.bit_length() - r.denominator.bit_length()
  k += 1 if fractions.Fraction(2) ** k < r else 0
  k -= 1 if fractions.Fraction(2) ** (k - 1) >= r else 0
  return max(-127, min(127, k)) if clamp else k


def _smallest_bits(at_least, lo: int = 0, hi: int = fb.INF_BITS) -> int:
  """The smallest float32 bits in (lo, hi] with at_least(bits), a non-decreasing predicate
  (hi when none below it has)."""
  while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (lo, mid) if at_least(mid) else (mid, hi)
  return hi


@functools.lru_cache(maxsize=None)
def _rceil_clamp_bounds(max_value: float) -> tuple[int, int]:
  """float32 bits of the smallest amax whose unclamped rceil k is >= -127, and >= 128."""
  c = fractions.Fraction(float(np.float32(1.0 / max_value)))
  return tuple(_smallest_bits(lambda b, j=j: _rceil_k(b, c, clamp=False) >= j)
               for j in (-127, 128))


def rceil_clamped(amax_bits, element):
  """Whether the "rceil" exponent of a finite amax is out of [-127, 127] before its clamp (the
  monitor's clamped_scales), as `scales_exact.e8m0_exponent(..., clamp=False)` tells it: two
  compares with bounds found on the host, not its ~200-operation exact product."""
  lo, hi = _rceil_clamp_bounds(element.max_value)
  bits = amax_bits.astype(U32)
  return (bits < U32(lo)) | (bits >= U32(hi)) if hi < fb.INF_BITS else bits < U32(lo)


@functools.lru_cache(maxsize=None)
def _rceil_bounds(max_value: float) -> tuple[int, int]:
  """float32 bits of the smallest amax with k >= -126 and with k >= -125 (module docstring)."""
  c = fractions.Fraction(float(np.float32(1.0 / max_value)))
  return tuple(_smallest_bits(lambda b, j=j: _rceil_k(b, c) >= j) for j in (-126, -125))


def rceil_exponent(amax_bits, element):
  """The e8m0 exponent k of the "rceil" scale mode, as `scales_exact.e8m0_exponent` computes it."""
  f126, f125 = _rceil_bounds(element.max_value)
  bits = amax_bits.astype(jnp.int32)  # absolute values: below 2**31
  k = jnp.int32(-125) + ((bits - jnp.int32(f125)) >> 23)
  k = jnp.where(bits < f125, jnp.where(bits < f126, jnp.int32(-127), jnp.int32(-126)), k)
  return jnp.where(bits >= fb.INF_BITS, jnp.int32(127), jnp.minimum(k, 127))
