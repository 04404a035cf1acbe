"""The 4-layer MLP with a planted outlier site that tests/quant/test_monitor.py and
test_monitor_advisor.py measure (one module, so that both files build the same model)."""

import jax
import jax.numpy as jnp
import numpy as np

D = 64
OUTLIER_CHANNELS = (3, 17, 40)


def mlp_params(key, outlier: bool):
  ks = jax.random.split(key, 4)
  p = {f"l{i}": {"kernel": jax.random.normal(ks[i], (D, D)) / np.sqrt(D)} for i in range(4)}
  if outlier:  # massive activations in a few channels of l2's input, small weights there
    p["l2"]["kernel"] = p["l2"]["kernel"] / outlier_scale()[:, None]
  return p


def outlier_scale():
  s = np.ones(D, np.float32)
  s[list(OUTLIER_CHANNELS)] = 1000.0
  return s


def mlp_loss(params, batch, outlier=True):
  x, y = batch
  h = x
  for i in range(4):
    if i == 2 and outlier:
      h = h * outlier_scale()
    h = h @ params[f"l{i}"]["kernel"]
    if i < 3:
      h = jnp.tanh(h)
  return jnp.mean((h - y) ** 2)


def mlp_batch(seed=1, n=64):
  kx, ky = jax.random.split(jax.random.key(seed))
  return jax.random.normal(kx, (n, D)), jax.random.normal(ky, (n, D))
