"""Quantized dot_general / einsum: every GEMM of every preset against an explicit numpy computation
(the reference: gemm_reference.py)."""

import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

sys.path.insert(0, os.path.dirname(__file__))
from gemm_reference import _assert_close, ref_gemms, ref_rotate, ref_signs  # noqa: E402

from lpjax.quant.gemm import operand as opq  # noqa: E402
from lpjax.quant import recipes  # noqa: E402
from lpjax.quant.gemm.einsum import einsum  # noqa: E402
from lpjax.quant.gemm.dot_general import dot_general, operand_stats  # noqa: E402
from lpjax.quant.recipes.gemm_recipe import GemmRecipe, OperandQuant  # noqa: E402

DN2 = (((1,), (0,)), ((), ()))
# Shapes chosen so that every RHT pads (M=48, N=80 are not multiples of 32/64) and tiles fit (16).
M, K, N = 48, 96, 80


def _normal(seed, shape, scale=1.0):
  return np.asarray(jax.random.normal(jax.random.key(seed), shape), np.float32) * np.float32(scale)


def _vjp_fn(recipe):
  @jax.jit
  def f(x, w, dy, key):
    y, vjp = jax.vjp(lambda x, w: dot_general(x, w, DN2, recipe, key=key), x, w)
    return (y,) + vjp(dy)
  return f


# --- tests -------------------------------------------------------------------------------------


# residuals="quantized" is compared on every kind of residual (packed MX with RHT and SR, per-tensor
# fp8, SSP reuse of the forward operands, high precision); the NVFP4-scaled presets only add
# compile time (the same code path as mxfp4 with another format).
RESIDUAL_CHECKS = ("bf16", "fp8", "mxfp4", "mxfp4_bwd", "mxfp4_naive", "ssp_fp4", "ssp_int4")


# Plus QuEST with a high-precision backward (the QAF phase, `gemms=fwd`): still the rotated domain.
@pytest.mark.parametrize("name", recipes.NAMES + ("quartet:gemms=fwd",))
def test_every_gemm_uses_the_recipe_operands(name):
  """Y, dX and dW of each preset equal the numpy products of the operands the recipe names,
  and residuals="quantized" gives bit-identical gradients (same quantizers, same keys)."""
  recipe = recipes.get(name)
  x, w, dy = _normal(0, (M, K)), _normal(1, (K, N), 0.1), _normal(2, (M, N), 1e-3)
  key = jax.random.key(7)
  y, dx, dw = _vjp_fn(recipe)(x, w, dy, key)
  ry, rdx, rdw = ref_gemms(x, w, dy, recipe, key)
  _assert_close(y, ry, f"{name} fwd")
  _assert_close(dx, rdx, f"{name} dgrad")
  _assert_close(dw, rdw, f"{name} wgrad")
  if not recipe.is_high_precision:  # the quantization is visible
    assert np.abs(np.asarray(y) - x @ w).max() > 1e-4
  if name not in RESIDUAL_CHECKS:
    return
  yq, dxq, dwq = _vjp_fn(dataclasses.replace(recipe, residuals="quantized"))(x, w, dy, key)
  np.testing.assert_array_equal(np.asarray(yq), np.asarray(y))
  np.testing.assert_array_equal(np.asarray(dxq), np.asarray(dx))
  np.testing.assert_array_equal(np.asarray(dwq), np.asarray(dw))


DNS = {
    "2d": ((6, 40), (40, 24), DN2),
    "batched": ((3, 6, 40), (3, 40, 24), (((2,), (1,)), ((0,), (0,)))),
    "two_contracting_transposed": ((5, 8, 6), (6, 4, 5, 7), (((0, 2), (2, 0)), ((), ()))),
    "batch_last": ((40, 6, 3), (24, 40, 3), (((0,), (1,)), ((2,), (2,)))),
}


