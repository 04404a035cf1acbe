"""The FP4 GEMM kernel (lpjax/pallas/_fp4_gemm.py) against independent numpy references
(tests/pallas/fp4_gemm_reference.py), none of which runs lpjax's kernel code:
- `np_partials`: every block's partial sum in int64 from the packed bytes (nibbles decoded by the
  E2M1 table of docs/numerics.md §1);
- `np_sequential`: the kernel's contract in numpy: exact block products (float64, then float32,
  where the value is a normal float32 number), added in float32 in block order;
- the float64 GEMM of lpjax's dequantized operands, within float32 accumulation error.
Interpret mode on CPU (`INTERPRET = True`); with a GPU, `LPJAX_TEST_GPU=1` runs `TestCompiled`.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax import pallas, quant
from lpjax.pallas import _fp4_gemm as fg
from lpjax.quant import recipes

from tests.pallas.fp4_gemm_reference import (EPS32, assert_within_f32_accumulation, e2m1_exact,
                                             np_float64, np_partials, np_sequential,
                                             np_tensor_factor, quantized)
from tests.pallas.pallas_data import ON_GPU

FORMATS = ["mxfp4", "nvfp4"]
SHAPES = [(1, 1, 16), (5, 19, 70), (37, 45, 96), (16, 16, 33)]


class TestInterpret:
  INTERPRET = True

  def setup_method(self):
    if not self.INTERPRET and not ON_GPU:
      pytest.skip("the compiled kernel needs a GPU (LPJAX_TEST_GPU=1)")

  def mm(self, a, b, **kw):
    return pallas.fp4_matmul(a, b, interpret=self.INTERPRET, **kw)

  @pytest.mark.parametrize("fmt", FORMATS)
  @pytest.mark.parametrize("m,n,k", SHAPES)
  def test_block_partials_equal_int64(self, fmt, m, n, k):
    qa, qb = quantized((m, k), fmt, 1), quantized((n, k), fmt, 2)
    got = pallas.fp4_block_partials(qa, qb, interpret=self.INTERPRET)
    want = np_partials(qa, qb)
    assert got.dtype == jnp.int32 and got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got, np.int64), want)
    assert np.abs(want).max() <= qa.fmt.block_size * 144

  def test_block_partials_reach_the_bound(self):
    # All codes +-6 (2a = 12): every partial sum is exactly +-32 * 144 = 4608, still int32-exact.
    x = jnp.full((16, 64), 6.0).at[::2].set(-6.0)
    qa, qb = quant.quantize(x, "mxfp4", impl="xla"), quant.quantize(jnp.full((16, 64), 6.0), "mxfp4")
    for dot_dtype in fg.DOT_DTYPES:
      got = np.asarray(pallas.fp4_block_partials(qa, qb, interpret=self.INTERPRET,
                                                 dot_dtype=dot_dtype))
      assert set(np.unique(got)) == {-4608, 4608}

  @pytest.mark.parametrize("fmt", FORMATS)
  @pytest.mark.parametrize("m,n,k", SHAPES)
  def test_equals_sequential_float32_of_exact_block_products(self, fmt, m, n, k):
    qa = quantized((m, k), fmt, 3, zero_rows=(0,), exponents=(-12, 12))
    qb = quantized((n, k), fmt, 4, exponents=(-12, 12))
    y = self.mm(qa, qb, tile=(16, 16))  # several tiles along M and N
    np.testing.assert_array_equal(np.asarray(y), np_sequential(qa, qb))
    assert_within_f32_accumulation(y, qa, qb)

  @pytest.mark.parametrize("fmt", FORMATS)
  @pytest.mark.parametrize("name,kw", [
      ("tiny", dict(scale=2.0**-50, exponents=(-8, 8))),
      ("large", dict(scale=2.0**50, exponents=(-8, 8))),
      ("spread", dict(exponents=(-30, 30))),
  ])
  def test_scales_tiny_large_and_spread(self, fmt, name, kw):
    qa, qb = quantized((20, 200), fmt, 5, **kw), quantized((24, 200), fmt, 6, **kw)
    y = self.mm(qa, qb)
    np.testing.assert_array_equal(np.asarray(y), np_sequential(qa, qb))
    assert_within_f32_accumulation(y, qa, qb)

  def test_mxfp4_asymmetric_scales(self):
    # Values near 2^100 times values near 2^-100: ordinary products of extreme operands.
    qa = quantized((16, 96), "mxfp4", 27, scale=2.0**100, exponents=(-8, 8))
    qb = quantized((24, 96), "mxfp4", 28, scale=2.0**-100, exponents=(-8, 8))
    y = self.mm(qa, qb)
    np.testing.assert_array_equal(np.asarray(y), np_sequential(qa, qb))
    assert_within_f32_accumulation(y, qa, qb)

  def test_mxfp4_scale_products_past_float32_range(self):
    # Every block scale 2^70 x 2^70 (the products' scale 2^140 is past FLT_MAX): orthogonal
    # blocks (P = 0) still add exactly 0, never 0 x inf = NaN; overlapping ones overflow to inf,
    # as the float64 value does in float32.
    x = np.zeros((16, 64), np.float32)
    x[:, 0::32] = 2.0**72
    w = np.zeros((32, 64), np.float32)
    w[:16, 1::32] = 2.0**72  # rows 0..15: orthogonal to x
    w[16:, 0::32] = 2.0**72  # rows 16..31: the same position
    qa, qb = (quant.quantize(jnp.asarray(v), "mxfp4", impl="xla") for v in (x, w))
    y = np.asarray(self.mm(qa, qb))
    assert np.all(y[:, :16] == 0) and np.all(y[:, 16:] == np.inf)

  def test_mxfp4_products_below_float32_range_flush_as_float32_does(self):
    # Scales 2^-70 x 2^-70: every product is below 2^-126; the float32 result is 0 (or a
    # subnormal), within float32's absolute resolution of the float64 value.
    qa = quantized((16, 64), "mxfp4", 7, scale=2.0**-68, exponents=(0, 1))
    qb = quantized((16, 64), "mxfp4", 8, scale=2.0**-68, exponents=(0, 1))
    y = np.asarray(self.mm(qa, qb))
    ref, _ = np_float64(qa, qb)
    assert np.abs(ref).max() > 0 and np.all(np.abs(y - ref) <= 2.0**-126)

  @pytest.mark.parametrize("fmt", FORMATS)
  def test_zeros(self, fmt):
    qa = quant.quantize(jnp.zeros((16, 64)), fmt, impl="xla")
    qb = quantized((16, 64), fmt, 9)
    y = self.mm(qa, qb)
    assert np.all(np.asarray(y) == 0)

  def test_nvfp4_per_tensor_scales_apply_once(self):
    qa = quantized((16, 48), "nvfp4", 10, scale=1e-3)
    qb = quantized((32, 48), "nvfp4", 11, scale=3e4)
    assert float(qa.tensor_scale) != float(qb.tensor_scale)
    y = self.mm(qa, qb)
    np.testing.assert_array_equal(np.asarray(y), np_sequential(qa, qb))
    assert_within_f32_accumulation(y, qa, qb)
    # Without the per-tensor factor the result would be off by g_a g_b.
    assert abs(float(np_tensor_factor(qa, qb)) - 1) > 0.5

  def test_nvfp4_16x16_tiles_pair_with_rows(self):
    qa = quantized((19, 70), "nvfp4", 12)
    qb = quant.quantize(jax.random.normal(jax.random.key(0), (40, 70)), "nvfp4_16x16", impl="xla")
    y = self.mm(qa, qb)
    np.testing.assert_array_equal(np.asarray(y), np_sequential(qa, qb))
    assert_within_f32_accumulation(y, qa, qb)

  def test_nan_block_makes_its_outputs_nan(self):
    x = np.ones((16, 64), np.float32)
    x[3, 40] = np.nan
    qa = quant.quantize(jnp.asarray(x), "mxfp4", impl="xla")
    y = np.asarray(self.mm(qa, quantized((16, 64), "mxfp4", 13)))
    assert np.isnan(y[3]).all() and not np.isnan(np.delete(y, 3, 0)).any()

  @pytest.mark.parametrize("fmt", FORMATS)
  def test_dot_dtypes_and_bf16_output(self, fmt):
    qa, qb = quantized((16, 96), fmt, 14), quantized((32, 96), fmt, 15)
    y = self.mm(qa, qb, dot_dtype="int8")
    for dot_dtype in ("bfloat16", "float8_e4m3fn"):
      np.testing.assert_array_equal(np.asarray(self.mm(qa, qb, dot_dtype=dot_dtype)), np.asarray(y))
    yb = self.mm(qa, qb, out_dtype=jnp.bfloat16)
    assert yb.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(yb), np.asarray(y.astype(jnp.bfloat16)))

  def test_batched(self):
    qa = quantized((3, 9, 64), "mxfp4", 16)
    qb = quantized((3, 17, 64), "mxfp4", 17)
    y = self.mm(qa, qb)
    assert y.shape == (3, 9, 17)
    np.testing.assert_array_equal(np.asarray(y), np_sequential(qa, qb))

  @pytest.mark.parametrize("fmt", FORMATS)
  def test_dot_general_transposes_and_batch_dims(self, fmt):
    # lhs (K, M) blocked along axis 0 (transposed), rhs (K, N) blocked along axis 0 (NN layout).
    qa = quantized((70, 9), fmt, 18, axis=0)
    qb = quantized((70, 21), fmt, 19, axis=0)
    y = pallas.fp4_dot_general(qa, qb, (((0,), (0,)), ((), ())), interpret=self.INTERPRET)
    a = np.asarray(quant.dequantize(qa), np.float64)
    b = np.asarray(quant.dequantize(qb), np.float64)
    ref, mag = a.T @ b, np.abs(a).T @ np.abs(b)
    assert y.shape == (9, 21)
    assert np.all(np.abs(np.asarray(y) - ref) <= 12 * EPS32 * mag + 1e-37)
    # Batch dims in different places: lhs (B, K, M) blocked along 1, rhs (N, B, K) along 2.
    qa = quantized((2, 48, 5), fmt, 20, axis=1)
    qb = quantized((7, 2, 48), fmt, 21, axis=2)
    y = pallas.fp4_dot_general(qa, qb, (((1,), (2,)), ((0,), (1,))), interpret=self.INTERPRET,
                               preferred_element_type=jnp.bfloat16)
    a = np.asarray(quant.dequantize(qa), np.float64)
    b = np.asarray(quant.dequantize(qb), np.float64)
    want = jax.lax.dot_general(a, b, (((1,), (2,)), ((0,), (1,))))
    assert y.shape == want.shape == (2, 5, 7) and y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y, np.float64), np.asarray(want), rtol=2**-8, atol=1e-30)

  def test_rejects_what_it_cannot_multiply(self):
    qa = quantized((16, 64), "mxfp4", 22)
    with pytest.raises(ValueError, match="same element, block and scale"):
      self.mm(qa, quantized((16, 64), "nvfp4", 23))
    with pytest.raises(NotImplementedError, match="e2m1"):
      self.mm(quantized((16, 64), "mxfp8_e4m3", 24), quantized((16, 64), "mxfp8_e4m3", 25))
    with pytest.raises(ValueError, match="last"):
      self.mm(quantized((64, 16), "mxfp4", 26, axis=0), qa)
    with pytest.raises(ValueError, match="contracted along axis"):
      pallas.fp4_dot_general(qa, qa, (((0,), (0,)), ((), ())), interpret=self.INTERPRET)


@pytest.mark.skipif(not ON_GPU, reason="needs a GPU: LPJAX_TEST_GPU=1 pytest tests/pallas")
class TestCompiled(TestInterpret):
  INTERPRET = False


# --------------------------------------------------------------------------- the GEMM path


DN = (((1,), (0,)), ((), ()))


def _with(name, **kw):
  return dataclasses.replace(recipes.get(name), **kw)


def _value_and_grads(recipe, x, w, key=None):
  f = lambda x, w: (quant.dot_general(x, w, DN, recipe, key=key) * jnp.arange(w.shape[1])).sum()
  return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(x, w)


def test_recipe_option_selects_the_passes_with_two_fp4_operands():
  from lpjax.quant.gemm import kernel_dispatch as gk
  use = lambda r: [gk.use_kernel(r, g) for g in ("fwd", "dgrad", "wgrad")]
  assert use(_with("mxfp4", gemm_impl="pallas")) == [True, True, True]
  assert use(_with("nvfp4", gemm_impl="pallas")) == [True, True, True]  # W's 16x16 tiles pair
  assert use(_with("quartet", gemm_impl="pallas")) == [False, True, True]  # QuEST forward
  assert use(_with("mxfp4_bwd", gemm_impl="pallas")) == [False, True, True]  # bf16 forward
  assert use(_with("ssp_fp4", gemm_impl="pallas")) == [False, False, False]
  assert use(_with("mxfp8", gemm_impl="pallas")) == [False, False, False]
  assert use(_with("mxfp4", gemm_impl="xla")) == [False, False, False]
  assert use(recipes.get("mxfp4")) == [False, False, False]  # "auto": nothing measured yet
  assert recipes.get("mxfp4").gemm_impl == "auto"
  assert use(quant.get_recipe("mxfp4_naive:gemm_impl=pallas")) == [True, True, True]  # a spec
  with pytest.raises(ValueError, match="gemm_impl"):
    _with("mxfp4", gemm_impl="triton")


def test_gemm_path_bit_identical_where_every_float32_sum_is_exact():
  # E2M1-valued operands are quantized losslessly by MXFP4 RTN along any axis (dY = the
  # arange weights of the loss is rounded alike in both paths). Every product is then a multiple
  # of 1/4 and every sum stays far below 2^24 quarters, so any summation order gives the exact
  # result: forward, dgrad and wgrad of the kernel path equal the emulated GEMM's bit for bit.
  x, w = e2m1_exact((64, 96), 30), e2m1_exact((96, 8), 31)
  got = _value_and_grads(_with("mxfp4_naive", gemm_impl="pallas"), x, w)
  want = _value_and_grads(_with("mxfp4_naive", gemm_impl="xla"), x, w)
  for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(e))
  # and both equal the exact float64 product of the (lossless) operands
  y = quant.dot_general(x, w, DN, _with("mxfp4_naive", gemm_impl="pallas"))
  np.testing.assert_array_equal(np.asarray(y, np.float64),
                                np.asarray(x, np.float64) @ np.asarray(w, np.float64))


def test_gemm_path_single_block_bit_identical_to_emulated():
  # K = 32: one block, one exact product per output, whatever the scales.
  x = jax.random.normal(jax.random.key(0), (24, 32)) * jnp.exp2(
      jax.random.randint(jax.random.key(1), (24, 1), -20, 20).astype(jnp.float32))
  w = jax.random.normal(jax.random.key(2), (32, 16))
  dn = DN
  f = lambda impl: quant.dot_general(x, w, dn, _with("mxfp4_naive", gemm_impl=impl))
  np.testing.assert_array_equal(np.asarray(f("pallas")), np.asarray(f("xla")))


@pytest.mark.parametrize("name", ["mxfp4", "nvfp4", "quartet"])
def test_gemm_path_matches_emulated_in_float32(name):
  # With compute_dtype=float32 the emulated GEMM multiplies lpjax's dequantized values exactly
  # and differs from the kernel only by float32 rounding (summation order, NVFP4's decode
  # multipliers, the SR pre-scale's division). The bf16 presets round NVFP4's decoded values and
  # the x 1/0.75 of SR operands to 8 bits before the emulated GEMM; the kernel does not.
  x = jax.random.normal(jax.random.key(3), (40, 64))
  w = jax.random.normal(jax.random.key(4), (64, 24))
  key = jax.random.key(5)
  got = _value_and_grads(_with(name, gemm_impl="pallas", compute_dtype=jnp.float32), x, w, key)
  want = _value_and_grads(_with(name, gemm_impl="xla", compute_dtype=jnp.float32), x, w, key)
  for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=2e-6,
                               atol=2e-6 * float(jnp.abs(e).max()))


def test_gemm_path_quantized_residuals_feed_the_kernel_packed():
  x = jax.random.normal(jax.random.key(6), (32, 64))
  w = jax.random.normal(jax.random.key(7), (64, 16))
  key = jax.random.key(8)
  hp = _value_and_grads(_with("mxfp4", gemm_impl="pallas"), x, w, key)
  packed = _value_and_grads(_with("mxfp4", gemm_impl="pallas", residuals="quantized"), x, w, key)
  for g, e in zip(jax.tree.leaves(packed), jax.tree.leaves(hp)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(e))
