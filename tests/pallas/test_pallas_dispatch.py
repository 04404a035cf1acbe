"""impl="auto" | "xla" | "pallas" of lpjax.quant and the errors of lpjax.pallas."""

import importlib
import os
import sys

import jax
import jax.numpy as jnp
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from pallas_data import ON_GPU, assert_same_bits, assert_same_qarray, special_data  # noqa: E402

from lpjax import pallas, quant  # noqa: E402
from lpjax.quant import backends  # noqa: E402
Q = importlib.import_module("lpjax.quant.codec.qarray")  # the module (the package re-exports names)
X = jnp.asarray(special_data((8, 64), seed=3))


class _Spy:
  """Wraps the registered pallas backend and records which entry points ran."""

  def __init__(self, backend):
    self.backend, self.calls = backend, []

  def __getattr__(self, name):
    attr = getattr(self.backend, name)
    if name in ("quantize", "dequantize", "fake_quant"):
      def wrapped(*a, **k):
        self.calls.append(name)
        return attr(*a, **k)
      return wrapped
    return attr


@pytest.fixture
def spy(monkeypatch):
  spy = _Spy(backends.KERNELS["pallas"])
  monkeypatch.setitem(backends.KERNELS, "pallas", spy)
  return spy


@pytest.mark.parametrize("fn", [lambda impl: quant.quantize(X, "mxfp4", impl=impl),
                                lambda impl: quant.fake_quant(X, "mxfp4", impl=impl),
                                lambda impl: quant.dequantize(quant.quantize(X, "mxfp4"), impl=impl)])
def test_bad_impl_is_a_value_error(fn):
  with pytest.raises(ValueError, match="impl must be one of 'auto', 'xla', 'pallas', got 'triton'"):
    fn("triton")


def test_pallas_for_an_unsupported_format_names_the_supported_ones():
  with pytest.raises(NotImplementedError, match=r"int8_channel .*Supported: mxfp4, mxfp6_e2m3.*nvfp4"):
    quant.quantize(X, "int8_channel", impl="pallas")
  with pytest.raises(NotImplementedError, match="nvfp4_16x16"):
    quant.fake_quant(X, "nvfp4_16x16", impl="pallas")
  with pytest.raises(NotImplementedError, match="fp8_e4m3"):
    pallas.quantize(X, "fp8_e4m3")


@pytest.mark.skipif(ON_GPU, reason="on a GPU auto picks the kernels")
def test_auto_is_xla_on_cpu(spy):
  assert not Q._auto_uses_kernels()
  quant.quantize(X, "mxfp4")
  quant.fake_quant(X, "nvfp4")
  assert spy.calls == []


def test_auto_picks_the_kernels_where_they_apply(spy, monkeypatch):
  monkeypatch.setattr(Q, "_auto_uses_kernels", lambda: True)  # as on a single GPU
  q = jax.jit(lambda x: quant.quantize(x, "mxfp4"))(X)
  jax.jit(lambda x: quant.fake_quant(x, "int4_g128"))(X)  # no kernel: XLA, silently
  jax.jit(lambda q: quant.dequantize(q))(q)
  assert spy.calls == ["quantize", "dequantize"]


def test_auto_can_be_switched_off(monkeypatch):
  monkeypatch.setenv("LPJAX_PALLAS_AUTO", "0")
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert not Q._auto_uses_kernels()
  monkeypatch.setenv("LPJAX_PALLAS_AUTO", "1")
  assert Q._auto_uses_kernels()  # on GPUs, however many (the kernels partition per shard)


def test_impl_pallas_on_cpu_runs_the_kernel_in_interpret_mode(spy):
  key = jax.random.key(4)
  q, ref = jax.jit(lambda x: (quant.quantize(x, "nvfp4", rounding="stochastic", key=key,
                                             impl="pallas"),
                              quant.quantize(x, "nvfp4", rounding="stochastic", key=key,
                                             impl="xla")))(X)
  assert_same_qarray(q, ref, "impl=pallas")
  y, y_ref = jax.jit(lambda q: (quant.dequantize(q, jnp.bfloat16, impl="pallas"),
                                quant.dequantize(q, jnp.bfloat16, impl="xla")))(q)
  assert_same_bits(y, y_ref, "dequantize impl=pallas")
  assert spy.calls == ["quantize", "dequantize"]


def test_pallas_argument_errors_match_quant():
  with pytest.raises(ValueError, match="needs an explicit key"):
    pallas.quantize(X, "mxfp4", rounding="stochastic")
  with pytest.raises(ValueError, match="Unknown rounding mode"):
    pallas.fake_quant(X, "mxfp4", rounding="nearest")
  with pytest.raises(ValueError, match="scale_mode"):
    pallas.quantize(X, "nvfp4", scale_mode="ceil")
  with pytest.raises(TypeError, match="float array"):
    pallas.quantize(jnp.ones((4, 32), jnp.int32), "mxfp4")
  with pytest.raises(ValueError, match="scalar"):
    pallas.quantize(jnp.float32(1.0), "mxfp4")
  with pytest.raises(ValueError, match="out of range"):
    pallas.quantize(X, "mxfp4", axis=2)
  with pytest.raises(ValueError, match="rank >= 2"):
    pallas.double_quantize(jnp.ones((64,)), "mxfp4")
  with pytest.raises(ValueError, match="power-of-two block >= 16"):
    pallas.hadamard_quantize(X, "mxfp4", block=8)
  with pytest.raises(NotImplementedError, match="multiple of the scaling block"):
    pallas.hadamard_quantize(X, "mxfp4", block=16, axis=0)
  with pytest.raises(TypeError, match="QArray"):
    pallas.dequantize(X)


def test_empty_arrays_are_a_clear_error():
  with pytest.raises(ValueError, match=r"empty array \(shape \(0, 64\)\)"):
    pallas.quantize(jnp.zeros((0, 64)), "mxfp4")
  with pytest.raises(ValueError, match="empty array"):
    pallas.fake_quant(jnp.zeros((4, 0)), "nvfp4")

