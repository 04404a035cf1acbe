"""The FP4 GEMM kernel lowers to Triton IR for the "cuda" platform, on a CPU machine.

As tests/pallas/test_pallas_lowering.py does for the quantizers: this runs JAX's Pallas-to-Triton
lowering (every primitive has a Triton rule; loaded shapes are powers of two; the int8 and bf16
dots are Triton dots), not Triton's compiler or a GPU. Every configuration the GEMM path uses is
lowered: MXFP4 and NVFP4 (per-tensor scale, 16x16 weight tiles), float32 and bf16 out, odd
shapes, batch axes, and `quant.dot_general` forward + backward with `gemm_impl="pallas"` for the
recipes whose passes take the kernel.
"""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from lpjax import pallas, quant
from lpjax.pallas import _support
from lpjax.quant import recipes


def _q(shape, fmt):
  return quant.quantize(jnp.ones(shape, jnp.float32), fmt, impl="xla")


CASES = {
    "mxfp4_f32": lambda: (_q((128, 256), "mxfp4"), _q((64, 256), "mxfp4"), {}),
    "mxfp4_bf16_out": lambda: (_q((128, 256), "mxfp4"), _q((64, 256), "mxfp4"),
                               dict(out_dtype=jnp.bfloat16)),
    "mxfp4_odd": lambda: (_q((5, 70), "mxfp4"), _q((19, 70), "mxfp4"), {}),
    "mxfp4_batched_tile128": lambda: (_q((2, 256, 96), "mxfp4"), _q((2, 128, 96), "mxfp4"),
                                      dict(tile=(128, 128))),
    "mxfp4_bf16_dots": lambda: (_q((64, 128), "mxfp4"), _q((64, 128), "mxfp4"),
                                dict(dot_dtype="bfloat16")),
    "mxfp4_fp8_dots": lambda: (_q((64, 128), "mxfp4"), _q((64, 128), "mxfp4"),
                               dict(dot_dtype="float8_e4m3fn")),
    "nvfp4": lambda: (_q((128, 256), "nvfp4"), _q((64, 256), "nvfp4"), {}),
    "nvfp4_int8_dots": lambda: (_q((64, 256), "nvfp4"), _q((64, 256), "nvfp4"),
                                dict(dot_dtype="int8")),
    "nvfp4_odd_16x16_weight": lambda: (_q((5, 70), "nvfp4"), _q((40, 70), "nvfp4_16x16"),
                                       dict(out_dtype=jnp.bfloat16)),
}


def _lowered(fn, *args):
  reason = _support.cuda_lowering_unavailable()  # a jax that knows no abstract GPU
  if reason:
    pytest.skip(reason)
  with _support.cuda_lowering_target():  # jax >= 0.11 on a CPU: an abstract H100
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("name", list(CASES))
def test_fp4_matmul_lowers_to_triton(name):
  a, b, kw = CASES[name]()
  text = _lowered(lambda a, b: pallas.fp4_matmul(a, b, interpret=False, **kw), a, b)
  assert "xla.gpu.triton" in text and "lpjax_fp4_gemm" in text


def test_block_partials_lower_to_triton():
  a, b = _q((64, 96), "mxfp4"), _q((32, 96), "mxfp4")
  text = _lowered(lambda a, b: pallas.fp4_block_partials(a, b, interpret=False), a, b)
  assert "xla.gpu.triton" in text


def _kernel_equations(jaxpr, inside=False):
  for eqn in jaxpr.eqns:
    if inside:
      yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          yield from _kernel_equations(sub, inside or eqn.primitive.name == "pallas_call")


@pytest.mark.parametrize("name", ["mxfp4_f32", "nvfp4"])
def test_kernel_never_divides_floats(name):
  # Triton's float32 division is approximate; the kernel's scale factors are built from bits.
  a, b, kw = CASES[name]()
  jaxpr = jax.make_jaxpr(lambda a, b: pallas.fp4_matmul(a, b, interpret=False, **kw))(a, b).jaxpr
  eqns = list(_kernel_equations(jaxpr))
  assert any(e.primitive.name == "dot_general" for e in eqns)
  assert not [e for e in eqns if e.primitive.name in ("div", "rem") and any(
      jnp.issubdtype(v.aval.dtype, jnp.floating) for v in e.invars if hasattr(v, "aval"))]


@pytest.mark.parametrize("name,residuals,kernels", [
    ("mxfp4_naive", "high_precision", 3),
    ("mxfp4", "high_precision", 3),  # RHT-32 and the SR pre-scale in the backward
    ("mxfp4", "quantized", 3),  # packed residuals go to the kernel as they are
    ("nvfp4", "high_precision", 3),  # 16x16 weight tiles, per-tensor scales
    ("quartet", "high_precision", 2),  # QuEST forward stays emulated
    ("mxfp4_bwd", "high_precision", 2),  # bf16 forward
])
def test_gemm_path_lowers_with_the_kernel(monkeypatch, name, residuals, kernels):
  # On this CPU machine interpret=None means interpret mode; lower the compiled kernel instead.
  monkeypatch.setattr(_support, "resolve_interpret", lambda interpret: False)
  recipe = dataclasses.replace(recipes.get(name), gemm_impl="pallas", residuals=residuals)
  x, w = jnp.zeros((2, 64, 128), jnp.bfloat16), jnp.zeros((128, 96), jnp.bfloat16)
  loss = lambda x, w, key: quant.dot_general(x, w, (((2,), (0,)), ((), ())), recipe,
                                             key=key).astype(jnp.float32).sum()
  step = jax.value_and_grad(loss, argnums=(0, 1))
  calls = [e for e in _pallas_calls(jax.make_jaxpr(step)(x, w, jax.random.key(0)).jaxpr)
           if e.params.get("name") == "lpjax_fp4_gemm"]
  assert len(calls) == kernels  # one per pass that takes the kernel
  assert "xla.gpu.triton" in _lowered(step, x, w, jax.random.key(0))


def _pallas_calls(jaxpr):
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "pallas_call":
      yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          yield from _pallas_calls(sub)
