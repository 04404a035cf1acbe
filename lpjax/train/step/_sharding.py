"""The device mesh and parameter shardings: logical axis names mapped onto mesh axes.

Parameters get logical axis names from path rules (first matching regex wins); `LOGICAL_RULES`
maps logical names to the mesh axes (data, fsdp, tensor), as MaxText's logical_axis_rules do. A
dimension that a mesh axis does not divide stays replicated.

Examples:
  >>> import jax, numpy as np
  >>> mesh = make_mesh(data=2, fsdp=4, tensor=1)
  >>> dict(mesh.shape)
  {'data': 2, 'fsdp': 4, 'tensor': 1}
  >>> tuple(spec_for(("embed", "mlp"), (128, 352), mesh))
  ('fsdp', None)
"""

from __future__ import annotations

import contextlib
import re

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lpjax.nn import activation_sharding
from lpjax.quant import weight_sharding

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis name -> mesh axes
LOGICAL_RULES = {
    "batch": ("data", "fsdp"),
    "embed": ("fsdp",),
    "mlp": ("tensor",),
    "heads": ("tensor",),
    "vocab": ("tensor",),
    "length": None,
    "norm": None,
    # activations (lpjax.nn._sharding_hints): the residual stream is replicated over fsdp and
    # tensor; the MLP hidden units, attention heads and logits are split over tensor
    "act_embed": None,
    "act_mlp": ("tensor",),
    "act_heads": ("tensor",),
    "act_vocab": ("tensor",),
}


def make_mesh(data: int, fsdp: int, tensor: int, devices=None) -> Mesh:
  devices = np.asarray(devices if devices is not None else jax.devices())
  return Mesh(devices.reshape(data, fsdp, tensor), MESH_AXES)


def spec_for(logical_axes, shape, mesh: Mesh) -> PartitionSpec:
  """PartitionSpec of an array with these logical axes; non-divisible dims stay replicated."""
  parts = []
  used = set()
  for name, dim in zip(logical_axes, shape):
    axes = LOGICAL_RULES.get(name) if name else None
    axes = tuple(a for a in (axes or ()) if a not in used and mesh.shape[a] > 1)
    size = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
    if not axes or dim % size:
      parts.append(None)
      continue
    used.update(axes)
    parts.append(axes[0] if len(axes) == 1 else axes)
  return PartitionSpec(*parts)


def logical_axes_for(path: str, ndim: int, rules) -> tuple:
  """Logical axes of the array at `path`; a leading extra axis (scanned layers) is unsharded."""
  for pattern, axes in rules:
    if re.search(pattern, path):
      if len(axes) == ndim:
        return tuple(axes)
      if len(axes) == ndim - 1:
        return (None,) + tuple(axes)
  return (None,) * ndim


def path_string(path) -> str:
  parts = []
  for p in path:
    key = getattr(p, "key", getattr(p, "name", getattr(p, "idx", p)))
    parts.append(str(key))
  return "/".join(parts)


def tree_shardings(tree, mesh: Mesh, rules):
  """NamedShardings for every array leaf of `tree` (params, or optimizer state mirroring them)."""
  def one(path, leaf):
    shape = getattr(leaf, "shape", ())
    axes = logical_axes_for(path_string(path), len(shape), rules)
    return NamedSharding(mesh, spec_for(axes, shape, mesh))
  return jax.tree_util.tree_map_with_path(one, tree)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec(("data", "fsdp")))


def activation_resolver(mesh: Mesh):
  """A resolver for lpjax.nn._sharding_hints: logical activation axes -> NamedSharding on `mesh`.

  Arrays without a batch axis (e.g. RoPE tables) are left to XLA.
  """
  def resolve(logical_axes, shape):
    if "batch" not in logical_axes:
      return None
    return NamedSharding(mesh, spec_for(logical_axes, shape, mesh))
  return resolve


def weight_resolver(mesh: Mesh):
  """A resolver for `lpjax.quant.weight_sharding`: a weight's logical axes -> its NamedSharding on
  `mesh` (as the parameter's, `spec_for`), or with gathered=True the same without the fsdp axis
  (what the GEMM multiplies: gathered over FSDP, still split over tensor).

  Examples:
    >>> mesh = make_mesh(data=1, fsdp=8, tensor=1)
    >>> resolve = weight_resolver(mesh)
    >>> tuple(resolve(("mlp", "embed"), (352, 128), False).spec)
    (None, 'fsdp')
    >>> tuple(resolve(("mlp", "embed"), (352, 128), True).spec)
    (None, None)
  """
  def resolve(logical_axes, shape, gathered):
    spec = spec_for(logical_axes, shape, mesh)
    if gathered:
      spec = PartitionSpec(*(_without(p, "fsdp") for p in spec))
    return NamedSharding(mesh, spec)
  return resolve


def _without(part, axis: str):
  """One PartitionSpec entry with mesh axis `axis` removed."""
  if part is None or part == axis:
    return None
  if isinstance(part, tuple):
    rest = tuple(a for a in part if a != axis)
    return rest if len(rest) > 1 else (rest[0] if rest else None)
  return part


@contextlib.contextmanager
def step_hints(mesh: Mesh, *, gather_quantized_weights: bool = True):
  """The context a train or eval step is traced in: activation hints mapped onto `mesh`, and
  (when the mesh has fsdp > 1 and `gather_quantized_weights`) quantized weights gathered as codes
  and scales (`lpjax.quant.weight_sharding`)."""
  gather = gather_quantized_weights and mesh.shape["fsdp"] > 1
  with activation_sharding(activation_resolver(mesh)), \
      weight_sharding(weight_resolver(mesh) if gather else None):
    yield


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())
