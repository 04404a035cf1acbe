"""A train state's structure: every array's path, shape and dtype, and how two structures differ.

The checkpointer compares a saved state with the one a config builds (`_checkpoint`); the resume
logic decides what a difference means (`_resume`).

Examples:
  >>> import numpy as np
  >>> old = flat_structure({"w": np.zeros((2, 3), np.float32)})
  >>> new = flat_structure({"w": np.zeros((2, 4), np.float32), "b": np.zeros(4, np.float32)})
  >>> structure_differences(old, new)
  ['b: (absent) -> (4,) float32', 'w: (2, 3) float32 -> (2, 4) float32']
"""

from __future__ import annotations

import jax


class StateMismatch(Exception):
  """The checkpoint at `step` holds a state of another structure than the target's."""

  def __init__(self, step: int, differences: list[str], saved_config: dict | None):
    super().__init__(f"checkpoint {step}: {len(differences)} arrays differ")
    self.step, self.differences, self.saved_config = step, differences, saved_config


def _key_name(key) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def flat_structure(tree) -> dict[str, tuple]:
  """{"a/b/c": (shape, dtype name)} for every array leaf (arrays, abstract arrays, orbax metadata)."""
  return {"/".join(_key_name(k) for k in path): (tuple(leaf.shape), str(leaf.dtype))
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def structure_differences(saved: dict, current: dict) -> list[str]:
  """One "path: saved -> current" line per array whose presence, shape or dtype differs (sorted)."""
  def show(entry):
    return "(absent)" if entry is None else f"{entry[0]} {entry[1]}"
  return [f"{path}: {show(saved.get(path))} -> {show(current.get(path))}"
          for path in sorted(set(saved) | set(current)) if saved.get(path) != current.get(path)]
