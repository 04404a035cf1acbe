"""Quantized dot_general / einsum: every GEMM of every preset against an explicit numpy computation.

The reference (`ref_operand`, `ref_gemms`) re-derives the recipe contract independently: operand
layout (contraction axis last), key derivation (fold_in by GEMM and operand), RHT signs, zero
padding, the 3/4 SR pre-scale, and the quantizers of the numpy oracle (tests/quant/numpy_oracle.py);
the GEMMs are float64 numpy products of the compute-dtype operands.
"""

import dataclasses
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
import nvfp4_scheme_oracle as S  # noqa: E402

from lpjax.quant import _operand as opq  # noqa: E402
from lpjax.quant import recipes, _ssp as ssp  # noqa: E402
from lpjax.quant._einsum import einsum  # noqa: E402
from lpjax.quant._gemm import dot_general, operand_stats  # noqa: E402
from lpjax.quant._hadamard import hadamard, random_signs  # noqa: E402
from lpjax.quant._quantize import random_bits  # noqa: E402
from lpjax.quant._gemm_recipe import REUSE_FWD, GemmRecipe, OperandQuant  # noqa: E402

DN2 = (((1,), (0,)), ((), ()))
GEMM_ID = {"fwd": 0, "dgrad": 1, "wgrad": 2}
# Shapes chosen so that every RHT pads (M=48, N=80 are not multiples of 32/64) and tiles fit (16).
M, K, N = 48, 96, 80


def _normal(seed, shape, scale=1.0):
  return np.asarray(jax.random.normal(jax.random.key(seed), shape), np.float32) * np.float32(scale)


# --- the numpy reference ------------------------------------------------------------------------


def _oracle_fmt(fmt):
  if isinstance(fmt, str):
    return fmt
  return O.Fmt(fmt.element.name, fmt.scale, fmt.block_size or 0, fmt.granularity, fmt.tile,
               fmt.tensor_scale)


def _sylvester(n):
  h = np.ones((1, 1))
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  return h


def ref_signs(key, gemm, block):
  base = jax.random.key(0x5EED) if key is None else key
  return np.asarray(random_signs(jax.random.fold_in(jax.random.fold_in(base, GEMM_ID[gemm]), 2), block))


def ref_rotate(x, block, signs):
  """RHT along the last axis of x (zero-padded to a multiple of block), float64 numpy."""
  x = np.asarray(x, np.float64)
  pad = (-x.shape[-1]) % block
  x = np.concatenate([x, np.zeros(x.shape[:-1] + (pad,))], -1) if pad else x
  xb = x.reshape(x.shape[:-1] + (-1, block)) * signs
  return (xb @ _sylvester(block).T / np.sqrt(block)).reshape(x.shape)


def ref_operand(x, op, key, gemm, side, block):
  """Values a GEMM operand takes (float32), x's contraction axis last."""
  x = np.asarray(x, np.float32)
  if block:
    # The transform itself is the core's (tested in float64 in test_rht_*); the quantization
    # must see its exact float32 result.
    pad = (-x.shape[-1]) % block
    xp = np.concatenate([x, np.zeros(x.shape[:-1] + (pad,), np.float32)], -1) if pad else x
    quest = gemm == "fwd" and getattr(op, "scheme", None) == "quest"  # Quartet: no random signs
    signs = np.ones(block, np.float32) if quest else ref_signs(key, gemm, block)
    x = np.asarray(hadamard(jnp.asarray(xp), block, signs=jnp.asarray(signs)))
  if op is None:
    return x
  if op.scheme == "quest":
    return S.quest(x, op.format.block_size)[0]
  if op.scheme:
    k = jax.random.fold_in(jax.random.fold_in(key, GEMM_ID[gemm]), side) if key is not None else None
    if op.scheme == "four_over_six":
      return S.four_over_six(x, tile=op.format.tile, rounding=op.rounding, key=k)
    return S.ms_eden(x, group=op.hadamard_block, key=k)
  if op.sr_prescale is not None:
    x = x * np.float32(op.sr_prescale)
  if op.is_ssp:
    q = np.asarray(ssp.quantize_ssp(jnp.asarray(x), op.fmt))
  else:
    rbits = None
    if op.rounding == "stochastic":
      k = jax.random.fold_in(jax.random.fold_in(key, GEMM_ID[gemm]), side)
      rbits = np.asarray(random_bits(k, x.shape))
    q = O.quantize(x, _oracle_fmt(op.fmt), axis=-1, rounding=op.rounding, scale_mode=op.scale_mode,
                   rbits=rbits)["values"]
  if op.sr_prescale is not None:
    q = q / np.float32(op.sr_prescale)
  return q.astype(np.float32)


