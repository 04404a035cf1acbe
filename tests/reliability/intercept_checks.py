"""Checks shared by the interception's case tables (test_bad_inputs_intercept.py and
test_bad_inputs_intercept_fresh.py): a model unwrapped and intercepted, bit-for-bit comparison of
loss and gradients, and reading a report's per-site status."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lpjax import quant

KEY = jax.random.key(7)
F32 = jnp.float32


def same(a, b) -> bool:
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(
      x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


def value_and_grad(fn, params, *args):
  """Loss and gradient of a fixed scalar function of `fn`'s output (every output entry counts)."""
  def loss(p):
    y = fn(p, *args).astype(F32)
    return jnp.sum(jnp.sin(y) * jnp.arange(y.size, dtype=F32).reshape(y.shape) / y.size)
  return jax.jit(jax.value_and_grad(loss))(params)


def built_linen(model, policy, *args):
  """(unwrapped apply, quantized apply, variables) of a linen model."""
  variables = model.init(jax.random.key(0), *args)
  return model.apply, quant.quantize_model(model, policy).apply, variables


def built_nnx(model, policy):
  graphdef, state = nnx.split(model)
  plain = lambda s, *a: nnx.merge(graphdef, s)(*a)
  q = lambda s, *a: quant.quantize_model(nnx.merge(graphdef, s), policy)(*a, quant_key=KEY)
  return plain, q, state


def built_plain(fn, policy, params):
  return fn, (lambda p, *a: quant.quantized(fn, policy)(p, *a, quant_key=KEY)), params


def fp32_bit_identical(built, *args) -> bool:
  """`fp32` gives back the unwrapped model: loss and gradients, bit for bit."""
  plain, q, params = built
  return same(value_and_grad(plain, params, *args), value_and_grad(q, params, *args))


def report(target, *args, **kw):
  return quant.report(target, *args, quant_key=KEY, **kw)


def status(rep) -> dict:
  """{path: (status, reason)} of a report (the last site of a path wins)."""
  return {s.path: (s.status, s.reason) for s in rep.sites}


def kept(rep, path) -> bool:
  return status(rep)[path][0] == "high precision"


def linen_report(model, policy, *args):
  variables = model.init(jax.random.key(0), *args)
  return report(quant.quantize_model(model, policy), variables, *args)


def nnx_report(model, policy, *args):
  return report(quant.quantize_model(model, policy), *args)


def no_warning(call) -> bool:
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    call()
  return True
