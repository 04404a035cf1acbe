"""The trainer's optimizers decay the same tensors whatever the optimizer (matrices only)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax.train.config import llama_config
from lpjax.train._optimizers import make_optimizer


@pytest.mark.parametrize("name", ["adamw", "spam", "stable_spam"])
def test_weight_decay_applies_to_matrices_only_for_every_optimizer(name):
  c = llama_config("tiny", optimizer=name)
  c.steps, c.optimizer.warmup_steps, c.optimizer.weight_decay = 10, 0, 0.1
  c.optimizer.grad_clip = 0.0
  tx = make_optimizer(c)
  params = {"kernel": jnp.ones((4, 4)), "scale": jnp.ones((4,))}
  zeros = jax.tree.map(jnp.zeros_like, params)  # no gradient: only weight decay can move a weight
  updates, _ = tx.update(zeros, tx.init(params), params)
  assert np.all(np.asarray(updates["scale"]) == 0.0)
  assert np.all(np.asarray(updates["kernel"]) < 0.0)  # decayed toward zero