@pytest.mark.parametrize("case", sorted(DNS))
def test_all_none_recipe_equals_plain_jnp_exactly(case):
  lhs_shape, rhs_shape, dn = DNS[case]
  x, w = _normal(3, lhs_shape), _normal(4, rhs_shape)
  dy = _normal(5, jax.eval_shape(lambda: jax.lax.dot_general(x, w, dn)).shape)

  def run(fn):
    y, vjp = jax.vjp(fn, x, w)
    return (y,) + vjp(dy)

  got = jax.jit(lambda: run(lambda a, b: dot_general(a, b, dn, GemmRecipe())))()
  want = jax.jit(lambda: run(lambda a, b: jax.lax.dot_general(a, b, dn)))()
  for i, (g, r) in enumerate(zip(got, want)):
    assert g.shape == r.shape and g.dtype == r.dtype
    if case == "two_contracting_transposed" and i > 0:
      # jax's transpose rule contracts the two original axes in place, we contract a flattened,
      # transposed copy; XLA:CPU then picks another summation order (differences of 1 ulp).
      np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=2e-6, atol=2e-6)
    else:
      np.testing.assert_array_equal(np.asarray(g), np.asarray(r))


def test_general_dimension_numbers_equal_the_flattened_2d_gemm():
  """(B, S, D) x (D, F) quantized with SR equals the (B*S, D) x (D, F) GEMM bit for bit."""
  recipe = recipes.get("mxfp4")
  x3, w = _normal(6, (2, 24, 64)), _normal(7, (64, 32))
  key = jax.random.key(1)

  @jax.jit
  def both(x3, w):
    f3 = lambda x3, w: jnp.sum(dot_general(x3, w, (((2,), (0,)), ((), ())), recipe, key=key) ** 2)
    f2 = lambda x3, w: jnp.sum(dot_general(x3.reshape(48, 64), w, DN2, recipe, key=key) ** 2)
    return jax.grad(f3, (0, 1))(x3, w), jax.grad(f2, (0, 1))(x3, w)

  (a, b), (c, d) = both(x3, w)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
  np.testing.assert_array_equal(np.asarray(b), np.asarray(d))


@pytest.mark.parametrize("block,k", [
    (16, 64),
    (32, 80),
    (64, 100),  # 100: zero padding to 128
])
def test_rht_leaves_the_product_unchanged_in_float64(block, k):
  with jax.enable_x64(True):
    rng = np.random.default_rng(block)
    a = rng.standard_normal((7, k))
    b = rng.standard_normal((k, 5))
    signs = ref_signs(jax.random.key(3), "wgrad", block)
    ra = opq.rotate(jnp.asarray(a), block, -1, jnp.asarray(signs, jnp.float64))
    rb = opq.rotate(jnp.asarray(b), block, 0, jnp.asarray(signs, jnp.float64))
    assert ra.dtype == jnp.float64 and ra.shape[-1] % block == 0
    assert np.abs(np.asarray(ra)[:, :k] - a).max() > 0.1  # it did transform
    np.testing.assert_allclose(np.asarray(ra @ rb), a @ b, rtol=0, atol=1e-12)
    # and it is the H D transform of the numpy reference
    np.testing.assert_allclose(np.asarray(ra), ref_rotate(a, block, signs), atol=1e-12)


def test_16x16_weight_tiles_quantize_transpose_invariantly():
  """Q(W)^T == Q(W^T): the forward's W (quantized as W^T along K) equals the dgrad's W."""
  w = _normal(8, (K, N))
  key = jax.random.key(0)
  recipe = recipes.get("nvfp4")
  from lpjax.quant.gemm import pass_operands

  axes = {}

  @jax.jit
  def operands(w):
    fwd_w, axes["fwd"] = pass_operands.fwd_operand(w, 1, key, recipe)
    dgrad_w, axes["dgrad"] = pass_operands.pass_operand(w, "dgrad", 1, -1, key, recipe)
    return fwd_w, dgrad_w

  fwd_w, dgrad_w = operands(jnp.asarray(w))
  assert axes == {"fwd": -1, "dgrad": -1} and fwd_w.shape == (N, K)
  np.testing.assert_array_equal(np.asarray(fwd_w).T, np.asarray(dgrad_w))
  # the property itself, on the core format: 1x16 blocks do not have it
  fq = jax.jit(lambda a, f: opq.fake(a, OperandQuant(f), axis=-1, key=None), static_argnums=1)
  qt = lambda a, f: np.asarray(fq(jnp.asarray(a), f))
  np.testing.assert_array_equal(qt(w, "nvfp4_16x16").T, qt(w.T, "nvfp4_16x16"))
  assert not np.array_equal(qt(w, "nvfp4").T, qt(w.T, "nvfp4"))


