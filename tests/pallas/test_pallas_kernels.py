"""The Pallas kernels against the XLA implementation of lpjax.quant, bit for bit.

As jax's tests/pallas/gpu_ops_test.py: `TestKernels` compiles the kernels (Triton, needs a GPU;
skipped elsewhere) and `TestKernelsInterpret` runs the same tests in Pallas interpret mode (CPU).
Shapes are small because interpret mode is slow.
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from pallas_data import (FORMATS, MX, ROUNDINGS, assert_same_bits, assert_same_qarray,  # noqa: E402
                         assert_same_values, key_kw, needs_gpu_unless, special_data)

from lpjax import pallas, quant  # noqa: E402
from lpjax.quant.gemm import operand  # noqa: E402

SHAPE = (16, 64)  # 16 rows (the last six with NaN/Inf/zeros/subnormals/ties/tiny), 2 MX blocks
X = special_data(SHAPE, seed=1)


def _pair(fn_kernel, fn_xla, *args):
  return jax.jit(fn_kernel)(*args), jax.jit(fn_xla)(*args)


class TestKernels:
  INTERPRET = False

  @pytest.fixture(autouse=True)
  def _device(self):
    needs_gpu_unless(self.INTERPRET)

  def quantize_pair(self, x, fmt, **kw):
    key = kw.pop("key", None)
    return _pair(lambda x, k: pallas.quantize(x, fmt, key=k, interpret=self.INTERPRET, **kw),
                 lambda x, k: quant.quantize(x, fmt, key=k, impl="xla", **kw), x, key)

  def fake_pair(self, x, fmt, **kw):
    key = kw.pop("key", None)
    return _pair(lambda x, k: pallas.fake_quant(x, fmt, key=k, interpret=self.INTERPRET, **kw),
                 lambda x, k: quant.fake_quant(x, fmt, key=k, impl="xla", **kw), x, key)

  # -------------------------------------------------------------------- quantize

  @pytest.mark.parametrize("rounding", ROUNDINGS)
  @pytest.mark.parametrize("fmt", FORMATS)
  def test_quantize_every_format_and_rounding(self, fmt, rounding):
    q, ref = self.quantize_pair(jnp.asarray(X), fmt, **key_kw(rounding))
    assert_same_qarray(q, ref, f"{fmt} {rounding}")

  @pytest.mark.parametrize("scale_mode", ["ceil", "even", "rceil"])
  @pytest.mark.parametrize("fmt", MX)
  def test_quantize_e8m0_scale_modes(self, fmt, scale_mode):
    q, ref = self.quantize_pair(jnp.asarray(X), fmt, scale_mode=scale_mode)
    assert_same_qarray(q, ref, f"{fmt} {scale_mode}")

  @pytest.mark.parametrize("fmt,shape,axis,dtype,rounding", [
      ("mxfp4", (3, 5, 70), -1, jnp.bfloat16, "stochastic"),  # odd rows, ragged blocks, batch
      ("nvfp4", (2, 3, 41), 2, jnp.float32, "stochastic"),
      ("nvfp4", (6, 45, 3), 1, jnp.bfloat16, "nearest_even"),  # blocked middle axis
      ("mxfp8_e4m3", (70, 9), 0, jnp.float32, "stochastic"),  # blocked first axis
      ("mxfp6_e2m3", (5, 3, 33), -1, jnp.bfloat16, "toward_negative"),
  ])
  def test_quantize_odd_shapes_and_dtypes(self, fmt, shape, axis, dtype, rounding):
    x = jnp.asarray(special_data(shape, seed=2), dtype)
    q, ref = self.quantize_pair(x, fmt, axis=axis, **key_kw(rounding, 3))
    assert_same_qarray(q, ref, f"{fmt} {shape} axis={axis} {dtype.__name__}")

  def test_nvfp4_given_tensor_amax(self):
    q, ref = self.quantize_pair(jnp.asarray(X), "nvfp4", tensor_amax=jnp.float32(-3.5))
    assert_same_qarray(q, ref, "nvfp4 tensor_amax")
    assert float(q.tensor_scale) == 3.5

  def test_stochastic_bits_do_not_depend_on_the_tile_grid(self):
    x = jnp.asarray(special_data((8, 128), seed=4))
    kw = dict(rounding="stochastic", interpret=self.INTERPRET)
    a, b, c = jax.jit(lambda x: (
        pallas.quantize(x, "mxfp4", tile=(1, 32), key=jax.random.key(9), **kw),
        pallas.quantize(x, "mxfp4", tile=(8, 128), key=jax.random.key(9), **kw),
        pallas.quantize(x, "mxfp4", key=jax.random.key(10), **kw)))(x)
    assert_same_qarray(a, b, "tile (1, 32) vs (8, 128)")
    assert (np.asarray(c.codes) != np.asarray(a.codes)).any()  # the key matters

  # -------------------------------------------------------------------- fake_quant / dequantize

  @pytest.mark.parametrize("fmt,rounding", [(f, "nearest_even") for f in FORMATS] +
                           [("mxfp4", "stochastic"), ("nvfp4", "stochastic")])
  def test_fake_quant(self, fmt, rounding):
    y, ref = self.fake_pair(jnp.asarray(X), fmt, **key_kw(rounding))
    assert_same_bits(y, ref, f"fake_quant {fmt} {rounding}")

  @pytest.mark.parametrize("fmt,axis,dtype", [("mxfp4", -1, jnp.bfloat16),
                                              ("nvfp4", 0, jnp.float32),
                                              ("mxfp6_e3m2", 1, jnp.bfloat16)])
  def test_fake_quant_axes_and_dtypes(self, fmt, axis, dtype):
    x = jnp.asarray(special_data((4, 40, 18), seed=5), dtype)
    y, ref = self.fake_pair(x, fmt, axis=axis, rounding="toward_positive")
    assert y.dtype == dtype
    assert_same_bits(y, ref, f"fake_quant {fmt} axis={axis}")

  @pytest.mark.parametrize("fmt,shape,axis,dtype", [
      (f, (12, 3, 50), -1, jnp.float32) for f in FORMATS] + [
      ("mxfp4", (3, 37, 5), 1, jnp.bfloat16), ("nvfp4", (40, 3), 0, jnp.bfloat16)])
  def test_dequantize(self, fmt, shape, axis, dtype):
    x = jnp.asarray(special_data(shape, seed=6))
    q = jax.jit(lambda x: quant.quantize(x, fmt, axis=axis, impl="xla"))(x)
    y, ref = _pair(lambda q: pallas.dequantize(q, dtype, interpret=self.INTERPRET),
                   lambda q: quant.dequantize(q, dtype, impl="xla"), q)
    assert_same_bits(y, ref, f"dequantize {fmt} axis={axis} {dtype.__name__}")

  def test_fake_quant_gradient_is_straight_through(self):
    x = jnp.asarray(special_data((8, 32), seed=8)[:2])
    fn = lambda x: pallas.fake_quant(x, "nvfp4", interpret=self.INTERPRET)
    g, y = jax.jit(lambda x: (jax.grad(lambda x: (fn(x) * x).sum())(x), fn(x)))(x)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(y + x))  # d/dx (q(x) x) = 1 * x + q(x)

  # -------------------------------------------------------------------- double quantization

  @pytest.mark.parametrize("fmt,shape,rounding", [("mxfp4", (2, 40, 72), "stochastic"),
                                                  ("nvfp4", (48, 32), "nearest_even"),
                                                  ("mxfp8_e5m2", (33, 64), "toward_zero")])
  def test_double_quantize_equals_two_quantizations(self, fmt, shape, rounding):
    x = jnp.asarray(special_data(shape, seed=9))
    kw = key_kw(rounding, 11)
    col_key = jax.random.key(12) if rounding == "stochastic" else None
    rows, cols = jax.jit(lambda x: pallas.double_quantize(
        x, fmt, col_key=col_key, interpret=self.INTERPRET, **kw))(x)
    ref_rows, ref_cols = jax.jit(lambda x: (
        quant.quantize(x, fmt, axis=-1, impl="xla", **kw),
        quant.quantize(x, fmt, axis=-2, impl="xla", **dict(kw, key=col_key))))(x)
    assert_same_qarray(rows, ref_rows, f"double {fmt} rows")
    assert_same_qarray(cols, ref_cols, f"double {fmt} cols")

  # -------------------------------------------------------------------- Hadamard + quantize

  @pytest.mark.parametrize("fmt,block,axis,rounding,prescale", [
      ("nvfp4", 16, -1, "stochastic", None),  # NVIDIA: RHT-16 on the wgrad operands, SR
      ("nvfp4", 16, 0, "nearest_even", None),
      ("mxfp4", 64, 0, "stochastic", 0.75),  # Tseng et al.: RHT-64 + SR with the 3/4 pre-scale
      ("mxfp4", 32, -1, "nearest_even", None),  # Quartet: Hadamard-32, RTN
  ])
  def test_hadamard_quantize(self, fmt, block, axis, rounding, prescale):
    x = jnp.asarray(special_data((40, 24), seed=13)[:34] * 3)  # 34 rows: padding along axis 0
    x = x.at[-1].set(jnp.nan) if axis == -1 else x
    signs = quant.random_signs(jax.random.key(14), block)
    kw = dict(block=block, signs=signs, axis=axis, prescale=prescale, **key_kw(rounding, 15))
    qkw = dict(axis=axis, rounding=rounding, key=kw["key"], impl="xla")
    pre = (lambda v: v) if prescale is None else (lambda v: v * np.float32(prescale))

    def run(x):
      y = pallas.hadamard(x, block, axis=axis, signs=signs, interpret=self.INTERPRET)
      xla_y = operand.rotate(x, block, axis, signs)
      return dict(
          q=pallas.hadamard_quantize(x, fmt, interpret=self.INTERPRET, **kw),
          f=pallas.hadamard_fake_quant(x, fmt, interpret=self.INTERPRET, **kw),
          y=y, xla_y=xla_y, q_of_y=quant.quantize(pre(y), fmt, **qkw),
          f_of_y=quant.fake_quant(pre(y), fmt, **qkw),
          q_of_xla_y=quant.quantize(pre(xla_y), fmt, **qkw))

    r = jax.jit(run)(x)
    # Exactly "rotate in the kernel, then quantize" (every backend) ...
    assert_same_qarray(r["q"], r["q_of_y"], f"rht {fmt} vs its rotation")
    assert_same_bits(r["f"], r["f_of_y"], f"rht fake {fmt}")
    # ... and that rotation is lpjax.quant.hadamard's bit for bit (the same butterfly stages,
    # Inf and NaN included; NaN as one category), so the quantized operands are identical too.
    assert_same_values(r["y"], r["xla_y"], f"rht {fmt} rotation vs xla")
    assert_same_qarray(r["q"], r["q_of_xla_y"], f"rht {fmt} vs xla rotation, then quantize")

  @pytest.mark.parametrize("block,axis", [(128, 0), (128, -1), (16, -1)])
  def test_hadamard_non_finite_blocks_match_the_butterflies(self, block, axis):
    """Inf and NaN inputs give lpjax.quant.hadamard's values (docs/numerics.md, "Non-finite
    values in the Hadamard rotation"): one -Inf in a block makes the block +-Inf (not NaN, as a
    dot with the 0/+-1 stage matrices would), opposite infinities that meet give NaN, a NaN
    makes the block NaN, and finite values that overflow in a stage go on as Inf."""
    rng = np.random.default_rng(21)
    x = rng.standard_normal((4 * block, 16)).astype(np.float32)  # blocks down the rows
    x[3, 0] = -np.inf  # block 0 of column 0: one -Inf alone
    x[5, 1], x[block - 1, 1] = np.inf, -np.inf  # opposite infinities in one block
    x[2, 2], x[7, 2] = np.inf, np.inf  # two +Inf
    x[block + 1, 3] = np.nan
    x[2 * block:2 * block + 2, 4] = [3.0e38, 3.0e38]  # finite, overflows in the first stage
    x[2 * block:2 * block + 2, 5] = [3.0e38, -3.0e38]
    x[3 * block, 6], x[3 * block + 9, 6] = np.inf, 3.4e38
    x = jnp.asarray(x if axis == 0 else np.ascontiguousarray(x.T))
    signs = quant.random_signs(jax.random.key(22), block)
    y = jax.jit(lambda v: pallas.hadamard(v, block, axis=axis, signs=signs,
                                          interpret=self.INTERPRET))(x)
    ref = jax.jit(lambda v: quant.hadamard(v, block, axis=axis, signs=signs))(x)
    assert np.isinf(np.asarray(ref)).any() and np.isnan(np.asarray(ref)).any()  # both kinds
    assert_same_values(y, ref, f"RHT-{block} axis {axis} with Inf / NaN")

  def test_hadamard_fake_quant_gradient_is_the_rotation(self):
    x = jnp.asarray(special_data((8, 40), seed=16)[:4])
    signs = quant.random_signs(jax.random.key(17), 16)
    w = jax.random.normal(jax.random.key(18), (4, 48))
    fn = lambda x: (pallas.hadamard_fake_quant(x, "nvfp4", block=16, signs=signs, prescale=0.75,
                                               interpret=self.INTERPRET) * w).sum()
    g = jax.jit(jax.grad(fn))(x)
    ref = 0.75 * quant.hadamard(w, 16, signs=signs, inverse=True)[:, :40]
    np.testing.assert_allclose(np.asarray(g), np.asarray(ref), rtol=1e-6, atol=1e-6)


class TestKernelsInterpret(TestKernels):
  INTERPRET = True
