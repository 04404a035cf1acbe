"""The kernel-friendly restatements in lpjax.pallas._tile_codec and the tiling plan, against the
routines of lpjax.quant they replace and against numpy."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax.pallas import _plan as plan
from lpjax.pallas import _tile_codec as tc
from lpjax.quant.numerics import fp32_bits as fb
from lpjax.quant.formats import packing
from lpjax.quant.codec import scales_exact as sc


def _f32_bits(values):
  return np.asarray(values, np.float32).view(np.uint32)


def test_recip_exact_is_the_ieee_reciprocal():
  rng = np.random.default_rng(0)
  # Normal values over the whole exponent range, powers of two, significands next to 1 and 2,
  # fp32 subnormals (whose reciprocals overflow), and FLT_MAX.
  vals = np.concatenate([
      rng.uniform(1, 2, 4000) * 2.0 ** rng.integers(-126, 127, 4000),
      2.0 ** np.arange(-126, 128),
      [1.0, np.nextafter(np.float32(1), np.float32(2)), np.nextafter(np.float32(2), np.float32(1))],
      [1e-39, 1.4e-45, 3e-39, np.finfo(np.float32).max, 2.0**-127 * 1.5],
  ]).astype(np.float32)
  vals = np.concatenate([vals, -vals[:50]])
  got = np.asarray(jax.jit(tc.recip_exact)(jnp.asarray(_f32_bits(vals))))
  with np.errstate(over="ignore", divide="ignore"):
    want = (np.float32(1) / vals).view(np.uint32)  # numpy: IEEE, no flushing
  np.testing.assert_array_equal(got, want)
  # ... and equal to fp32_bits.recip_normal wherever that one is defined (1/a not subnormal).
  normal = np.abs(vals) <= 2.0**126
  ref = np.asarray(jax.jit(fb.recip_normal)(jnp.asarray(_f32_bits(vals[normal]))))
  np.testing.assert_array_equal(got[normal], ref)


@pytest.mark.parametrize("amax_t", [1.0, 3.0e-3, 448.0 * 6, 7.1e4, 1e-30, 0.0, 3.4e38])
def test_nvfp4_block_scales_match_quant_scales(amax_t):
  rng = np.random.default_rng(1)
  block = np.concatenate([
      rng.uniform(0, 1, 2000) * amax_t * 2.0 ** -rng.integers(0, 40, 2000),
      [0.0, amax_t, amax_t / 2688, 1e-45, 1e-39],
  ]).astype(np.float32)
  amax_bits = jnp.asarray(_f32_bits(block))
  t_bits = jnp.asarray(_f32_bits(np.float32(amax_t)))

  def ours(amax_bits, t_bits):
    consts = tc.nvfp4_tensor_constants(t_bits, True)
    return tc.nvfp4_block_scales(amax_bits, *consts)

  def theirs(amax_bits, t_bits):
    return sc.nvfp4_block_scales(amax_bits, sc.nvfp4_encode_scale(t_bits, True))

  for a, b in zip(jax.jit(ours)(amax_bits, t_bits), jax.jit(theirs)(amax_bits, t_bits)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_pack_and_unpack_nibbles_match_packing():
  codes = np.random.default_rng(2).integers(0, 16, size=(6, 8, 10)).astype(np.uint32)
  for axis in (0, 1, 2):
    packed = np.asarray(tc.pack_nibbles(jnp.asarray(codes), axis))
    np.testing.assert_array_equal(packed, np.asarray(packing.pack_fp4(codes, axis=axis)))
    np.testing.assert_array_equal(np.asarray(tc.unpack_nibbles(jnp.asarray(packed), axis)), codes)


@pytest.mark.parametrize("shape,axis,block,directions", [
    ((3, 5, 96), 2, 32, ("rows",)), ((7,), 0, 16, ("rows",)), ((4, 4096), 1, 32, ("rows",)),
    ((4, 64, 8), 1, 32, ("cols",)), ((3, 45, 3), 1, 16, ("cols",)), ((70, 9), 0, 32, ("cols",)),
    ((2, 40, 72), 2, 32, ("rows", "cols")), ((33, 64), 1, 16, ("rows", "cols")),
])
def test_views_hold_whole_groups_in_power_of_two_tiles(shape, axis, block, directions):
  view = plan.make_view(shape, axis, block, directions)
  tm, tn = view.tile
  assert tm & (tm - 1) == 0 and tn & (tn - 1) == 0, view.tile
  assert view.m_pad % tm == 0 and view.n_pad % tn == 0
  assert view.p * view.m * view.n == math.prod(shape)
  if "rows" in directions:
    assert tn % block == 0 and view.n_pad == math.ceil(view.n / block) * block
  if "cols" in directions:
    assert tm % block == 0 and view.m_pad == math.ceil(view.m / block) * block
  x = jnp.arange(math.prod(shape), dtype=jnp.float32).reshape(shape) + 1
  x2d = view.to_2d(x)
  assert x2d.shape == (view.p * view.m_pad, view.n_pad)
  assert float(x2d.sum()) == float(x.sum())  # zero padding only
  np.testing.assert_array_equal(np.asarray(view.from_2d(x2d, view.m, view.n, shape)), np.asarray(x))


def test_bad_tiles_are_rejected():
  with pytest.raises(ValueError, match="powers of two"):
    plan.make_view((8, 64), 1, 32, ("rows",), tile=(8, 48))
