"""JAX transformations (grad of fake_quant, jit, vmap, sharding over 8 devices) and the random
Hadamard transform."""

import os
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

sys.path.insert(0, os.path.dirname(__file__))
import numpy_oracle as O  # noqa: E402

from lpjax import quant  # noqa: E402

CANON = (16, 128)
X = O.heavy_tailed(CANON, 21, exp_range=8)
PRESETS = ["mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2", "nvfp4",
           "nvfp4_16x16", "fp8_e4m3", "fp8_e5m2", "int8_channel", "int4_channel", "int8_g128",
           "int4_g128", "uint4_g128", "nf4"]


def _u4(fmts):
  # uint4's fl32(code * scale) + lo once lost a rounding under jit (XLA:CPU contracted it into an
  # FMA); the product is now computed on the bits, so jit and eager agree for every format.
  return list(fmts)


def same_qarray(a, b, what):
  O.assert_same_bits(np.asarray(a.codes), np.asarray(b.codes), f"{what} codes")
  O.assert_same_bits(np.asarray(a.scales), np.asarray(b.scales), f"{what} scales")
  assert (a.tensor_scale is None) == (b.tensor_scale is None)
  if a.tensor_scale is not None:
    O.assert_same_bits(np.asarray(a.tensor_scale), np.asarray(b.tensor_scale), f"{what} ts")
  assert (a.zeros is None) == (b.zeros is None)
  if a.zeros is not None:
    O.assert_same_bits(np.asarray(a.zeros), np.asarray(b.zeros), f"{what} zeros")
  assert a.shape == b.shape and a.axis == b.axis and a.fmt == b.fmt


def _kw(rounding, seed=0):
  kw = {"rounding": rounding}
  if rounding == "stochastic":
    kw["key"] = jax.random.key(seed)
  return kw


# ----------------------------------------------------------------------------- gradients

GRAD_CASES = [("mxfp4", "stochastic"), ("nvfp4", "nearest_even"), ("fp8_e4m3", "nearest_even"),
              ("int4_g128", "toward_zero"), ("nf4", "nearest_even")]


@pytest.mark.parametrize("fmt,rounding", GRAD_CASES)
def test_fake_quant_gradient_is_identity(fmt, rounding):
  kw = _kw(rounding)
  w = jnp.asarray(np.random.default_rng(1).standard_normal(CANON).astype(np.float32))
  x = jnp.asarray(X)

  @jax.jit
  def grads(x):
    g = jax.grad(lambda x: jnp.sum(w * quant.fake_quant(x, fmt, **kw)))(x)
    # through a nonlinearity: d/dx sum(sin(fake_quant(x))) = cos(fake_quant(x))
    g2 = jax.grad(lambda x: jnp.sum(jnp.sin(quant.fake_quant(x, fmt, **kw))))(x)
    return g, g2, quant.fake_quant(x, fmt, **kw)

  g, g2, y = grads(x)
  O.assert_same_bits(np.asarray(g), np.asarray(w), "grad")
  np.testing.assert_allclose(np.asarray(g2), np.cos(np.asarray(y)), rtol=1e-6, atol=1e-6)
  assert np.any(np.asarray(y) != X), "fake_quant must actually quantize"


def test_fake_quant_gradient_bf16_and_jit():
  xb = jnp.asarray(X.astype(ml_dtypes.bfloat16))
  w = jnp.asarray(np.random.default_rng(2).standard_normal(CANON).astype(ml_dtypes.bfloat16))
  loss = lambda x: jnp.sum((w * quant.fake_quant(x, "mxfp4")).astype(jnp.float32))
  g = jax.jit(jax.grad(loss))(xb)
  assert g.dtype == jnp.bfloat16
  O.assert_same_bits(np.asarray(g), np.asarray(w), "bf16 grad")
  key = jax.random.key(4)
  vjp_out, vjp = jax.vjp(lambda x: quant.fake_quant(x, "nvfp4", rounding="stochastic", key=key),
                         jnp.asarray(X))
  (gx,) = vjp(jnp.full(CANON, 3.0, jnp.float32))
  assert np.all(np.asarray(gx) == 3.0)


# ----------------------------------------------------------------------------- jit

