"""DynamicLossScale, skip_nonfinite and the adaptive gradient scaler."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lpjax import optim


def test_dynamic_loss_scale_defaults():
  ls = optim.DynamicLossScale()
  assert float(ls.loss_scale) == 2.0**15
  assert ls.period == 2000 and ls.factor == 2.0
  assert int(ls.counter) == 0


def test_dynamic_loss_scale_grows_after_period_finite_steps():
  adjust = jax.jit(lambda ls, finite: ls.adjust(finite))
  ls = optim.DynamicLossScale()
  for _ in range(1999):
    ls = adjust(ls, jnp.array(True))
  assert float(ls.loss_scale) == 2.0**15 and int(ls.counter) == 1999
  ls = adjust(ls, jnp.array(True))  # the 2000th finite step
  assert float(ls.loss_scale) == 2.0**16 and int(ls.counter) == 0
  ls = adjust(ls, jnp.array(True))
  assert float(ls.loss_scale) == 2.0**16 and int(ls.counter) == 1


def test_dynamic_loss_scale_halves_and_restarts_the_count_on_nonfinite():
  ls = optim.DynamicLossScale(period=3)
  ls = ls.adjust(jnp.array(True)).adjust(jnp.array(True))
  ls = ls.adjust(jnp.array(False))
  assert float(ls.loss_scale) == 2.0**14 and int(ls.counter) == 0
  # Growing needs `period` finite steps counted from the non-finite one.
  ls = ls.adjust(jnp.array(True)).adjust(jnp.array(True))
  assert float(ls.loss_scale) == 2.0**14
  ls = ls.adjust(jnp.array(True))
  assert float(ls.loss_scale) == 2.0**15
  small = optim.DynamicLossScale(loss_scale=jnp.float32(1.0))
  assert float(small.adjust(jnp.array(False)).loss_scale) == 1.0  # min_loss_scale


def test_dynamic_loss_scale_is_a_pytree():
  ls = optim.DynamicLossScale(period=7)
  leaves, treedef = jax.tree.flatten(ls)
  assert len(leaves) == 2
  assert jax.tree.unflatten(treedef, leaves).period == 7


def test_skip_nonfinite_keeps_state_and_params():
  inner = optim.stable_spam(1e-2, reset_interval=3)
  tx = optim.skip_nonfinite(inner)
  params = {"w": jnp.ones((4, 4)), "b": jnp.zeros(4)}
  grads = {"w": jnp.full((4, 4), 0.5), "b": jnp.ones(4)}
  bad = {"w": grads["w"].at[0, 0].set(jnp.inf), "b": grads["b"]}
  state = tx.init(params)
  step = jax.jit(tx.update)
  updates, state1 = step(grads, state, params)
  want, _ = inner.update(grads, inner.init(params), params)
  np.testing.assert_allclose(updates["w"], want["w"], rtol=1e-6)
  skipped_updates, state2 = step(bad, state1, params)
  assert all(bool(jnp.all(u == 0)) for u in jax.tree.leaves(skipped_updates))
  assert int(state2.skipped) == 1 and not bool(state2.last_finite)
  for a, b in zip(jax.tree.leaves(state2.inner_state), jax.tree.leaves(state1.inner_state)):
    assert np.array_equal(np.asarray(a), np.asarray(b))
  nan = {"w": grads["w"] * jnp.nan, "b": grads["b"]}
  _, state3 = step(nan, state2, params)
  assert int(state3.skipped) == 2


def _fp16_train_step(tx, loss_fn):
  """A mixed-precision step: fp32 params, the backward pass in float16."""

  @jax.jit
  def step(params, opt_state, loss_scale, batch):
    grads = jax.grad(lambda p: loss_scale.scale(loss_fn(p, batch)))(params)
    grads = loss_scale.unscale(grads)
    finite = optim.all_finite(grads)
    loss_scale = loss_scale.adjust(finite)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss_scale, grads

  return step


def test_loss_scaling_keeps_small_fp16_gradients_from_underflowing():
  # d loss / d x = 1e-8 per element: below the smallest float16 subnormal (6e-8). The
  # factors come in as data (XLA may fold constant factors into one that underflows).
  loss_fn = lambda p, a: jnp.sum(p["x"].astype(jnp.float16) * a) * a[0]
  batch = jnp.full(8, 1e-4, jnp.float16)
  params = {"x": jnp.ones(8, jnp.float32)}
  tx = optim.skip_nonfinite(optax.sgd(1.0))
  step = _fp16_train_step(tx, loss_fn)
  unscaled = optim.DynamicLossScale(loss_scale=jnp.float32(1.0))
  _, _, _, grads = step(params, tx.init(params), unscaled, batch)
  assert float(jnp.max(jnp.abs(grads["x"]))) == 0.0
  _, _, _, grads = step(params, tx.init(params), optim.DynamicLossScale(), batch)
  np.testing.assert_allclose(grads["x"], 1e-8, rtol=2e-2)


def test_loss_scaling_skips_overflowing_steps_until_the_scale_fits():
  # d loss / d x = 10 per element: 10 * 2^13 overflows float16 (max 65504), 10 * 2^12 fits.
  loss_fn = lambda p, a: jnp.sum(p["x"].astype(jnp.float16) * a)
  batch = jnp.full(8, 10.0, jnp.float16)
  params = {"x": jnp.ones(8, jnp.float32)}
  tx = optim.skip_nonfinite(optim.stable_spam(1e-2))
  step = _fp16_train_step(tx, loss_fn)
  opt_state, loss_scale = tx.init(params), optim.DynamicLossScale()
  history = []
  for _ in range(6):
    new_params, opt_state, loss_scale, _ = step(params, opt_state, loss_scale, batch)
    history.append((float(loss_scale.loss_scale), bool(jnp.all(new_params["x"] == params["x"]))))
    params = new_params
  assert [s for s, _ in history] == [2.0**14, 2.0**13, 2.0**12, 2.0**12, 2.0**12, 2.0**12]
  assert [unchanged for _, unchanged in history] == [True, True, True, False, False, False]
  assert int(opt_state.skipped) == 3
  inner = opt_state.inner_state[0]
  assert int(inner.count) == 3  # the optimizer saw only the three finite steps


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_adaptive_gradient_scaler_grows_shrinks_and_holds(dtype):
  tx = optim.scale_by_adaptive_gradient_scaler()
  step = jax.jit(tx.update)
  state = tx.init(None)
  tiny = jnp.full((4,), 1e-7, dtype)
  scales = []
  for _ in range(3):
    updates, state = step(tiny, state)
    scales.append(float(state.scale))
  assert updates.dtype == dtype
  np.testing.assert_allclose(scales, [3.0, 4.5, 6.75])
  np.testing.assert_allclose(updates.astype(jnp.float32), 4.5 * 1e-7, rtol=1e-2)
  updates, state = step(jnp.full((4,), 100.0, dtype), state)  # norm 2700 > high
  np.testing.assert_allclose(float(state.scale), 6.75 * 0.8, rtol=1e-6)
  held = float(state.scale)
  updates, state = step(jnp.full((4,), 0.1, dtype), state)  # scaled norm ~1: in range
  assert float(state.scale) == held
  _, state = step(jnp.array([jnp.nan, 1, 1, 1], dtype), state)
  np.testing.assert_allclose(float(state.scale), held * 0.8, rtol=1e-6)


def test_adaptive_gradient_scaler_uses_the_global_norm():
  tx = optim.scale_by_adaptive_gradient_scaler(initial=1.0, low=1.0, high=2.0)
  # Each leaf alone has norm 0.8 < low, together sqrt(2) * 0.8 > 1: no growth.
  updates = {"a": jnp.array([0.8]), "b": jnp.array([0.8])}
  _, state = tx.update(updates, tx.init(updates))
  assert float(state.scale) == 1.0
