"""lpjax.nn: QDense / QEinsum / QConv run the recipe their policy picks, with keys from their stream."""

import doctest
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lpjax.nn
import lpjax.nn._layers
from lpjax.nn import QConv, QDense, QEinsum, apply_policy
from lpjax.quant import recipes
from lpjax.quant.gemm.conv import conv_general_dilated
from lpjax.quant.gemm.einsum import einsum
from lpjax.quant.gemm.dot_general import dot_general
from lpjax.quant import QuantPolicy

DN = (((1,), (0,)), ((), ()))


def _x(shape, seed=0):
  return jax.random.normal(jax.random.key(seed), shape)


@nnx.jit
def call(module, *args, **kwargs):
  return module(*args, **kwargs)


@nnx.jit
def capture(module, *args):
  return nnx.capture(module, nnx.Intermediate)(*args)


def test_qdense_is_dot_general_with_the_layer_params():
  layer = QDense(64, 32, recipe="mxfp4", rngs=nnx.Rngs(params=0, quant=1))
  layer.bias[...] = _x((32,), 9)
  x, key = _x((8, 64)), jax.random.key(4)
  want = jax.jit(lambda x, w, b: dot_general(x, w, DN, "mxfp4", key=key) + b)(
      x, layer.kernel[...], layer.bias[...])
  np.testing.assert_array_equal(np.asarray(call(layer, x, key=key)), np.asarray(want))
  fp32 = QDense(64, 32, recipe="fp32", rngs=nnx.Rngs(0))
  np.testing.assert_array_equal(np.asarray(call(fp32, x)), np.asarray(x @ fp32.kernel[...] + fp32.bias[...]))


def test_the_quant_stream_gives_fresh_deterministic_keys():
  make = lambda: QDense(64, 32, recipe="mxfp4", rngs=nnx.Rngs(params=0, quant=1))
  a, b = make(), make()
  x = _x((8, 64))
  ya1, ya2, yb1 = call(a, x), call(a, x), call(b, x)
  assert not np.array_equal(np.asarray(ya1), np.asarray(ya2))  # new RHT signs on each call
  np.testing.assert_array_equal(np.asarray(ya1), np.asarray(yb1))  # same seeds, same keys
  no_stream = QDense(64, 32, recipe="mxfp4", rngs=nnx.Rngs(params=0))
  no_stream.quant_rngs = None
  with pytest.raises(ValueError, match="needs random keys"):
    no_stream(x)


def test_sr_training_step_under_nnx_jit_advances_the_stream():
  model = QDense(64, 32, recipe="mxfp4_bwd", rngs=nnx.Rngs(params=0, quant=1))
  x = _x((32, 64))

  @nnx.jit
  def grad_step(model, x):
    return nnx.grad(lambda m: jnp.sum(m(x) ** 2))(model)

  g1, g2 = grad_step(model, x), grad_step(model, x)
  k1, k2 = np.asarray(g1.kernel[...]), np.asarray(g2.kernel[...])
  assert not np.array_equal(k1, k2)  # SR with a new key per step
  exact = jax.grad(lambda w: jnp.sum((x @ w + model.bias[...]) ** 2))(model.kernel[...])
  rel = np.sum((k1 - exact) ** 2) / np.sum(np.asarray(exact) ** 2)
  assert 1e-4 < rel < 0.1  # quantized, but close


def test_stats_are_captured_and_change_nothing():
  x = _x((16, 64))
  plain = QDense(64, 32, recipe="mxfp4_naive", rngs=nnx.Rngs(params=0, quant=1))
  probed = QDense(64, 32, recipe="mxfp4_naive", collect_stats=True, rngs=nnx.Rngs(params=0, quant=1))
  y, inter = capture(probed, x)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(call(plain, x)))
  (stats,) = inter["quant_stats"]
  assert set(stats) == {"lhs", "rhs"}
  assert set(stats["lhs"]) == {"amax", "frac_saturated", "frac_flushed", "snr_db"}
  assert 15 < float(stats["lhs"]["snr_db"]) < 22  # MXFP4 RTN on N(0,1): ~18.8 dB
  assert float(stats["lhs"]["amax"]) == pytest.approx(float(jnp.abs(x).max()))


class TinyBlock(nnx.Module):
  def __init__(self, rngs):
    self.up = QDense(32, 64, rngs=rngs)
    self.down = QDense(64, 32, rngs=rngs)


class TinyLM(nnx.Module):
  def __init__(self, rngs):
    self.layers = nnx.List([TinyBlock(rngs) for _ in range(3)])
    self.lm_head = QDense(32, 16, rngs=rngs)

  def __call__(self, x):
    for block in self.layers:
      x = x + block.down(jax.nn.relu(block.up(x)))
    return self.lm_head(x)