@pytest.mark.parametrize("fmt", _u4(PRESETS))
def test_jit_matches_eager(fmt):
  """quantize and dequantize under one jit give the eager (and oracle) bits."""
  x = jnp.asarray(X)

  @jax.jit
  def f(x):
    q = quant.quantize(x, fmt)
    return q, quant.dequantize(q)

  qj, dj = f(x)
  qe = quant.quantize(x, fmt)
  same_qarray(qj, qe, "jit")
  O.assert_same_bits(np.asarray(dj), np.asarray(quant.dequantize(qe)), "jit dequantize")
  O.assert_same_bits(np.asarray(dj), O.quantize(X, fmt)["values"], "jit dequantize vs oracle")


@pytest.mark.parametrize("fmt", _u4(["mxfp4", "nvfp4", "int4_g128", "uint4_g128"]))
def test_jit_stochastic_key_as_argument(fmt):
  f = jax.jit(lambda x, k: quant.fake_quant(x, fmt, rounding="stochastic", key=k))
  x = jnp.asarray(X)
  for seed in (0, 1):
    k = jax.random.key(seed)
    ref = O.quantize(X, fmt, rounding="stochastic", rbits=np.asarray(quant.random_bits(k, CANON)))
    O.assert_same_bits(np.asarray(f(x, k)), ref["values"], f"jit SR seed {seed}")
  y0, y1 = np.asarray(f(x, jax.random.key(0))), np.asarray(f(x, jax.random.key(1)))
  assert not np.array_equal(y0, y1)


# ----------------------------------------------------------------------------- vmap

X3 = np.stack([O.heavy_tailed(CANON, 30 + i, exp_range=8) for i in range(3)])


@pytest.mark.parametrize("fmt,rounding", [("mxfp4", "stochastic"), ("nvfp4", "nearest_even"),
                                          ("nvfp4_16x16", "stochastic"),
                                          ("fp8_e5m2", "toward_negative"),
                                          ("int8_channel", "nearest_even")])
def test_vmap_matches_per_slice(fmt, rounding):
  """vmap over a leading axis == quantizing each slice on its own (per-tensor amax included)."""
  kw = _kw(rounding, seed=3)

  @jax.jit
  def f(x3):
    qv = jax.vmap(lambda x: quant.quantize(x, fmt, **kw))(x3)
    return qv, jax.vmap(quant.dequantize)(qv)

  qv, dv = f(jnp.asarray(X3))
  dv = np.asarray(dv)
  for i in range(X3.shape[0]):
    qi = quant.quantize(jnp.asarray(X3[i]), fmt, **kw)
    O.assert_same_bits(np.asarray(qv.codes[i]), np.asarray(qi.codes), f"slice {i} codes")
    O.assert_same_bits(np.asarray(qv.scales[i]), np.asarray(qi.scales), f"slice {i} scales")
    if qi.tensor_scale is not None:
      O.assert_same_bits(np.asarray(qv.tensor_scale[i]), np.asarray(qi.tensor_scale), "ts")
    O.assert_same_bits(dv[i], np.asarray(quant.dequantize(qi)), f"slice {i} values")


def test_vmap_over_keys():
  keys = jax.random.split(jax.random.key(8), 3)
  x = jnp.asarray(X)
  ys = jax.jit(jax.vmap(lambda k: quant.fake_quant(x, "nvfp4", rounding="stochastic", key=k)))(keys)
  for i in range(3):
    O.assert_same_bits(np.asarray(ys[i]),
                       np.asarray(quant.fake_quant(x, "nvfp4", rounding="stochastic",
                                                   key=keys[i])), f"key {i}")
  assert not np.array_equal(np.asarray(ys[0]), np.asarray(ys[1]))


# ----------------------------------------------------------------------------- sharding

SHARD_CASES = [("mxfp4", "nearest_even", P(None, "d")), ("mxfp4", "stochastic", P("d", None)),
               ("nvfp4", "nearest_even", P(None, "d")), ("nvfp4", "stochastic", P("d", None)),
               ("nvfp4_16x16", "nearest_even", P(None, "d")),
               ("fp8_e4m3", "nearest_even", P(None, "d")),
               ("int8_channel", "toward_positive", P(None, "d"))]