def test_sr_gradients_are_unbiased_over_keys():
  """Mean over keys of SR gradients -> the exact gradients; RTN's error does not average out."""
  x, w, dy = _normal(9, (32, 64)), _normal(10, (64, 32)), _normal(11, (32, 32))
  exact_dx, exact_dw = dy @ w.T, x.T @ dy
  keys = jax.random.split(jax.random.key(0), 512)
  rel = lambda g, e: float(np.sum((np.asarray(g, np.float64) - e) ** 2) / np.sum(e**2))
  nv_sr = OperandQuant("nvfp4", rounding="stochastic", hadamard_block=16)
  cases = {
      # all four backward operands SR (independent keys), RHT-64, 3/4 pre-scale
      "mxfp4_bwd": recipes.get("mxfp4_bwd"),
      # NVFP4 SR on dY only, the other operand in high precision (RHT-16 on both)
      "nvfp4_dy": GemmRecipe(dgrad=(nv_sr, None), wgrad=(None, nv_sr)),
  }
  for name, recipe in cases.items():
    recipe = dataclasses.replace(recipe, compute_dtype=jnp.float32)

    @jax.jit
    @jax.vmap
    def grads(key):
      _, vjp = jax.vjp(lambda x, w: dot_general(x, w, DN2, recipe, key=key), x, w)
      return vjp(dy)

    dxs, dws = grads(keys)
    for g, exact, what in ((dxs, exact_dx, "dgrad"), (dws, exact_dw, "wgrad")):
      one = rel(g[0], exact)
      mean = rel(np.mean(np.asarray(g, np.float64), 0), exact)
      assert one > 1e-3, (name, what, one)  # each sample is noisy...
      assert mean < one / 100, (name, what, one, mean)  # ...its mean is not: ~one / 512 if unbiased
  naive = dataclasses.replace(recipes.get("mxfp4_naive"), compute_dtype=jnp.float32)
  _, vjp = jax.vjp(lambda x, w: dot_general(x, w, DN2, naive), x, w)
  assert rel(vjp(dy)[1], exact_dw) > 1e-3  # RTN: a fixed error, the same for every key


@pytest.mark.parametrize("name", ["mxfp4_naive", "mxfp4"])
def test_mxfp4_gemm_relative_error_k4096(name):
  x, w = _normal(12, (32, 4096)), _normal(13, (4096, 32))
  y = jax.jit(lambda x, w: dot_general(x, w, DN2, name, key=jax.random.key(0)))(x, w)
  exact = x.astype(np.float64) @ w
  err = float(np.sum((np.asarray(y, np.float64) - exact) ** 2) / np.sum(exact**2))
  assert 1e-2 <= err <= 6e-2, err


def test_sharded_dot_general_equals_single_device():
  assert jax.device_count() == 8
  mesh = Mesh(np.array(jax.devices()), ("data",))
  recipe = recipes.get("mxfp4")  # SR + RHT: the random bits must not depend on the sharding
  x, w = _normal(14, (64, 96)), _normal(15, (96, 32))
  key = jax.random.key(5)

  def loss(x, w):
    return jnp.sum(jnp.sin(dot_general(x, w, DN2, recipe, key=key)))

  f = jax.jit(jax.value_and_grad(loss, (0, 1)))
  xs = jax.device_put(x, NamedSharding(mesh, P("data", None)))
  ws = jax.device_put(w, NamedSharding(mesh, P()))
  (l8, (dx8, dw8)) = f(xs, ws)
  assert len(dx8.sharding.device_set) == 8
  with jax.default_device(jax.devices()[0]):
    (l1, (dx1, dw1)) = f(jax.device_put(x, jax.devices()[0]), jax.device_put(w, jax.devices()[0]))
  # The loss sums 2048 terms of |sin| <= 1 in a per-device order: float32 round-off of that sum
  # (~2048 x 2^-24 ~ 1e-4) is far below the O(1) change that other RHT signs or SR bits make.
  # (rtol=1e-6 on this cancelling sum failed by 1.6e-6, on the commit before too.) dX below
  # pins the bits exactly.
  np.testing.assert_allclose(float(l8), float(l1), rtol=0, atol=2e-4)
  np.testing.assert_array_equal(np.asarray(dx8), np.asarray(dx1))  # no cross-device reduction
  np.testing.assert_allclose(np.asarray(dw8), np.asarray(dw1), rtol=1e-5, atol=1e-6)  # sum over M


