"""Activation sharding hints: models name the logical axes of activations, the trainer maps them.

A model calls `constrain(x, ("batch", "length", "act_embed"))` on its activations. Outside an
`activation_sharding(...)` context this does nothing, so models stay mesh-agnostic (notebooks, one
device). The trainer traces its steps inside the context with a resolver from
`lpjax.train.step._sharding.activation_resolver(mesh)`, and every hint becomes a
`jax.lax.with_sharding_constraint`. Without the hints XLA's sharding propagation is free to
replicate activations: under FSDP (batch and weights both split over the `fsdp` axis) it computed
the whole microbatch on every device (8x the activations and the FLOPs on 8 devices).

Examples:
  >>> import jax.numpy as jnp
  >>> x = jnp.ones((4, 3))
  >>> constrain(x, ("batch", None)) is x  # no context: a no-op
  True
  >>> seen = []
  >>> with activation_sharding(lambda axes, shape: seen.append((axes, shape))):
  ...   _ = constrain(x, ("batch", None))
  >>> seen
  [(('batch', None), (4, 3))]
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Optional, Sequence

import jax

# resolver(logical_axes, shape) -> a jax.sharding.Sharding, or None to leave the array alone
Resolver = Callable[[Sequence[Optional[str]], tuple], Optional[jax.sharding.Sharding]]

_RESOLVER: contextvars.ContextVar[Optional[Resolver]] = contextvars.ContextVar(
    "lpjax_activation_sharding", default=None)


@contextlib.contextmanager
def activation_sharding(resolver: Optional[Resolver]):
  """Within the block, `constrain` applies `resolver`'s shardings (None: hints are no-ops)."""
  token = _RESOLVER.set(resolver)
  try:
    yield
  finally:
    _RESOLVER.reset(token)


def constrain(x, logical_axes: Sequence[Optional[str]]):
  """x with the sharding its logical axes map to, if a resolver is active; else x itself."""
  resolver = _RESOLVER.get()
  if resolver is None:
    return x
  if len(logical_axes) != x.ndim:
    raise ValueError(f"constrain: {len(logical_axes)} logical axes {tuple(logical_axes)} for an "
                     f"array of rank {x.ndim} (shape {x.shape}); give one name (or None) per axis.")
  sharding = resolver(tuple(logical_axes), tuple(x.shape))
  return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)
