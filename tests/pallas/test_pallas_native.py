"""The Blackwell-native GEMM path: its gate, its fallback, its operand conversion, and (on a
Blackwell GPU only) its agreement with the emulated GEMM."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax import quant
from lpjax.pallas import _native as native

A = jax.random.normal(jax.random.key(0), (32, 64))
B = jax.random.normal(jax.random.key(1), (16, 64))
_quantize = jax.jit(quant.quantize, static_argnames=("fmt", "axis"))
BLACKWELL = any(native.native_gemm_supported("nvfp4", d) for d in jax.devices())


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU gate")
def test_gate_is_false_off_blackwell():
  assert native.compute_capability() is None  # CPU
  for fmt in native.NATIVE_FORMATS + ("mxfp4", "int8_channel"):
    assert not native.native_gemm_supported(fmt)


def test_gate_needs_a_native_preset_and_compute_capability_10():
  class FakeGpu:
    platform = "gpu"

    def __init__(self, cc):
      self.compute_capability = cc

  assert native.native_gemm_supported("nvfp4", FakeGpu("10.0"))
  assert native.native_gemm_supported("mxfp8_e5m2", FakeGpu("12.0"))
  assert not native.native_gemm_supported("nvfp4", FakeGpu("9.0"))  # Hopper
  assert not native.native_gemm_supported("mxfp4", FakeGpu("10.0"))  # no MXFP4 path wired
  custom = quant.QuantFormat(element="e4m3", scale="e8m0", block_size=16)
  assert not native.native_gemm_supported(custom, FakeGpu("10.0"))


@pytest.mark.parametrize("fmt", native.NATIVE_FORMATS)
def test_fallback_is_the_emulated_gemm_and_strict_mode_raises(fmt):
  qa, qb = _quantize(A, fmt), _quantize(B, fmt)
  out, ref = jax.jit(lambda qa, qb: (native.native_matmul(qa, qb),
                                     quant.dequantize(qa) @ quant.dequantize(qb).T))(qa, qb)
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-5, atol=1e-5)
  with pytest.raises(NotImplementedError, match="compute capability >= 10"):
    native.native_matmul(qa, qb, fallback=False)


def test_operand_errors():
  qa = _quantize(A, "nvfp4")
  with pytest.raises(ValueError, match="last \\(contraction\\) axis"):
    native.native_matmul(_quantize(A, "nvfp4", axis=0), qa)
  with pytest.raises(ValueError, match="one format"):
    native.native_matmul(qa, _quantize(B, "mxfp8_e4m3"))
  with pytest.raises(TypeError, match="QArray"):
    native.native_matmul(A, qa)


@pytest.mark.parametrize("fmt", native.NATIVE_FORMATS)
def test_scaled_operands_rebuild_the_dequantized_values(fmt):
  q = _quantize(A * 8, fmt)

  def rebuild(q):
    data, scales, global_scale = native.scaled_operands(q)
    block = q.fmt.block_size
    return (data.astype(jnp.float32) * jnp.repeat(scales.astype(jnp.float32), block, axis=-1)
            * global_scale), quant.dequantize(q)

  values, ref = jax.jit(rebuild)(q)
  if fmt == "nvfp4":  # s_b * amax_t is rounded first in lpjax's decode
    np.testing.assert_allclose(np.asarray(values), np.asarray(ref), rtol=2e-7, atol=0)
  else:
    np.testing.assert_array_equal(np.asarray(values), np.asarray(ref))


@pytest.mark.skipif(not BLACKWELL, reason="needs a GPU of compute capability >= 10 (Blackwell)")
@pytest.mark.parametrize("fmt", native.NATIVE_FORMATS)
def test_native_gemm_matches_the_emulated_one_on_blackwell(fmt):
  a = jax.random.normal(jax.random.key(2), (256, 512))
  b = jax.random.normal(jax.random.key(3), (128, 512))
  qa, qb = quant.quantize(a, fmt), quant.quantize(b, fmt)
  out = jax.jit(lambda qa, qb: native.native_matmul(qa, qb, fallback=False))(qa, qb)
  ref = native.emulated_matmul(qa, qb)
  scale = float(jnp.max(jnp.abs(ref)))
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-4, atol=1e-5 * scale)
