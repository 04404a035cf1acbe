"""Finite inputs near float32's maximum stay finite (docs/numerics.md §5 and the uint4 rule): NVFP4's
decode multiplier for amax_t >= 2**64 and uint4's span that overflows float32. Checked against
the numpy oracle on both element paths, plus the exhaustive argument that NVFP4 values never
overflow."""

import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import numpy_oracle as O  # noqa: E402

from lpjax import quant  # noqa: E402

pytestmark = pytest.mark.usefixtures("arithmetic")

F32 = np.float32
FLT_MAX = np.finfo(np.float32).max


def _huge(scale, seed=0):
  rng = np.random.default_rng(seed)
  x = (rng.uniform(-1, 1, (4, 64)) * scale).astype(F32)  # finite: scale <= 3e38
  x[0, :2] = [scale, -scale]  # the tensor amax, both signs
  x[1, 5] = 0.0
  x[2, 7] = F32(1e-30)
  return x


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4_16x16"])
@pytest.mark.parametrize("scale", [1e36, FLT_MAX, 2.0**64])
def test_nvfp4_of_huge_finite_inputs_is_finite_and_matches_the_oracle(fmt, scale):
  x = _huge(scale)
  q = quant.quantize(jnp.asarray(x), fmt)
  values = np.asarray(quant.dequantize(q))
  assert np.isfinite(values).all()
  ref = O.quantize(x, fmt)
  O.check_quantized(ref, q.codes, q.scales, values, q.tensor_scale, q.zeros, what=fmt)
  # Within NVFP4's resolution: an error of at most ~1/4 of the row's largest magnitude (e2m1's
  # step 1/2 at 4..6 of a block scaled to 6, plus the e4m3 scale's 1/16; rows hold whole blocks).
  assert np.all(np.abs(values.astype(np.float64) - x) <= 0.35 * np.abs(x).max(axis=-1,
                                                                              keepdims=True))
  fake = np.asarray(quant.fake_quant(jnp.asarray(x), fmt))
  np.testing.assert_array_equal(fake, values)


def test_the_rescaled_decode_never_overflows_for_any_top_binade_amax():
  # The largest decode multiplier is s_b = 448's; times the largest code 6 it stays finite for
  # each of the 2**20 largest float32 amax_t values (below them 6 M <= amax_t (1 + 2e-7) is far
  # from FLT_MAX).
  amax = np.arange(0x7F7FFFFF - 2**20, 0x7F7FFFFF + 1, dtype=np.uint32).view(F32)
  with np.errstate(all="ignore"):
    old = ((F32(448) * amax).astype(F32) * (F32(1) / F32(2688))).astype(F32)
    new = (((F32(448) * (amax * F32(2.0**-64))).astype(F32) * (F32(1) / F32(2688))).astype(F32)
           * F32(2.0**64)).astype(F32)
  assert np.isinf(old).all()  # the plain order overflows for all of them
  assert np.isfinite((F32(6) * new).astype(F32)).all()


def test_the_rescaled_decode_equals_the_plain_one_where_that_is_finite():
  rng = np.random.default_rng(1)
  amax = (2.0 ** rng.uniform(64, 118, 50_000)).astype(F32)
  s_b = O.e4m3_rne_sat(rng.uniform(2.0**-9, 448, 50_000).astype(F32))[0]
  with np.errstate(all="ignore"):
    plain = ((s_b * amax).astype(F32) * (F32(1) / F32(2688))).astype(F32)
    rescaled = (((s_b * (amax * F32(2.0**-64))).astype(F32) * (F32(1) / F32(2688))).astype(F32)
                * F32(2.0**64)).astype(F32)
  np.testing.assert_array_equal(rescaled.view(np.uint32), plain.view(np.uint32))


@pytest.mark.parametrize("low, high", [(-FLT_MAX, FLT_MAX), (-2e38, 2e38), (-1e32, FLT_MAX),
                                       (-1.0, 1.0)])
def test_uint4_groups_spanning_more_than_flt_max_stay_finite(low, high):
  rng = np.random.default_rng(2)
  x = rng.uniform(low, high, (2, 128)).astype(F32)
  x[0, :2] = [low, high]  # the group's min and max exactly
  x[1, 3] = 0.0
  q = quant.quantize(jnp.asarray(x), "uint4_g128")
  values = np.asarray(quant.dequantize(q))
  assert np.isfinite(values).all() and np.isfinite(np.asarray(q.scales)).all()
  ref = O.quantize(x, "uint4_g128")
  O.check_quantized(ref, q.codes, q.scales, values, q.tensor_scale, q.zeros, what="uint4_g128")
  step = (np.float64(high) - np.float64(low)) / 15  # uint4's grid spacing over the group
  assert np.all(np.abs(values.astype(np.float64) - x) <= 0.51 * step * (1 + 1e-6))