@pytest.mark.parametrize("fmt,rounding,spec", SHARD_CASES)
def test_sharded_input_gives_identical_codes(fmt, rounding, spec):
  """An input sharded over the 8 CPU devices (by rows, or by columns so that blocks of 32,
  channels and the per-tensor amax span devices) quantizes to the same bits under jit."""
  devices = jax.devices()
  assert len(devices) == 8, "tests/conftest.py forces 8 CPU devices"
  mesh = Mesh(np.array(devices), ("d",))
  xs = jax.device_put(jnp.asarray(X), NamedSharding(mesh, spec))
  assert len(xs.sharding.device_set) == 8
  kw = _kw(rounding, seed=6)

  @jax.jit
  def f(x):
    q = quant.quantize(x, fmt, **kw)
    return q, quant.dequantize(q)

  q, d = f(xs)
  ref = quant.quantize(jnp.asarray(X), fmt, **kw)
  same_qarray(q, ref, "sharded")
  O.assert_same_bits(np.asarray(d), np.asarray(quant.dequantize(ref)), "sharded values")


# ----------------------------------------------------------------------------- Hadamard

def sylvester(n):
  h = np.array([[1.0]])
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  return h


def test_hadamard_known_h2_h4():
  h2 = np.asarray(quant.hadamard(jnp.eye(2, dtype=jnp.float32), 2), np.float64)
  np.testing.assert_allclose(h2, np.array([[1, 1], [1, -1]]) / np.sqrt(2), atol=1e-7)
  h4 = np.asarray(quant.hadamard(jnp.eye(4, dtype=jnp.float32), 4), np.float64)
  want = np.array([[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]]) / 2
  np.testing.assert_allclose(h4, want, atol=1e-7)


@pytest.mark.parametrize("n", [16, 64, 256])
def test_hadamard_is_orthogonal_with_signs(n):
  s = np.asarray(quant.random_signs(jax.random.key(n), n))
  m = np.asarray(quant.hadamard(jnp.eye(n, dtype=jnp.float32), n, signs=jnp.asarray(s)),
                 np.float64)
  # row j is the image of e_j: H[:, j] * s_j / sqrt(n)
  np.testing.assert_allclose(m, (sylvester(n) * s[None, :]).T / np.sqrt(n), atol=1e-6)
  np.testing.assert_allclose(m @ m.T, np.eye(n), atol=1e-5)
  inv = np.asarray(quant.hadamard(jnp.asarray(m, jnp.float32), n, signs=jnp.asarray(s),
                                  inverse=True), np.float64)
  np.testing.assert_allclose(inv, np.eye(n), atol=1e-5)


@pytest.mark.parametrize("axis", [-1, 0])
def test_hadamard_blocks_along_axis_and_inverse(axis):
  x = np.random.default_rng(3).standard_normal(CANON).astype(np.float32)
  b = 16
  s = np.asarray(quant.random_signs(jax.random.key(0), b), np.float64)
  y = np.asarray(quant.hadamard(jnp.asarray(x), b, axis=axis, signs=jnp.asarray(s, jnp.float32)),
                 np.float64)
  m = sylvester(b) * s[None, :] / np.sqrt(b)           # H diag(s) / sqrt(b)
  xm = np.moveaxis(x.astype(np.float64), axis, -1)
  want = np.einsum("ij,...kj->...ki", m, xm.reshape(xm.shape[:-1] + (-1, b)))
  want = np.moveaxis(want.reshape(xm.shape), -1, axis)
  np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
  back = np.asarray(quant.hadamard(jnp.asarray(y, jnp.float32), b, axis=axis,
                                   signs=jnp.asarray(s, jnp.float32), inverse=True))
  np.testing.assert_allclose(back, x, rtol=1e-5, atol=1e-5)
  # norms of every block are preserved
  yb = np.moveaxis(y, axis, -1).reshape(-1, b)
  xb = np.moveaxis(x, axis, -1).reshape(-1, b).astype(np.float64)
  np.testing.assert_allclose(np.linalg.norm(yb, axis=1), np.linalg.norm(xb, axis=1), rtol=1e-5)