def _c(a, recipe):
  """Cast to the compute dtype and widen to float64 for the reference product."""
  a = np.asarray(a, np.float32)
  if recipe.compute_dtype == jnp.bfloat16:
    a = a.astype(ml_dtypes.bfloat16)
  return a.astype(np.float64)


def ref_gemms(x, w, dy, recipe, key):
  """(Y, dX, dW) of Y = X W per the recipe, X (M, K), W (K, N), dY (M, N)."""
  r = recipe
  fx = ref_operand(x, r.fwd.lhs, key, "fwd", 0, r.fwd.hadamard_block)
  fw_t = ref_operand(w.T, r.fwd.rhs, key, "fwd", 1, r.fwd.hadamard_block)  # W^T: K last
  y = _c(fx, r) @ _c(fw_t, r).T
  b = r.dgrad.hadamard_block
  a = ref_operand(dy, r.dgrad.lhs, key, "dgrad", 0, b)
  if r.dgrad.rhs == REUSE_FWD:
    wq = ref_operand(w.T, r.fwd.rhs, key, "fwd", 1, None).T  # forward's Q(W), unrotated
    bw = ref_operand(wq, None, key, "dgrad", 1, b)
  elif getattr(r.dgrad.rhs, "from_fwd", False) or (r.dgrad.rhs is None and r.trust_masked):
    # re-quantize (or, QuEST with a high-precision backward, use) the forward's Q(W)
    wq = _c(fw_t, r).astype(np.float32).T
    bw = ref_operand(wq, r.dgrad.rhs, key, "dgrad", 1, b)
  else:
    bw = ref_operand(w, r.dgrad.rhs, key, "dgrad", 1, b)
  dx = _c(a, r) @ _c(bw, r).T
  b = r.wgrad.hadamard_block
  if r.wgrad.lhs == REUSE_FWD:
    xq = ref_operand(x, r.fwd.lhs, key, "fwd", 0, None)
    ax = ref_operand(xq.T, None, key, "wgrad", 0, b)
  elif getattr(r.wgrad.lhs, "from_fwd", False) or (r.wgrad.lhs is None and r.trust_masked):
    xq = _c(fx, r).astype(np.float32)
    ax = ref_operand(xq.T, r.wgrad.lhs, key, "wgrad", 0, b)
  else:
    ax = ref_operand(x.T, r.wgrad.lhs, key, "wgrad", 0, b)
  bdy = ref_operand(dy.T, r.wgrad.rhs, key, "wgrad", 1, b)
  dw = _c(ax, r) @ _c(bdy, r).T
  if r.trust_masked:  # QuEST: gradients in the rotated domain -> trust mask -> rotate back
    b, ones = r.fwd.hadamard_block, np.ones(r.fwd.hadamard_block)
    rotated = lambda a: np.asarray(hadamard(jnp.asarray(np.pad(a, [(0, 0), (0, (-K) % b)])), b))
    mask_x, mask_w = S.quest(rotated(x), 32)[1], S.quest(rotated(w.T), 32)[1]
    dx = ref_rotate(dx * mask_x, b, ones)[:, :K]
    dw = ref_rotate(dw.T * mask_w, b, ones)[:, :K].T
  return y, dx, dw


def _vjp_fn(recipe):
  @jax.jit
  def f(x, w, dy, key):
    y, vjp = jax.vjp(lambda x, w: dot_general(x, w, DN2, recipe, key=key), x, w)
    return (y,) + vjp(dy)
  return f


def _assert_close(got, ref, what):
  got = np.asarray(got, np.float64)
  scale = np.max(np.abs(ref))
  np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5 * scale, err_msg=what)


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
  from lpjax.quant import _gemm as gemm

  axes = {}

  @jax.jit
  def operands(w):
    fwd_w, axes["fwd"] = gemm._fwd_operand(w, 1, key, recipe)
    dgrad_w, axes["dgrad"] = gemm._operand(w, "dgrad", 1, -1, key, recipe)
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
