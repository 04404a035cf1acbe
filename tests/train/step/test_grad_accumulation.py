"""Gradient accumulation over microbatches: the bfloat16 accumulator (stochastic rounding)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from lpjax.train.step._step import accumulate, init_state, make_train_step


def test_float32_accumulator_is_a_plain_sum():
  total = {"a": jnp.array([1.0, -2.0]), "b": jnp.array(3.0)}
  grads = {"a": jnp.array([0.5, 0.25], jnp.bfloat16), "b": jnp.array(-1.0)}
  out = accumulate(total, grads, jax.random.key(0))
  assert out["a"].dtype == jnp.float32
  np.testing.assert_array_equal(out["a"], [1.5, -1.75])
  np.testing.assert_array_equal(out["b"], 2.0)


def test_bf16_accumulator_rounds_each_sum_to_a_neighbour_and_is_unbiased():
  rng = np.random.default_rng(0)
  n = 1 << 16
  total = rng.normal(size=n).astype(ml_dtypes.bfloat16)
  grads = (rng.normal(size=n) * 1e-3).astype(np.float32)
  out = np.asarray(accumulate({"g": jnp.asarray(total)}, {"g": jnp.asarray(grads)},
                              jax.random.key(1))["g"]).astype(np.float32)
  exact = total.astype(np.float32) + grads  # float32 sum, exact enough here (numpy reference)
  down = exact.astype(ml_dtypes.bfloat16).astype(np.float32)
  # every result is one of the two bf16 neighbours of the exact sum
  bits = exact.view(np.uint32)
  lo = (bits & 0xFFFF0000).view(np.float32)
  hi = np.where(bits & 0xFFFF, ((bits & 0xFFFF0000) + 0x10000).view(np.float32), lo)
  assert np.all((out == lo) | (out == hi))
  # unbiased: the mean error is far below round-to-nearest's systematic loss of small grads
  ulp = np.abs(hi - lo)
  assert abs(np.mean(out - exact)) < 4 * np.sqrt(np.mean(ulp ** 2) / 4 / n)
  assert np.mean(out != down) > 0.1  # it does round up or down at random, not to nearest


def _sum_of_weights_step(accum_dtype):
  n, k = 16384, 8
  loss_fn = lambda p, ms, batch, key, policy: (jnp.sum(p["w"] * batch["x"].mean(0)), (ms, {}))
  tx = optax.sgd(1.0)
  state = init_state({"w": jnp.zeros((n,), jnp.float32)}, None, tx)
  step = jax.jit(make_train_step(loss_fn, tx, grad_accum_steps=k, grad_accum_dtype=accum_dtype),
                 static_argnums=3)
  # each microbatch's gradient is 1 + 2^-10 x its index: below a bf16 ulp of the running sum
  x = jnp.tile((1 + 2.0**-10 * jnp.arange(k))[:, None], (1, n)).astype(jnp.float32)
  rows = jnp.swapaxes(x.reshape(k, 1, n), 0, 1).reshape(k, n)  # row i is microbatch i
  state, _ = step(state, {"x": rows}, jax.random.key(0), None)
  return -np.asarray(state.params["w"])  # sgd(1): w = -mean gradient


def test_bf16_accumulation_matches_float32_on_average():
  exact = np.mean(1 + 2.0**-10 * np.arange(8))  # the mean of the microbatches' gradients
  f32 = _sum_of_weights_step("float32")
  np.testing.assert_allclose(f32, exact, rtol=1e-6)
  bf16 = _sum_of_weights_step("bfloat16")
  assert len(set(bf16.tolist())) > 1  # stochastic
  # unbiased: the sums reach 8, where bf16's ulp is 2^-5 and each microbatch's 2^-10 x index part
  # is below it; the mean over 16384 weights is within ~3e-5 (about 6 sigma below the bound),
  # while round-to-nearest sums would lose all of it (1.0 instead of 1.0034: 3.4e-3)
  assert abs(bf16.mean() - exact) < 2e-4 * exact


def test_unknown_accumulator_dtype_is_named():
  with pytest.raises(ValueError, match="grad_accum_dtype"):
    make_train_step(lambda *a: None, optax.sgd(1.0), grad_accum_dtype="float16")


@pytest.mark.parametrize("accum_dtype", ["float32", "bfloat16"])
def test_the_microbatch_loop_carries_accumulators_of_that_dtype(accum_dtype):
  """What halves the accumulators' memory: the loop over microbatches carries them in bfloat16
  (the gradients of float32 parameters included), and the step still returns float32 params."""
  loss_fn = lambda p, ms, batch, key, policy: (jnp.sum(p["w"] * batch["x"].mean(0)), (ms, {}))
  tx = optax.sgd(1.0)
  state = init_state({"w": jnp.zeros((64, 32), jnp.float32)}, None, tx)
  step = make_train_step(loss_fn, tx, grad_accum_steps=4, grad_accum_dtype=accum_dtype)
  jaxpr = jax.make_jaxpr(step, static_argnums=3)(state, {"x": jnp.ones((8, 64, 32))},
                                                 jax.random.key(0), None)
  scan = next(e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan")
  carried = [v.aval for v in scan.outvars[:scan.params["num_carry"]] if v.aval.shape == (64, 32)]
  assert [a.dtype for a in carried] == [jnp.dtype(accum_dtype)]
  out = jax.eval_shape(step, state, {"x": jnp.ones((8, 64, 32))}, jax.random.key(0), None)
  assert out[0].params["w"].dtype == jnp.float32
