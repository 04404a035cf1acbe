"""One harness, run for optax.adam (the baseline) and for lpjax's spam and stable_spam.

Checks, for every optimizer: jit == no-jit, dtype preservation (bf16/f32/f64), stable state
shapes and dtypes, ``optax.inject_hyperparams``, no recompilation across steps (resets
included), and sharded params on 8 CPU devices giving the updates of unsharded ones.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from lpjax import optim

# Small reset intervals and schedules so that a few steps cross resets and cosine factors.
OPTIMIZERS = {
    "adam": (optax.adam, dict(learning_rate=1e-2)),
    "spam": (optim.spam, dict(learning_rate=1e-2, reset_interval=4, reset_warmup_steps=2,
                              clip_free_steps=2, spike_threshold=20.0)),
    "stable_spam": (optim.stable_spam, dict(learning_rate=1e-2, reset_interval=4,
                                            total_steps=5, weight_decay=0.1)),
    "stable_spam_bf16_state": (optim.stable_spam, dict(
        learning_rate=1e-2, reset_interval=4, mu_dtype=jnp.bfloat16, nu_dtype=jnp.bfloat16)),
}
NAMES = list(OPTIMIZERS)
NUM_STEPS = 6  # crosses a reset at step 4


def make(name, **overrides):
  factory, kwargs = OPTIMIZERS[name]
  return factory(**{**kwargs, **overrides})


def make_params(dtype=jnp.float32):
  key = jax.random.key(0)
  k1, k2, k3 = jax.random.split(key, 3)
  return {
      "vec": jax.random.normal(k1, (8,), dtype),
      "mat": jax.random.normal(k2, (16, 8), dtype),
      "cube": jax.random.normal(k3, (2, 4, 8), dtype),
      "one": jnp.ones((1,), dtype),
  }


def loss_fn(params):
  """A quadratic with a different curvature per tensor, so the gradients differ."""
  total = 0.0
  for i, leaf in enumerate(jax.tree.leaves(params)):
    total = total + (i + 1) * jnp.sum(jnp.square(leaf.astype(jnp.float32) - 0.5))
  return total


def make_step(tx, trace_counter=None):
  def step(params, state):
    if trace_counter is not None:
      trace_counter.append(1)
    grads = jax.grad(loss_fn)(params)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, updates
  return step


def run(tx, params, num_steps=NUM_STEPS, jit=True):
  step = make_step(tx)
  step = jax.jit(step) if jit else step
  state = tx.init(params)
  for _ in range(num_steps):
    params, state, _ = step(params, state)
  return params, state


def shapes_and_dtypes(tree):
  return jax.tree.map(lambda x: (jnp.shape(x), jnp.result_type(x)), tree)


@pytest.mark.parametrize("name", NAMES)
def test_jit_matches_no_jit_and_decreases_loss(name):
  tx = make(name)
  params = make_params()
  jitted, _ = run(tx, params, jit=True)
  eager, _ = run(tx, params, jit=False)
  for a, b in zip(jax.tree.leaves(jitted), jax.tree.leaves(eager)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert float(loss_fn(jitted)) < float(loss_fn(params))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
def test_preserves_dtype_and_state_structure(name, dtype):
  with jax.enable_x64(dtype == "float64"):
    dtype = jnp.dtype(dtype)
    tx = make(name)
    params = make_params(dtype)
    state0 = tx.init(params)
    plain_step = make_step(tx)

    # lax.cond needs both branches to have the same types: the update must be type-stable
    # (state in == state out, weak types included) for this to trace at all.
    @jax.jit
    def step(params, state, skip=jnp.asarray(False)):
      keep = lambda: (params, state, jax.tree.map(jnp.zeros_like, params))
      return jax.lax.cond(skip, keep, lambda: plain_step(params, state))

    params1, state1, updates = step(params, state0)
    for u, p in zip(jax.tree.leaves(updates), jax.tree.leaves(params)):
      assert u.dtype == p.dtype
    assert all(p.dtype == dtype for p in jax.tree.leaves(params1))
    # The state keeps its tree, shapes, dtypes (and weak types) across steps.
    _, state2, _ = step(params1, state1)
    assert jax.tree.structure(state0) == jax.tree.structure(state2)
    assert shapes_and_dtypes(state0) == shapes_and_dtypes(state2)
    assert [jax.typeof(x).weak_type for x in jax.tree.leaves(state0)] == [
        jax.typeof(x).weak_type for x in jax.tree.leaves(state2)]


@pytest.mark.parametrize("name", NAMES)
def test_state_shapes_are_stable(name):
  tx = make(name)
  params = make_params()
  abstract = jax.eval_shape(tx.init, params)
  _, state = run(tx, params)
  assert shapes_and_dtypes(abstract) == shapes_and_dtypes(state)
  if name.startswith("stable_spam"):
    is_state = lambda x: isinstance(x, optim.ScaleByStableSpamState)
    (inner,) = [x for x in jax.tree.leaves(state, is_leaf=is_state) if is_state(x)]
    # Per-tensor statistics are scalars, the moments have the params' shapes.
    assert all(x.shape == () for x in jax.tree.leaves(inner.max_ema))
    assert jax.tree.map(jnp.shape, inner.mu) == jax.tree.map(jnp.shape, params)
    want = jnp.bfloat16 if name.endswith("bf16_state") else jnp.float32
    assert all(x.dtype == want for x in jax.tree.leaves((inner.mu, inner.nu)))


@pytest.mark.parametrize("name", NAMES)
def test_inject_hyperparams_gives_the_same_updates(name):
  factory, kwargs = OPTIMIZERS[name]
  tx = factory(**kwargs)
  # Dtypes such as jnp.bfloat16 are callables, which inject_hyperparams takes for schedules.
  static = [k for k in ("mu_dtype", "nu_dtype") if k in kwargs]
  injected = optax.inject_hyperparams(factory, static_args=static)(**kwargs)
  params = make_params()
  want, want_state = run(tx, params)
  got, got_state = run(injected, params)
  # Injected hyperparameters are float32 arrays (1 - b2 rounds differently from Python's),
  # which can flip a stochastic rounding of bf16 state by one bf16 ulp.
  rtol = 1e-3 if name.endswith("bf16_state") else 1e-5
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-6)
  # The numeric hyperparameters really are injected (traced) values.
  assert "learning_rate" in got_state.hyperparams
  if name != "adam":
    assert "reset_interval" in got_state.hyperparams


@pytest.mark.parametrize("name", ["spam", "stable_spam"])
def test_injected_learning_rate_can_be_changed(name):
  factory, kwargs = OPTIMIZERS[name]
  tx = optax.inject_hyperparams(factory)(**kwargs)
  params = make_params()
  state = tx.init(params)
  grads = jax.grad(loss_fn)(params)
  small, _ = tx.update(grads, state, params)
  state.hyperparams["learning_rate"] = jnp.asarray(2e-2)
  large, _ = tx.update(grads, state, params)
  np.testing.assert_allclose(large["mat"], 2 * small["mat"], rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_no_recompilation_across_steps(name):
  tx = make(name)
  traces = []
  step = jax.jit(make_step(tx, traces))
  params = make_params()
  state = tx.init(params)
  for _ in range(2 * NUM_STEPS):  # several resets and the cosine factor past total_steps
    params, state, _ = step(params, state)
  assert len(traces) == 1


SHARDING_CASES = [(name, "auto") for name in NAMES] + [
    ("spam", "explicit"), ("stable_spam", "explicit")]


@pytest.mark.parametrize("name,axis_type", SHARDING_CASES)
def test_sharded_params_give_the_unsharded_updates(name, axis_type):
  assert jax.device_count() == 8
  axis_type = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}[axis_type]
  mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2)
  specs = {"vec": P("data"), "mat": P("data", "model"), "cube": P(None, "model", "data"),
           "one": P()}
  tx = make(name)
  params = make_params()
  # Spikes confined to one shard: a per-shard max or norm would clip differently.
  grads_stream = []
  for i in range(NUM_STEPS):
    g = jax.tree.map(lambda x: jax.random.normal(jax.random.key(i), x.shape), params)
    g["mat"] = g["mat"].at[1, 1].multiply(1e3 if i % 2 else 1.0)
    grads_stream.append(g)

  def run_stream(params, shardings=None):
    step = jax.jit(lambda p, s, g: tx.update(g, s, p))
    if shardings is not None:
      params = jax.device_put(params, shardings)
    state = jax.jit(tx.init)(params)
    outputs = []
    for g in grads_stream:
      if shardings is not None:
        g = jax.device_put(g, shardings)
      updates, state = step(params, state, g)
      params = optax.apply_updates(params, updates)
      outputs.append(updates)
    return outputs, state

  shardings = {k: NamedSharding(mesh, spec) for k, spec in specs.items()}
  with jax.set_mesh(mesh):
    sharded, sharded_state = run_stream(params, shardings)
  unsharded, unsharded_state = run_stream(params)
  for got, want in zip(sharded, unsharded):
    for k in specs:
      np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-7)
  # The updates really were computed on shards.
  assert sharded[-1]["mat"].sharding.is_equivalent_to(shardings["mat"], 2)
  assert len(sharded[-1]["mat"].sharding.device_set) == 8
  for a, b in zip(jax.tree.leaves(sharded_state), jax.tree.leaves(unsharded_state)):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                               rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("factory", [optim.stable_spam, optim.spam])
def test_weight_decay_mask_and_string_dtypes(factory):
  params = {"w": jnp.ones((4, 4)), "norm": jnp.ones(4)}
  zero_grads = jax.tree.map(jnp.zeros_like, params)
  mask = {"w": True, "norm": False}
  tx = factory(learning_rate=0.1, weight_decay=0.5, weight_decay_mask=mask)
  updates, _ = tx.update(zero_grads, tx.init(params), params)
  np.testing.assert_allclose(updates["w"], -0.05, rtol=1e-6)  # -lr * wd * p
  np.testing.assert_allclose(updates["norm"], 0.0)
  # Dtypes given as strings pass through inject_hyperparams without static_args.
  injected = optax.inject_hyperparams(factory)(
      learning_rate=0.1, mu_dtype="bfloat16", nu_dtype="bfloat16")
  state = injected.init(params)
  _, state = injected.update(jax.tree.map(jnp.ones_like, params), state, params)
  moments = [x for x in jax.tree.leaves(state.inner_state) if x.shape == (4, 4)]
  assert len(moments) == 2 and all(x.dtype == jnp.bfloat16 for x in moments)
