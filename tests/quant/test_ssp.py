"""The Stable-SPAM paper's fake quantizers (lpjax.quant.schemes.ssp) against loop-by-group numpy references
written from docs/numerics.md §7 and the paper's reference code."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax.quant.schemes import ssp


def _rne(v):
  return np.round(v)  # numpy rounds half to even


def _top2(g):
  order = sorted(range(len(g)), key=lambda i: (-abs(g[i]), i))  # ties: lowest index first
  return set(order[:2])


def ref_fp4(g):
  """One group: top-2 |x| exact, the rest round-half-even onto {0, ±1/4, ..., ±1} x alpha."""
  g = np.asarray(g, np.float32)
  keep = _top2(g)
  rest = np.array([0.0 if i in keep else g[i] for i in range(len(g))], np.float32)
  alpha = np.float32(max(np.abs(rest).max(), 1e-6))
  step = np.float32(alpha * np.float32(0.25))
  q = (_rne(rest / step) * step).astype(np.float32)
  return np.array([g[i] if i in keep else q[i] for i in range(len(g))], np.float32)


def ref_int4(g):
  g = np.asarray(g, np.float32)
  keep = _top2(g)
  rest = np.array([0.0 if i in keep else g[i] for i in range(len(g))], np.float32)
  alpha = np.float32(max(np.abs(rest).max(), 1e-6))
  codes = np.clip(_rne(rest * np.float32(np.float32(7.0) / alpha)), -8, 7).astype(np.float32)
  q = (codes * np.float32(alpha * np.float32(1 / 7))).astype(np.float32)
  return np.array([g[i] if i in keep else q[i] for i in range(len(g))], np.float32)


def ref_uint4(g):
  g = np.asarray(g, np.float32)
  lo, hi = g.min(), g.max()
  scale = np.float32(max(hi - lo, np.float32(1e-5)) * np.float32(1 / 15))
  zero = np.clip(-_rne(lo / scale), 0, 15)
  codes = np.clip(_rne(g / scale) + zero, 0, 15)
  return ((codes - zero) * scale).astype(np.float32)


def _by_groups(ref, x, group, axis):
  x = np.moveaxis(np.asarray(x, np.float32), axis, -1)
  n = x.shape[-1]
  pad = (-n) % group
  xp = np.concatenate([x, np.zeros(x.shape[:-1] + (pad,), np.float32)], -1)
  out = np.stack([ref(row) for row in xp.reshape(-1, group)]).reshape(xp.shape)[..., :n]
  return np.moveaxis(out, -1, axis)


FUNCS = {"ssp_fp4_g256": ref_fp4, "ssp_int4_g256": ref_int4, "ssp_uint4_g256": ref_uint4}


@pytest.mark.parametrize("name", ssp.NAMES)
@pytest.mark.parametrize("shape,axis", [((4, 512), -1), ((300, 3), 0)])  # 300: padded to 512
def test_matches_the_numpy_reference(name, shape, axis):
  rng = np.random.default_rng(0)
  x = (rng.standard_normal(shape) * np.exp(rng.uniform(-3, 3, shape))).astype(np.float32)
  got = np.asarray(jax.jit(lambda x: ssp.quantize_ssp(x, name, axis=axis))(x))
  np.testing.assert_array_equal(got, _by_groups(FUNCS[name], x, 256, axis))


def test_fp4_grid_topk_and_ties():
  g = np.zeros(8, np.float32)
  g[:6] = [-9.0, 7.0, 1.0, 0.375, -0.125, 0.625]  # alpha = 1 after removing -9 and 7
  q = np.asarray(ssp.fp4_fake_quant(jnp.asarray(g), group=8))
  # 0.375 = 1.5 steps -> 2 steps (half even); -0.125 = -0.5 steps -> -0; 0.625 = 2.5 steps -> 2
  np.testing.assert_array_equal(q, [-9.0, 7.0, 1.0, 0.5, -0.0, 0.5, 0.0, 0.0])
  levels = np.unique(np.abs(np.asarray(ssp.fp4_fake_quant(jnp.linspace(-1, 1, 256)))))
  assert len(levels) <= 5 + 2  # 5 magnitudes on the grid (+ the 2 kept values)


def test_int4_and_uint4_examples():
  g = jnp.array([100.0, -50.0, 0.7, -0.35, 0.1, 0.0, 0.0, 0.0])
  q = np.asarray(ssp.int4_fake_quant(g, group=8))  # alpha = 0.7: codes 7, -3.5 -> -4, 1
  np.testing.assert_allclose(q, [100.0, -50.0, 0.7, -0.4, 0.1, 0, 0, 0], rtol=1e-6)
  w = jnp.array([-1.0, 0.5, 2.0, 0.0])
  q = np.asarray(ssp.uint4_fake_quant(w, group=4))  # scale fl32(3 / 15), zero 5
  # 0.5 / fl32(0.2) = 2.49999996 -> 2 steps -> 0.4; the range ends are exact
  np.testing.assert_allclose(q, [-1.0, 0.4, 2.0, 0.0], atol=1e-6)


def test_unknown_name():
  with pytest.raises(ValueError, match="ssp_fp4_g256"):
    ssp.quantize_ssp(jnp.ones(4), "ssp_fp3")