def test_quantized_residuals_keep_packed_codes_not_the_operands():
  """residuals="quantized" saves uint8 codes (the packed column-wise copies), not fp32 X and W."""
  from jax._src.ad_checkpoint import saved_residuals

  x, w = jnp.asarray(_normal(16, (64, 128))), jnp.asarray(_normal(17, (128, 64)))
  key = jax.random.key(0)

  def saved(residuals):
    recipe = dataclasses.replace(recipes.get("mxfp4_naive"), residuals=residuals)
    res = saved_residuals(lambda x, w: dot_general(x, w, DN2, recipe, key=key), x, w)
    return [(tuple(a.shape), a.dtype) for a, _ in res]

  hp = saved("high_precision")
  assert ((64, 128), jnp.float32) in hp and ((128, 64), jnp.float32) in hp
  q = saved("quantized")
  assert all(dt != jnp.float32 or int(np.prod(s)) < 64 * 128 / 8 for s, dt in q), q
  # X^T (K, M) packed along M and W (K, N) packed along N: 64 / 2 bytes per row each
  assert q.count(((128, 32), jnp.uint8)) == 2, q


@pytest.mark.parametrize("subscripts,shapes", [
    ("bsd,df->bsf", ((2, 5, 32), (32, 24))),
    ("bhqd,bhkd->bhqk", ((2, 3, 5, 32), (2, 3, 7, 32))),
    ("...d,fd->...f", ((2, 3, 32), (24, 32))),
    ("ij,jk", ((6, 32), (32, 8))),
    ("bij,bjk->bki", ((2, 6, 32), (2, 32, 8))),
])
def test_einsum_matches_jnp_einsum(subscripts, shapes):
  a, b = _normal(18, shapes[0]), _normal(19, shapes[1])
  got = jax.jit(lambda a, b: einsum(subscripts, a, b, recipe=GemmRecipe()))(a, b)
  want = jnp.einsum(subscripts, a, b)
  assert got.shape == want.shape
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_einsum_quantizes_like_dot_general():
  a, b = _normal(20, (2, 5, 64)), _normal(21, (32, 64))
  key = jax.random.key(2)
  got = jax.jit(lambda a, b: einsum("bsd,fd->bsf", a, b, recipe="nvfp4", key=key))(a, b)
  want = jax.jit(lambda a, b: dot_general(a, b, (((2,), (1,)), ((), ())), "nvfp4", key=key))(a, b)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_keys_and_errors():
  x, w = _normal(22, (4, 32)), _normal(23, (32, 8))
  with pytest.raises(ValueError, match="key"):
    dot_general(x, w, DN2, "mxfp4")  # SR without a key
  with pytest.raises(ValueError, match="Did you mean 'mxfp4'"):
    dot_general(x, w, DN2, "mxpf4")
  with pytest.raises(ValueError, match="differ in size"):
    dot_general(x, w.T, DN2, "bf16")
  raw = jax.random.PRNGKey(3)  # raw uint32 keys work like typed keys with the same data
  f = jax.jit(lambda x, w, k: dot_general(x, w, DN2, "mxfp4", key=k))
  a = f(x, w, raw)
  b = f(x, w, jax.random.wrap_key_data(raw))
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_operand_stats_measure_the_quantizer():
  x, w = _normal(24, (64, 128)), _normal(25, (128, 32))
  stats = jax.jit(operand_stats, static_argnums=(2, 3))
  floor = stats(x, w, DN2, "mxfp4_naive")
  assert 15 < float(floor["lhs"]["snr_db"]) < 22  # MXFP4 RTN on N(0,1): ~18.8 dB
  assert float(floor["lhs"]["frac_saturated"]) > 0.005  # the OCP floor scale clips block maxima
  assert float(floor["lhs"]["amax"]) == np.abs(x).max()
  rceil = GemmRecipe(fwd=(OperandQuant("mxfp4", scale_mode="rceil"),) * 2)
  assert float(stats(x, w, DN2, rceil)["lhs"]["frac_saturated"]) == 0.0  # never clips
  ones = np.ones((64, 128), np.float32)
  ones[0, :32] = 1e-30  # blocks far below the tensor amax: NVFP4 flushes them (s_b = 0)
  nv = stats(ones, w, DN2, "nvfp4")
  assert float(nv["lhs"]["frac_flushed"]) == 32 / ones.size
  assert float(nv["lhs"]["frac_saturated"]) == 0.0
  assert set(stats(x, w, DN2, "mxfp4_bwd")) == set()  # forward unquantized: nothing to measure
