"""`exact_float` against the integer reference (`fp32_bits.mul` / `recip`) and numpy, bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax.quant.numerics import exact_float as xf
from lpjax.quant.numerics import fp32_bits as fb


def _random_bits(rng, n, biased_lo=0, biased_hi=254):
  """Non-negative float32 bits with exponent fields uniform in [lo, hi] and random mantissas."""
  biased = rng.integers(biased_lo, biased_hi + 1, n, dtype=np.uint32)
  mant = rng.integers(0, 1 << 23, n, dtype=np.uint32)
  # Short mantissas too (the element and scale values the NVFP4 tail multiplies have 1-4 bits).
  short = rng.random(n) < 0.3
  mant = np.where(short, mant & np.uint32(0x700000), mant)
  return (biased << 23) | mant


def _exact_product_bits(a, b):
  """numpy: RNE float32 of the exact product a * b (float64 holds 48-bit products exactly; the
  float64 -> float32 conversion rounds once, gradual underflow included)."""
  a64 = a.view(np.float32).astype(np.float64)
  b64 = b.view(np.float32).astype(np.float64)
  with np.errstate(over="ignore"):
    return (a64 * b64).astype(np.float32).view(np.uint32)


def test_products_match_the_integer_routine_and_numpy_over_the_whole_range():
  rng = np.random.default_rng(0)
  n = 200_000
  a = _random_bits(rng, n)
  # b chosen so that many products land near and below the normal range and near overflow.
  target = rng.integers(-160, 130, n)
  a_exp = (a >> 23).astype(np.int64) - 127
  b_biased = np.clip(target - a_exp + 127, 0, 254).astype(np.uint32)
  b = (b_biased << 23) | rng.integers(0, 1 << 23, n, dtype=np.uint32)
  b = np.where(rng.random(n) < 0.05, np.uint32(0), b)  # zeros
  got = np.asarray(jax.jit(xf.mul_bits)(jnp.asarray(a), jnp.asarray(b)))
  ref = np.asarray(jax.jit(fb.mul)(jnp.asarray(a), jnp.asarray(b)))
  np.testing.assert_array_equal(got, ref)
  # float64 underflows below 2**-1074: products of float32s (>= 2**-298) are exact there.
  np.testing.assert_array_equal(got, _exact_product_bits(a, b))
  subnormal = (got > 0) & (got < (1 << 23))
  assert subnormal.sum() > 5_000 and (got == fb.INF_BITS).sum() > 100


def test_subnormal_midpoints_are_broken_by_the_product_error():
  """Products whose 24-bit rounding p lands exactly on a midpoint of the subnormal grid while the
  exact product does not: only the error term rounds them right (and exact midpoints go to even)."""
  rng = np.random.default_rng(1)
  n = 400_000
  # a * b ~ 2**-140: subnormal results with ~10 bits, so p is a midpoint about once in 2**13.
  a = (np.uint32(127 - 70) << 23) | rng.integers(0, 1 << 23, n, dtype=np.uint32)
  b = (np.uint32(127 - 71) << 23) | rng.integers(0, 1 << 23, n, dtype=np.uint32)
  short = np.arange(n) % 4 == 0  # 4-bit significands: some exact products are midpoints
  a = np.where(short, a & np.uint32(0xFFF00000), a)
  b = np.where(short, (b & np.uint32(0x700000)) | (np.uint32(127 - 74) << 23), b)  # ~2**-144
  p = (a.view(np.float32) * b.view(np.float32).astype(np.float64) * 2.0**140).astype(np.float32)
  v = p.astype(np.float64) * 2.0**9  # p's position on the subnormal grid (2**-149 = 2**-140 2**-9)
  midpoint = (v - np.floor(v)) == 0.5
  exact = a.view(np.float32).astype(np.float64) * b.view(np.float32).astype(np.float64) * 2.0**149
  inexact_midpoint = midpoint & (exact != v)
  assert inexact_midpoint.sum() > 10 and (midpoint & (exact == v)).sum() > 10
  got = np.asarray(jax.jit(xf.mul_bits)(jnp.asarray(a), jnp.asarray(b)))
  np.testing.assert_array_equal(got, _exact_product_bits(a, b))
  np.testing.assert_array_equal(got, np.asarray(jax.jit(fb.mul)(jnp.asarray(a), jnp.asarray(b))))


def test_short_normal_first_operands_take_the_short_product():
  """a_is_short_normal (e4m3 scales times subnormal-range or huge b): same bits as `fb.mul`."""
  rng = np.random.default_rng(3)
  codes = np.arange(256, dtype=np.uint8)
  from lpjax.quant.codec import scales_exact as sc
  a = np.asarray(sc.decode_bits(jnp.asarray(codes), "e4m3"))  # every e4m3 value, 0 and +-480
  a = np.tile(a, 800)
  b = _random_bits(rng, a.size, 0, 254)
  b = np.where(rng.random(a.size) < 0.5, b & np.uint32(0x00FFFFFF), b)  # many subnormal-range b
  got = np.asarray(jax.jit(lambda a, b: xf.mul_bits(a, b, a_is_short_normal=True))(a, b))
  np.testing.assert_array_equal(got, np.asarray(jax.jit(fb.mul)(jnp.asarray(a), jnp.asarray(b))))
  assert ((got & 0x7FFFFFFF) < (1 << 23)).sum() > 10_000  # subnormal results included


def test_the_tail_tables_e4m3_product_equals_the_integer_routine():
  """`scales_fast._times_e4m3` (the NVFP4 tail's products by an e4m3 value, by
  `fast_elements.apply_multiplier`): the bits of `fb.mul` for every e4m3 value (both signs, 0,
  +-480) times finite b >= 0 over the whole range, subnormal b and subnormal products included."""
  from lpjax.quant.codec import scales_exact as sc
  from lpjax.quant.codec import scales_fast as fs
  rng = np.random.default_rng(5)
  a = np.tile(np.asarray(sc.decode_bits(jnp.arange(256, dtype=jnp.uint32), "e4m3")), 800)
  b = _random_bits(rng, a.size, 0, 254)
  b = np.where(rng.random(a.size) < 0.5, b & np.uint32(0x00FFFFFF), b)  # many subnormal-range b
  got = np.asarray(jax.jit(fs._times_e4m3)(jnp.asarray(a), jnp.asarray(b)))
  np.testing.assert_array_equal(got, np.asarray(jax.jit(fb.mul)(jnp.asarray(a), jnp.asarray(b))))
  assert ((got & 0x7FFFFFFF) < (1 << 23)).sum() > 10_000  # subnormal results included
  assert ((got & 0x7FFFFFFF) >= (1 << 23)).sum() > 10_000  # and normal ones


@pytest.mark.parametrize("biased_lo,biased_hi", [(0, 0), (1, 254), (250, 255)])
def test_reciprocals_match_the_integer_routine_and_numpy(biased_lo, biased_hi):
  """Subnormal inputs (huge reciprocals, Inf), normal ones, and the top binades (subnormal
  reciprocals, the case the NVFP4 tail needs), plus bits read as exponent 128."""
  rng = np.random.default_rng(2)
  a = _random_bits(rng, 100_000, biased_lo, biased_hi)
  a = a[a != 0]
  got = np.asarray(jax.jit(xf.recip_bits)(jnp.asarray(a)))
  np.testing.assert_array_equal(got, np.asarray(jax.jit(fb.recip)(jnp.asarray(a))))
  finite = a < fb.INF_BITS
  with np.errstate(over="ignore", divide="ignore"):
    want = (1.0 / a[finite].view(np.float32).astype(np.float64)).astype(np.float32).view(np.uint32)
  np.testing.assert_array_equal(got[finite], want)


def test_signs_and_exact_values():
  bits = lambda v: np.float32(v).view(np.uint32)  # noqa: E731
  a = jnp.asarray([bits(-3.0), bits(2.0**-149), bits(2.0**-75), bits(1.5)], jnp.uint32)
  b = jnp.asarray([bits(0.5), bits(0.5), bits(2.0**-75), bits(-0.0)], jnp.uint32)
  got = np.asarray(xf.mul_bits(a, b)).view(np.float32)
  # 2**-150 is the tie between 0 and the smallest subnormal: to even (0).
  np.testing.assert_array_equal(got, np.float32([-1.5, 0.0, 0.0, -0.0]))
  assert np.signbit(got[3])
  r = np.asarray(xf.recip_bits(jnp.asarray([bits(-4.0), bits(3.0)], jnp.uint32))).view(np.float32)
  np.testing.assert_array_equal(r, np.float32([-0.25, 1 / np.float32(3.0)]))


def _tail_amax_t_bits(rng):
  """amax_t values that take the NVFP4 scale tail's exact branch: subnormal and tiny normal ones
  below 2**-100 (where 1 / S_enc and the products turn subnormal), and Inf / NaN bits (a given
  tensor_amax); plus in-range ones, where the exact branch must agree as well."""
  tiny = _random_bits(rng, 40, 0, 127 - 101)
  special = np.uint32([1, 0x7FFFFF, 0x800000, 0x0D7FFFFF, 0x0D800000, 0x3F800000, 0x5F800000,
                       0x7F7FFFFF, 0x7F800000, 0x7FC00000, 0x7FFFFFFF])
  return np.concatenate([tiny, special])


def test_the_nvfp4_exact_tail_equals_the_integer_reference_for_every_scale_byte():
  from lpjax.quant.codec import scales_fast as fs
  from lpjax.quant.codec import scales_exact as sc
  s_b = jnp.arange(256, dtype=jnp.uint32)  # every ue4m3 byte (the NaN code and signed ones too)

  def both(amax_t):
    s_enc = fs.encode_scale(amax_t, True)
    new = fs._exact_tail(s_b, s_enc, amax_t, True)
    ref = (sc.nvfp4_block_encode_scale(s_b, fb.recip(s_enc)),
           sc.nvfp4_decode_scale(s_b, amax_t, True))
    return new, ref, fs._exact_decode_multiplier(s_b, amax_t)

  for amax_t in _tail_amax_t_bits(np.random.default_rng(4)):
    (enc, mult), (enc_ref, mult_ref), mult_decode = jax.jit(both)(jnp.uint32(amax_t))
    np.testing.assert_array_equal(np.asarray(enc), np.asarray(enc_ref), err_msg=hex(amax_t))
    np.testing.assert_array_equal(np.asarray(mult), np.asarray(mult_ref), err_msg=hex(amax_t))
    np.testing.assert_array_equal(np.asarray(mult_decode), np.asarray(mult_ref))
