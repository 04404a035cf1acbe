"""Every kernel lowers to Triton IR, checked on a CPU machine by lowering for the "cuda" platform.

jax 0.10 lowers for "cuda" on a CPU as it is; from jax 0.11 the lowering reads the GPU from an
abstract device, an H100 (`_support.cuda_lowering_target`). A jax with neither would skip these
tests with the reason (`_support.cuda_lowering_unavailable`).

This runs JAX's Pallas-to-Triton lowering (every primitive needs a Triton rule; loads, stores and
intermediate arrays need power-of-two sizes; reductions and dots are verified as Triton ops), but
not Triton's own compiler or the GPU: a GPU run of test_pallas_kernels.py is the full check.
"""

import contextlib

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
  reason = _support.cuda_lowering_unavailable()  # a jax that knows no abstract GPU
  if reason:
    pytest.skip(reason)
  x = jnp.zeros((128, 256), jnp.bfloat16)
  with _support.cuda_lowering_target():
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


def test_on_a_cpu_the_lowering_target_is_what_makes_jax_0_11_lower_for_cuda():
  """jax 0.10 lowers on a CPU as it is (no context); from jax 0.11 the same lowering without the
  abstract GPU fails, and with it succeeds: the target is needed, and enough."""
  x = jnp.zeros((32, 64), jnp.float32)
  lower = lambda: jax.jit(CASES["fake_quant_nvfp4"]).trace(x).lower(lowering_platforms=("cuda",))
  assert _support.cuda_lowering_unavailable() is None  # on every supported jax, GPU or not
  if _support._jax_version() < (0, 11) or _support._has_gpu():
    assert isinstance(_support.cuda_lowering_target(), contextlib.nullcontext)
  else:
    with pytest.raises(Exception, match="GPU"):  # "No supported GPU devices found"
      lower()
  with _support.cuda_lowering_target():
    assert "xla.gpu.triton" in lower().as_text()


def test_a_jax_without_abstract_devices_skips_with_the_reason():
  assert _support.cuda_lowering_unavailable(version=(0, 10), gpu=False, abstract=False) is None
  assert _support.cuda_lowering_unavailable(version=(0, 12), gpu=True, abstract=False) is None
  assert _support.cuda_lowering_unavailable(version=(0, 12), gpu=False, abstract=True) is None
  reason = _support.cuda_lowering_unavailable(version=(0, 13), gpu=False, abstract=False)
  assert "only for a GPU it knows" in reason and "abstract" in reason
