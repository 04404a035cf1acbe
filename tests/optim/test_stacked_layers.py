"""Stable-SPAM on stacked layers (a scanned model's leading layer axis): each layer is its own
tensor of the rule, exactly as when the layers are separate tensors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lpjax import optim

LAYERS = 3


def _grads(step):
  """Stacked gradients whose layers differ in scale by 100x (so shared statistics would differ),
  with a spike in layer 1 at step 4."""
  key = jax.random.fold_in(jax.random.key(0), step)
  w = jax.random.normal(key, (LAYERS, 8, 16)) * jnp.array([1.0, 100.0, 0.01])[:, None, None]
  if step == 4:
    w = w.at[1, 2, 3].set(1e5)
  return {"stack": w, "head": jax.random.normal(jax.random.fold_in(key, 1), (16, 4))}


def _split(tree):
  """The same gradients with the stack as separate per-layer tensors."""
  return {"head": tree["head"], **{f"layer{l}": tree["stack"][l] for l in range(LAYERS)}}


def _run(tx, grads_of_step, steps=6):
  params = grads_of_step(0)
  state = tx.init(params)
  updates = []
  for step in range(1, steps + 1):
    u, state = jax.jit(tx.update)(grads_of_step(step), state, params)
    updates.append(u)
  return updates, state


@pytest.mark.parametrize("flags", ["tree", "callable"])
def test_stacked_layers_equal_separate_tensors(flags):
  kwargs = dict(reset_interval=4)  # a reset inside the run
  stacked = {"stack": True, "head": False}
  mark = stacked if flags == "tree" else (lambda p: {"stack": True, "head": False})
  up_stacked, st_stacked = _run(optim.scale_by_stable_spam(stacked_layers=mark, **kwargs), _grads)
  up_split, st_split = _run(optim.scale_by_stable_spam(**kwargs), lambda s: _split(_grads(s)))
  for a, b in zip(up_stacked, up_split):
    np.testing.assert_allclose(a["head"], b["head"], rtol=1e-6)
    for l in range(LAYERS):
      # Adam's updates are O(1); the vmapped and the separate programs round differently (XLA
      # fuses them differently, by a few ulps of 1 on some CPUs), which is large relative to an
      # update whose moments nearly cancel: hence an absolute bound of about 8 ulps of 1.
      np.testing.assert_allclose(a["stack"][l], b[f"layer{l}"], rtol=1e-5, atol=1e-6)
  assert st_stacked.max_ema["stack"].shape == (LAYERS,) and st_stacked.max_ema["head"].shape == ()
  for l in range(LAYERS):
    for name in ("max_ema", "norm_ema", "norm_sq_ema"):
      np.testing.assert_allclose(getattr(st_stacked, name)["stack"][l],
                                 getattr(st_split, name)[f"layer{l}"], rtol=1e-6)


def test_shared_statistics_differ_from_per_layer_ones():
  """Without the flag the stack is one tensor: its norm and max mix the layers (the check that the
  test above can fail)."""
  up_flag, _ = _run(optim.scale_by_stable_spam(stacked_layers={"stack": True, "head": False}),
                    _grads)
  up_one, _ = _run(optim.scale_by_stable_spam(), _grads)
  assert not np.allclose(up_flag[-1]["stack"], up_one[-1]["stack"], rtol=1e-3)


def test_bf16_moments_of_stacked_layers_use_one_key_per_layer():
  tx = optim.scale_by_stable_spam(stacked_layers={"stack": True, "head": False},
                                  mu_dtype=jnp.bfloat16, nu_dtype=jnp.bfloat16)
  _, state = _run(tx, _grads, steps=1)
  assert state.mu["stack"].dtype == jnp.bfloat16 and state.nu["stack"].dtype == jnp.bfloat16
  # One SR step leaves the moments within one bf16 ulp (2**-7 relative) of the float32 run's.
  _, ref = _run(optim.scale_by_stable_spam(stacked_layers={"stack": True, "head": False}), _grads,
                steps=1)
  m, m_ref = np.asarray(state.mu["stack"], np.float32), np.asarray(ref.mu["stack"])
  assert np.all(np.abs(m - m_ref) <= np.abs(m_ref) * 2.0**-7)
  # Layers draw different bits: rounding directions of identical values differ between layers.
  tx_same = optim.scale_by_stable_spam(stacked_layers={"stack": True},
                                       mu_dtype=jnp.bfloat16, nu_dtype=jnp.float32)
  g = {"stack": jnp.broadcast_to(jnp.linspace(1.0, 1.01, 512)[None], (LAYERS, 512))}
  _, s = tx_same.update(g, tx_same.init(g))
  mu = np.asarray(s.mu["stack"], np.float32)
  assert not np.array_equal(mu[0], mu[1])


def test_bad_stacked_layers_name_the_problem():
  with pytest.raises(ValueError, match="scalar"):
    optim.scale_by_stable_spam(stacked_layers={"a": True}).init({"a": jnp.zeros(())})
  with pytest.raises(ValueError, match="structure of the params"):
    optim.scale_by_stable_spam(stacked_layers={"b": True}).init({"a": jnp.zeros(3)})