def _numpy_butterflies(x, block, signs):
  """docs/numerics.md §7 in float32 numpy: signs, the butterfly levels h = 1, 2, ... one at a
  time (fl(a + b), fl(a - b)), fl(1 / sqrt(block)), zeros made +0."""
  v = (x * signs).reshape(x.shape[:-1] + (-1, block)).astype(np.float32)
  h = 1
  while h < block:
    g = v.reshape(v.shape[:-1] + (block // (2 * h), 2, h))
    a, b = g[..., 0, :].copy(), g[..., 1, :].copy()
    g[..., 0, :], g[..., 1, :] = a + b, a - b
    v = g.reshape(v.shape)
    h *= 2
  y = v * np.float32(1.0 / np.sqrt(float(block)))
  y[y == 0] = 0.0
  return y.reshape(x.shape)


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("passes", [(1,), (1, 2), (2,), (3, 2), (5,)])
@pytest.mark.parametrize("block", [2, 16, 32, 128])
def test_hadamard_bits_do_not_depend_on_levels_per_pass(monkeypatch, passes, block, axis):
  """Grouping butterfly levels into passes (one fusion each) computes the same additions in the
  same order: bit-identical to the levels one at a time, for any grouping, along the last axis
  and along an inner axis (transformed in place, rows of contiguous elements)."""
  from lpjax.quant.schemes import hadamard as _hadamard
  monkeypatch.setattr(_hadamard, "_LEVELS_PER_PASS", passes)
  monkeypatch.setattr(_hadamard, "_LEVELS_PER_PASS_INNER", passes)
  rng = np.random.default_rng(block)
  x = (rng.standard_normal((6, 2 * block)) * 2.0**rng.integers(-20, 20, (6, 2 * block)))
  x = x.astype(np.float32)
  x[0, :block] = x[0, 0]  # a block of equal values: exact zeros, whose sign must be +0
  x[1, 3] = -0.0
  s = np.asarray(quant.random_signs(jax.random.key(block), block))
  want = _numpy_butterflies(x, block, np.tile(s, 2))
  if axis == 0:  # the same blocks, laid out down the columns of a (2 block, 6) array
    got = jax.jit(lambda v: quant.hadamard(v, block, axis=0, signs=s))(jnp.asarray(x.T.copy()))
    got = np.asarray(got).T
  else:
    got = np.asarray(jax.jit(lambda v: quant.hadamard(v, block, signs=s))(jnp.asarray(x)))
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_hadamard_leaves_products_unchanged():
  """Applied to both operands along the contraction axis, the RHT cancels (docs/numerics.md §7)."""
  rng = np.random.default_rng(4)
  a = rng.standard_normal(CANON).astype(np.float32)
  b = rng.standard_normal(CANON).astype(np.float32)
  s = quant.random_signs(jax.random.key(1), 32)
  ha = np.asarray(quant.hadamard(jnp.asarray(a), 32, signs=s), np.float64)
  hb = np.asarray(quant.hadamard(jnp.asarray(b), 32, signs=s), np.float64)
  np.testing.assert_allclose(ha @ hb.T, a.astype(np.float64) @ b.T.astype(np.float64),
                             rtol=1e-4, atol=1e-4)
  # and it spreads an outlier: one spike becomes 32 entries of equal magnitude
  spike = np.zeros(CANON, np.float32)
  spike[0, 5] = 32.0
  hs = np.asarray(quant.hadamard(jnp.asarray(spike), 32, signs=s))
  np.testing.assert_allclose(np.abs(hs[0, :32]), np.full(32, 32 / np.sqrt(32)), rtol=1e-6)


def test_random_signs():
  n = 4096
  s = np.asarray(quant.random_signs(jax.random.key(0), n))
  assert s.shape == (n,) and s.dtype == np.float32
  assert set(np.unique(s)) == {-1.0, 1.0}
  assert abs(s.mean()) < 5 / np.sqrt(n)
  np.testing.assert_array_equal(s, np.asarray(quant.random_signs(jax.random.key(0), n)))
  t = np.asarray(quant.random_signs(jax.random.key(1), n))
  assert 0.4 < np.mean(s == t) < 0.6
