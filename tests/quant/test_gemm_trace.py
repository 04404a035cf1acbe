"""What one quantized GEMM traces (a structural compile-time property, no timing): every pass
derives its RHT signs once, shared by its two operands, and a stochastic-rounding key only for
the operands that draw random bits. Each derivation is a traced hash that XLA compiles; the
duplicates of the old code (signs per operand, keys of round-to-nearest operands) gave the same
bits and only more equations."""

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax.quant import recipes
from lpjax.quant.recipes.gemm_recipe import OperandQuant
from lpjax.quant.gemm import operand as opq
from lpjax.quant.gemm.dot_general import dot_general

DN2 = (((1,), (0,)), ((), ()))


def _derivations(monkeypatch, recipe, residuals=None):
  """Traces value_and_grad of one GEMM; counts the sign and operand-key derivations per pass."""
  signs, keys = collections.Counter(), collections.Counter()
  real_signs, real_key = opq.hadamard_signs, opq.operand_key

  def counted_signs(key, gemm, block):
    signs[gemm] += 1
    return real_signs(key, gemm, block)

  def counted_key(key, gemm, side):
    keys[gemm, side] += 1
    return real_key(key, gemm, side)

  real_streams = opq.operand_streams

  def counted_streams(key, places):  # a pass's keys derived at once: each counts as one
    for gemm, side in places:
      keys[gemm, side] += 1
    return real_streams(key, places)

  monkeypatch.setattr(opq, "hadamard_signs", counted_signs)
  monkeypatch.setattr(opq, "operand_key", counted_key)
  monkeypatch.setattr(opq, "operand_streams", counted_streams)
  r = recipes.get(recipe)
  if residuals is not None:
    r = dataclasses.replace(r, residuals=residuals)
  loss = lambda x, w, key: dot_general(x, w, DN2, r, key=key).sum()
  jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1)))(
      jnp.ones((8, 64)), jnp.ones((64, 16)), jax.random.key(0))
  return dict(signs), dict(keys)


def _expected_keys(recipe):
  """(gemm, side) of every operand whose quantizer rounds stochastically (the only ones that use a
  key: a scheme's random draws are its stochastic rounding)."""
  r = recipes.get(recipe)
  out = {}
  for gemm in ("fwd", "dgrad", "wgrad"):
    for side, op in enumerate(getattr(r, gemm).operands()):
      if isinstance(op, OperandQuant) and op.stochastic:
        out[gemm, side] = 1
  return out


@pytest.mark.parametrize("recipe", ["mxfp4", "nvfp4", "quartet"])
def test_each_pass_derives_its_signs_once(monkeypatch, recipe):
  signs, keys = _derivations(monkeypatch, recipe)
  r = recipes.get(recipe)
  with_rht = {g for g in ("fwd", "dgrad", "wgrad") if getattr(r, g).hadamard_block}
  if r.trust_masked:
    with_rht.discard("fwd")  # QuEST's forward: a fixed Hadamard transform, no random signs
  # Once per pass with an RHT (the old code: once per operand, and again for each re-quantization
  # of a forward operand: mxfp4 6, nvfp4 2, quartet 4).
  assert signs == {g: 1 for g in with_rht}
  # One key per operand that rounds stochastically, none for the others (the old code derived
  # all six, and again for each re-quantization of a forward operand).
  assert keys == _expected_keys(recipe)


def test_quantized_residuals_derive_signs_once_per_pass(monkeypatch):
  signs, keys = _derivations(monkeypatch, "mxfp4", residuals="quantized")
  # The forward rule packs the backward's X and W (dgrad and wgrad signs once each there), the
  # backward rule quantizes dY for both passes (once each again): old code 4 + 4 + 4.
  assert signs == {"fwd": 1, "dgrad": 2, "wgrad": 2}
  assert keys == _expected_keys("mxfp4")


def test_each_operand_quantizer_is_traced_once_per_shape(monkeypatch):
  """Two GEMM sites of the same shapes and recipe: every operand quantizer (RHT, pre-scale,
  quantizer, unscale: `operand.fake`) is traced once per (shape, dtype, options), forward and
  backward, and the second site reuses the traces (the old code traced all of it again at every
  site: a U-Net's 246 operand quantizers were most of its step's trace)."""
  traced = collections.Counter()
  real_pre = opq._pre

  def counted_pre(x, op, axis, signs, block):
    traced[x.shape, str(x.dtype), op, axis, block] += 1
    return real_pre(x, op, axis, signs, block)

  jax.clear_caches()  # an earlier test's traces would otherwise be reused, counting 0
  monkeypatch.setattr(opq, "_pre", counted_pre)
  r = recipes.get("mxfp4")

  def loss(x, w1, w2, key):
    k1, k2 = jax.random.split(key)
    h = dot_general(x, w1, DN2, r, key=k1)
    return dot_general(h, w2, DN2, r, key=k2).sum()

  jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1, 2)))(
      jnp.ones((8, 64)), jnp.ones((64, 64)), jnp.ones((64, 64)), jax.random.key(0))
  assert traced and set(traced.values()) == {1}, traced


def test_a_cached_operand_quantizer_follows_the_element_path_and_the_kernel_dispatch(monkeypatch):
  """The jitted operand quantizer's trace reads two things besides its arguments: whether
  `reference_arithmetic()` is on (the exact integer path) and whether impl="auto" runs the kernels.
  A trace made under one must not serve the other: each change traces anew, and the reference
  trace takes the integer path (no float multiply by the group's factor: `fast_elements` is not
  called)."""
  from lpjax import quant
  from lpjax.quant.codec import fast_elements, qarray

  jax.clear_caches()
  op = recipes.get("mxfp4_naive").fwd.lhs
  x = jnp.linspace(-3.0, 3.0, 64 * 32).reshape(64, 32)
  fast_calls = []
  real_round = fast_elements.round_magnitude
  monkeypatch.setattr(fast_elements, "round_magnitude",
                      lambda *a, **k: fast_calls.append(1) or real_round(*a, **k))

  traces = []
  real_pre = opq._pre
  monkeypatch.setattr(opq, "_pre", lambda *a: traces.append(1) or real_pre(*a))

  def traced_fresh():  # traces opq.fake (a fresh outer lambda) and says whether _fake traced anew
    before = len(traces)
    y = jax.jit(lambda x: opq.fake(x, op, axis=-1, key=None))(x)
    return len(traces) > before, y

  fresh, y_fast = traced_fresh()
  assert fresh and fast_calls
  assert traced_fresh()[0] is False  # same shape and context: the cached trace
  fast_calls.clear()
  with quant.reference_arithmetic():
    fresh, y_ref = traced_fresh()
  assert fresh and not fast_calls  # the integer path, traced anew
  np.testing.assert_array_equal(np.asarray(y_ref), np.asarray(y_fast))  # the same bits
  monkeypatch.setattr(qarray, "_auto_uses_kernels", lambda: True)
  assert traced_fresh()[0]  # the dispatch changed: traced anew
