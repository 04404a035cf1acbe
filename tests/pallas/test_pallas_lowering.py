"""Every kernel lowers to Triton IR, checked on a CPU machine by lowering for the "cuda" platform.

Under jax >= 0.11 the lowering needs a GPU (`_support.cuda_lowering_unavailable`): these tests
skip with that reason on a CPU machine there, and run on a GPU machine.

This runs JAX's Pallas-to-Triton lowering (every primitive needs a Triton rule; loads, stores and
intermediate arrays need power-of-two sizes; reductions and dots are verified as Triton ops), but
not Triton's own compiler or the GPU: a GPU run of test_pallas_kernels.py is the full check.
"""

import jax
import jax.numpy as jnp
import pytest

from lpjax import pallas, quant
from lpjax.pallas import _support

KEY = jax.random.key(0)
SIGNS = jnp.ones((16,), jnp.float32)
CASES = {
    "quantize_rows_mxfp4_rtn": lambda x: pallas.quantize(x, "mxfp4", interpret=False),
    "quantize_rows_mxfp4_sr": lambda x: pallas.quantize(x, "mxfp4", rounding="stochastic",
                                                        key=KEY, interpret=False),
    "quantize_rows_mxfp6_rceil": lambda x: pallas.quantize(x, "mxfp6_e2m3", scale_mode="rceil",
                                                           rounding="toward_negative",
                                                           interpret=False),
    "quantize_rows_mxfp8_even": lambda x: pallas.quantize(x, "mxfp8_e5m2", scale_mode="even",
                                                          interpret=False),
    "quantize_cols_nvfp4_sr": lambda x: pallas.quantize(x, "nvfp4", axis=0, rounding="stochastic",
                                                        key=KEY, interpret=False),
    "quantize_odd_shape": lambda x: pallas.quantize(x[:5, :70], "mxfp4", interpret=False),
    "fake_quant_nvfp4": lambda x: pallas.fake_quant(x, "nvfp4", interpret=False),
    "fake_quant_cols_mxfp4_sr": lambda x: pallas.fake_quant(x, "mxfp4", axis=0,
                                                            rounding="stochastic", key=KEY,
                                                            interpret=False),
    "dequantize_mxfp4_bf16": lambda x: pallas.dequantize(
        quant.quantize(x, "mxfp4", impl="xla"), jnp.bfloat16, interpret=False),
    "dequantize_cols_nvfp4": lambda x: pallas.dequantize(
        quant.quantize(x, "nvfp4", axis=0, impl="xla"), interpret=False),
    "double_quantize_mxfp4_sr": lambda x: pallas.double_quantize(
        x, "mxfp4", rounding="stochastic", key=KEY, interpret=False),
    "double_quantize_nvfp4": lambda x: pallas.double_quantize(x, "nvfp4", interpret=False),
    "hadamard_quantize_rows_nvfp4": lambda x: pallas.hadamard_quantize(
        x, "nvfp4", block=16, signs=SIGNS, interpret=False),
    "hadamard_quantize_cols_mxfp4_sr": lambda x: pallas.hadamard_quantize(
        x, "mxfp4", block=64, axis=0, rounding="stochastic", key=KEY, prescale=0.75,
        interpret=False),
    "hadamard_fake_quant": lambda x: pallas.hadamard_fake_quant(x, "mxfp4", block=32,
                                                                interpret=False),
    "hadamard": lambda x: pallas.hadamard(x, 128, axis=0, interpret=False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_lowers_to_triton(name):
  reason = _support.cuda_lowering_unavailable()  # jax >= 0.11 without a GPU
  if reason:
    pytest.skip(reason)
  x = jnp.zeros((128, 256), jnp.bfloat16)
  text = jax.jit(CASES[name]).trace(x).lower(lowering_platforms=("cuda",)).as_text()
  assert "xla.gpu.triton" in text  # the Triton backend, not Mosaic GPU (JAX's default)


def _kernel_equations(jaxpr, inside=False):
  for eqn in jaxpr.eqns:
    if inside:
      yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          yield from _kernel_equations(sub, inside or eqn.primitive.name == "pallas_call")


@pytest.mark.parametrize("name", ["quantize_cols_nvfp4_sr", "fake_quant_nvfp4",
                                  "dequantize_cols_nvfp4", "hadamard_quantize_rows_nvfp4",
                                  "quantize_rows_mxfp6_rceil"])
def test_kernels_never_divide_floats(name):
  # Triton lowers a float32 division to the approximate div.full.f32, which would break
  # bit-identity (XLA divides exactly): reciprocals in the kernels are integer divisions.
  jaxpr = jax.make_jaxpr(CASES[name])(jnp.zeros((64, 256), jnp.float32)).jaxpr
  eqns = list(_kernel_equations(jaxpr))
  assert len(eqns) > 100  # the kernel body was found
  float_divs = [e for e in eqns if e.primitive.name in ("div", "rem") and any(
      jnp.issubdtype(v.aval.dtype, jnp.floating) for v in e.invars if hasattr(v, "aval"))]
  assert not float_divs


def test_cuda_lowering_needs_a_gpu_from_jax_0_11():
  """The lowering tests run under the pinned jax 0.10 on a CPU and skip, with a reason, where a
  jax >= 0.11 has no GPU to ask."""
  import jax as _jax
  if tuple(int(p) for p in _jax.__version__.split(".")[:2]) < (0, 11):
    assert _support.cuda_lowering_unavailable() is None
  assert _support.cuda_lowering_unavailable(version=(0, 10), gpu=False) is None
  assert "only with a GPU" in _support.cuda_lowering_unavailable(version=(0, 11, 2), gpu=False)
  assert _support.cuda_lowering_unavailable(version=(0, 12), gpu=True) is None
