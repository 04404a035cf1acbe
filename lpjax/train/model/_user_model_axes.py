"""The logical axes of a user model's parameters, and the partition rules that shard them.

A parameter's logical axes come from the model when it declares them, with lpjax's logical names
(embed, mlp, heads, vocab, norm): a `partition_rules` attribute of (regex over parameter paths,
axes) pairs as lpjax's models have (`axes_by_rules`), or `nnx.with_partitioning` /
`nn.with_logical_partitioning` metadata (`nnx_axis_names`, `linen_axis_names`); otherwise FSDP over
the largest dimension ("embed" on that axis, which the mesh's fsdp axis splits; vectors
replicated). `partition_rules` gives one exact rule per parameter, and the axes of the 2-D
weights, which are gathered as FP4 codes and scales under fsdp (`quant.gather_quantized_weights`),
as lpjax's own layers are.

Examples:
  >>> import jax.numpy as jnp
  >>> params = {"dense": {"kernel": jnp.ones((32, 64)), "bias": jnp.ones(64)}}
  >>> rules, weight_axes = partition_rules(params, {})
  >>> [axes for _, axes in rules], weight_axes
  ([('norm',), (None, 'embed')], {'dense/kernel': (None, 'embed')})
"""

from __future__ import annotations

import re

import jax
from flax import linen as nn
from flax import nnx

from lpjax.train.step._sharding import LOGICAL_RULES, logical_axes_for

def param_path(kp) -> str:
  names = []
  for k in kp:
    names.append(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))))
  if names and names[-1] in ("value", "raw_value"):
    names = names[:-1]
  return "/".join(names)


def nnx_axis_names(model) -> dict:
  out = {}
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    meta = var.get_metadata() if hasattr(var, "get_metadata") else {}
    names = meta.get("out_sharding") or meta.get("sharding_names") or meta.get("sharding")
    if names and all(n is None or isinstance(n, str) for n in names):
      out["/".join(str(p) for p in path)] = tuple(names)
  return out


def linen_axis_names(params) -> dict:
  out = {}
  flat = jax.tree_util.tree_flatten_with_path(
      params, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))[0]
  for kp, leaf in flat:
    if isinstance(leaf, nn.LogicallyPartitioned):
      out[param_path(kp)] = tuple(leaf.names)
  return out


def axes_by_rules(params, rules) -> dict:
  """{path: logical axes} of the parameters that a model's own `partition_rules` attribute
  ((regex, axes), as lpjax's models declare them) names."""
  if not rules:
    return {}
  out = {}
  for kp, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    path = param_path(kp)
    axes = logical_axes_for(path, len(getattr(leaf, "shape", ())), rules)
    if any(a is not None for a in axes):
      out[path] = axes
  return out


def partition_rules(params, names: dict) -> tuple[tuple, dict]:
  """(partition rules {exact path regex: logical axes}, {path: axes of 2-D weights})."""
  rules, weight_axes = [], {}
  for kp, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    path, shape = param_path(kp), tuple(getattr(leaf, "shape", ()))
    axes = names.get(path)
    if axes is None or len(axes) != len(shape) or not all(a is None or a in LOGICAL_RULES
                                                          for a in axes):
      axes = _fsdp_axes(shape)
    rules.append((rf"(^|/){re.escape(path)}(/value)?$", axes))
    if len(shape) == 2:
      weight_axes[path] = axes
  return tuple(rules), weight_axes


def _fsdp_axes(shape) -> tuple:
  """FSDP over the largest dimension; vectors (biases, norm scales) replicated."""
  if len(shape) < 2:
    return ("norm",) * len(shape)
  largest = max(range(len(shape)), key=lambda i: (shape[i], -i))
  return tuple("embed" if i == largest else None for i in range(len(shape)))
