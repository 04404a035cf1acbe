"""Parity of lpjax.optim's Stable-SPAM and SPAM with independent numpy implementations (float64).

The gradient streams have spikes, zero gradients, 1-D/2-D/3-D/size-1 tensors; the runs have
weight decay, a learning-rate schedule, several momentum resets and (Stable-SPAM) a
``total_steps`` shorter than the run. Agreement is required to 1e-9 relative at every step.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lpjax import optim
from numpy_optim_reference import SpamNumpy, StableSpamNumpy

SHAPES = {"vec": (7,), "mat": (5, 6), "cube": (2, 3, 4), "one": (1,)}
NUM_STEPS = 70
RTOL = 1e-9


def lr_numpy(count):
  return 1e-2 * (0.55 + 0.45 * np.cos(np.pi * count / 50))


def lr_jax(count):
  return 1e-2 * (0.55 + 0.45 * jnp.cos(jnp.pi * count / 50))


def gradient_stream(seed=0, num_steps=NUM_STEPS, spike=1e3):
  """Gradients with drifting scales, spikes of ``spike`` x and some all-zero tensors."""
  rng = np.random.default_rng(seed)
  stream = []
  for t in range(1, num_steps + 1):
    grads = {}
    for i, (name, shape) in enumerate(SHAPES.items()):
      g = rng.normal(size=shape) * (1 + 0.5 * np.sin(t / 7 + i))
      if t % 9 == 4 or t == 2:  # spikes on a few entries
        flat = g.reshape(-1)
        flat[rng.integers(flat.size)] *= spike
      grads[name] = g
    if t == 1:
      grads["vec"] = np.zeros(SHAPES["vec"])  # zero gradient on the very first step
    if t in (3, 41):
      grads["mat"] = np.zeros(SHAPES["mat"])
    if t == 45:
      grads["one"] = np.zeros(SHAPES["one"])
    stream.append(grads)
  return stream


def initial_params(seed=1):
  rng = np.random.default_rng(seed)
  return {name: rng.normal(size=shape) for name, shape in SHAPES.items()}


def run_side_by_side(tx, reference, stream):
  """Runs ``tx`` (jitted, float64) and the numpy ``reference``; returns the max rel errors."""
  params_np = initial_params()
  errors = []
  with jax.enable_x64(True):
    params = {k: jnp.asarray(v, jnp.float64) for k, v in params_np.items()}
    state = tx.init(params)

    @jax.jit
    def step(params, state, grads):
      updates, state = tx.update(grads, state, params)
      return optax.apply_updates(params, updates), state

    for t, grads in enumerate(stream):
      params_np = reference.step(params_np, grads, lr_numpy(t))
      params, state = step(params, state, {k: jnp.asarray(v) for k, v in grads.items()})
      for name in SHAPES:
        got = np.asarray(params[name])
        assert got.dtype == np.float64
        want = params_np[name]
        errors.append(np.max(np.abs(got - want) / np.abs(want)))
  return np.array(errors)


STABLE_SPAM_CONFIG = dict(reset_interval=20, total_steps=30, eta_min=0.5)
SPAM_CONFIG = dict(spike_threshold=50.0, reset_interval=20, reset_warmup_steps=8,
                   clip_free_steps=5)


@pytest.mark.parametrize("chained_lr", [False, True])
def test_stable_spam_matches_numpy_reference(chained_lr):
  reference = StableSpamNumpy(weight_decay=0.1, **STABLE_SPAM_CONFIG)
  if chained_lr:  # lr None: decoupled decay, then the lr transform of the user
    tx = optax.chain(optim.stable_spam(weight_decay=0.1, **STABLE_SPAM_CONFIG),
                     optax.scale_by_learning_rate(lr_jax))
  else:
    tx = optim.stable_spam(lr_jax, weight_decay=0.1, **STABLE_SPAM_CONFIG)
  errors = run_side_by_side(tx, reference, gradient_stream())
  print(f"\nstable_spam (chained_lr={chained_lr}) max rel error: {errors.max():.3e}")
  assert errors.max() < RTOL
  # The stream exercised what it is meant to.
  assert reference.events["reset"] == 3
  assert reference.events["clipped_entries"] > 10
  assert reference.events["zero_norm"] == 4


def test_spam_matches_numpy_reference():
  reference = SpamNumpy(weight_decay=0.1, **SPAM_CONFIG)
  tx = optim.spam(lr_jax, weight_decay=0.1, **SPAM_CONFIG)
  errors = run_side_by_side(tx, reference, gradient_stream())
  print(f"\nspam max rel error: {errors.max():.3e}")
  assert errors.max() < RTOL
  assert reference.events["reset"] == 3
  assert reference.events["clipped_entries"] > 5
  assert reference.events["warmup_steps"] == 3 * 8


def test_spam_default_threshold_matches_numpy_reference():
  reference = SpamNumpy(reset_interval=25, reset_warmup_steps=10, clip_free_steps=20)
  tx = optim.spam(lr_jax, reset_interval=25, reset_warmup_steps=10, clip_free_steps=20)
  errors = run_side_by_side(tx, reference, gradient_stream(seed=3, spike=1e5))
  assert errors.max() < RTOL
  assert reference.events["clipped_entries"] > 0


@pytest.mark.parametrize("option", ["zero_moments_on_reset", "debias_with_global_step"])
def test_stable_spam_options_match_reference_and_differ_from_default(option):
  stream = gradient_stream(seed=2)
  reference = StableSpamNumpy(**{option: True}, **STABLE_SPAM_CONFIG)
  tx = optim.stable_spam(lr_jax, **{option: True}, **STABLE_SPAM_CONFIG)
  assert run_side_by_side(tx, reference, stream).max() < RTOL
  # Off by default: the default optimizer is far from the reference with the option on.
  reference = StableSpamNumpy(**{option: True}, **STABLE_SPAM_CONFIG)
  tx_default = optim.stable_spam(lr_jax, **STABLE_SPAM_CONFIG)
  assert run_side_by_side(tx_default, reference, stream).max() > 1e-4


def test_reset_step_uses_stale_moments_by_default():
  """On a reset step the reference updates with the old moments debiased with k = 1 (§8.6)."""
  params = {"w": jnp.ones(64)}
  grads = {"w": jnp.linspace(-1.0, 1.0, 64) + 0.1}
  default = optim.scale_by_stable_spam(reset_interval=3)
  fixed = optim.scale_by_stable_spam(reset_interval=3, zero_moments_on_reset=True)
  # A constant gradient passes AdaClip and AdaGN unchanged (up to eps), so Adam sees g.
  b1, b2 = 0.9, 0.999
  stale = (1 - b1**3) / (1 - b1) / (np.sqrt(1 - b2**3) / np.sqrt(1 - b2))
  expected = {"default": stale, "fixed": 1.0}  # fixed: a fresh Adam first step, sign(g)
  for name, tx in (("default", default), ("fixed", fixed)):
    state = tx.init(params)
    for _ in range(3):
      updates, state = tx.update(grads, state)
    np.testing.assert_allclose(updates["w"], expected[name] * np.sign(grads["w"]), rtol=1e-4)
    assert int(state.step) == 1
    stored = float(jnp.max(jnp.abs(state.mu["w"])))
    assert (stored == 0.0) == (name == "default")


def test_stable_spam_without_resets_bf16_paper_gammas_matches_numpy_reference():
  config = dict(gamma1=0.85, gamma2=0.99999, reset_interval=0)
  reference = StableSpamNumpy(**config)
  errors = run_side_by_side(optim.stable_spam(lr_jax, **config), reference, gradient_stream(4))
  assert errors.max() < RTOL
  assert reference.events["reset"] == 0 and reference.events["clipped_entries"] > 0


def test_spam_without_resets_matches_numpy_reference():
  config = dict(spike_threshold=50.0, reset_interval=None, clip_free_steps=5)
  reference = SpamNumpy(**{**config, "reset_interval": 0})
  errors = run_side_by_side(optim.spam(lr_jax, **config), reference, gradient_stream(5))
  assert errors.max() < RTOL
  assert reference.events["reset"] == 0 and reference.events["warmup_steps"] == 0
  assert reference.events["clipped_entries"] > 0