def test_apply_policy_sets_paths_and_recipes():
  model = TinyLM(nnx.Rngs(params=0, quant=1))
  policy = QuantPolicy(recipe="mxfp4_naive", keep_last_blocks=1, num_blocks=3)
  table = dict(apply_policy(model, policy))
  assert table == {"layers/0/up": "mxfp4_naive", "layers/0/down": "mxfp4_naive",
                   "layers/1/up": "mxfp4_naive", "layers/1/down": "mxfp4_naive",
                   "layers/2/up": "auto", "layers/2/down": "auto", "lm_head": "auto"}
  assert model.layers[1].up.active_recipe() is recipes.get("mxfp4_naive")
  apply_policy(model, policy.with_recipe("bf16"))  # the precision schedule's switch
  assert model.layers[1].up.active_recipe() is recipes.get("bf16")


def test_recipe_as_static_argument_compiles_once_per_recipe():
  model = TinyLM(nnx.Rngs(params=0, quant=1))
  policy = QuantPolicy(recipe="mxfp4_naive")
  apply_policy(model, policy)
  graphdef, state = nnx.split(model)
  traces = []

  @functools.partial(jax.jit, static_argnames="recipe")
  def forward(state, x, recipe):
    traces.append(recipe)
    model = nnx.merge(graphdef, state)
    apply_policy(model, policy.with_recipe(recipe))
    return model(x)

  x = _x((4, 32))
  y_lp1, y_lp2 = forward(state, x, recipe=None), forward(state, x, recipe=None)
  y_hp1, y_hp2 = forward(state, x, recipe="bf16"), forward(state, x, recipe="bf16")
  assert traces == [None, "bf16"]  # one trace (and compilation) per distinct recipe
  np.testing.assert_array_equal(np.asarray(y_lp1), np.asarray(y_lp2))
  assert not np.array_equal(np.asarray(y_lp1), np.asarray(y_hp1))


def test_qeinsum_with_and_without_kernel():
  layer = QEinsum("bsd,dhk->bshk", (32, 4, 8), (4, 8), recipe="mxfp4_naive", rngs=nnx.Rngs(0))
  x = _x((2, 5, 32))
  want = jax.jit(lambda x, k, b: einsum("bsd,dhk->bshk", x, k, recipe="mxfp4_naive") + b)(
      x, layer.kernel[...], layer.bias[...])
  np.testing.assert_array_equal(np.asarray(call(layer, x)), np.asarray(want))
  scores = QEinsum("bhqd,bhkd->bhqk", recipe="mxfp4_naive", collect_stats=True, rngs=nnx.Rngs(0))
  q, k = _x((2, 4, 6, 32), 1), _x((2, 4, 7, 32), 2)
  y, inter = capture(scores, q, k)
  want = jax.jit(lambda q, k: einsum("bhqd,bhkd->bhqk", q, k, recipe="mxfp4_naive"))(q, k)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(want))
  assert set(inter["quant_stats"][0]) == {"lhs", "rhs"}
  with pytest.raises(TypeError):
    scores(q)


def test_qconv_matches_conv_and_nnx_conv():
  layer = QConv(16, 8, (3, 3), strides=2, recipe="mxfp4_naive", rngs=nnx.Rngs(0))
  x = _x((2, 9, 9, 16))
  want = jax.jit(lambda x, k, b: conv_general_dilated(
      x, k, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), recipe="mxfp4_naive") + b)(
          x, layer.kernel[...], layer.bias[...])
  np.testing.assert_array_equal(np.asarray(call(layer, x)), np.asarray(want))
  ref = nnx.Conv(16, 8, (3, 3), strides=2, precision=jax.lax.Precision.HIGHEST, rngs=nnx.Rngs(0))
  fp32 = QConv(16, 8, (3, 3), strides=2, recipe="fp32", rngs=nnx.Rngs(0))
  np.testing.assert_allclose(np.asarray(call(fp32, x)), np.asarray(call(ref, x)), rtol=1e-5, atol=1e-5)
  probed = QConv(16, 8, (3, 3), recipe="mxfp4_naive", collect_stats=True, rngs=nnx.Rngs(0))
  _, inter = capture(probed, x)
  assert 15 < float(inter["quant_stats"][0]["lhs"]["snr_db"]) < 25


@pytest.mark.parametrize("module", [lpjax.nn, lpjax.nn._layers], ids=["nn", "layers"])
def test_docstring_examples_run(module):
  result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
  assert result.attempted > 0 and result.failed == 0
