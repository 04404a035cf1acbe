"""Orbax checkpoints of the train state: async, atomic, keep N, resume into the current sharding.

Examples:
  >>> import tempfile, jax.numpy as jnp
  >>> ckpt = Checkpointer(tempfile.mkdtemp(), keep=2, async_save=False)
  >>> ckpt.save(5, {"w": jnp.ones(3)}, {"note": "hi"})
  >>> ckpt.latest_step()
  5
  >>> state, meta = ckpt.restore(5, {"w": jnp.zeros(3)})
  >>> state["w"].tolist(), meta["note"]
  ([1.0, 1.0, 1.0], 'hi')
  >>> ckpt.close()
"""

from __future__ import annotations

import logging
import os

import jax
import orbax.checkpoint as ocp


def _abstract(tree):
  def one(x):
    sharding = getattr(x, "sharding", None)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  return jax.tree.map(one, tree)


class Checkpointer:
  """Saves {state, meta} under <directory>/<step>; orbax writes to a temporary name and renames."""

  def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True):
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self):
    return self._manager.latest_step()

  def all_steps(self):
    return sorted(self._manager.all_steps())

  def save(self, step: int, state, meta: dict, *, force: bool = True):
    self._manager.save(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=force)

  def restore(self, step: int, target):
    """Restores into `target`'s structure, shapes, dtypes and shardings (arrays or abstract)."""
    restored = self._manager.restore(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardRestore(_abstract(target)), meta=ocp.args.JsonRestore()))
    return restored["state"], restored["meta"]

  def restore_latest(self, target):
    """(step, state, meta) of the newest checkpoint that restores; older ones if it is corrupt.

    A checkpoint that fails to restore is renamed <step>.corrupt (kept for inspection, invisible to
    later saves and restores) and the previous one is tried.
    """
    for step in reversed(self.all_steps()):
      try:
        state, meta = self.restore(step, target)
        return step, state, meta
      except Exception as e:  # a partial or corrupt checkpoint: fall back to the previous one
        logging.getLogger("lpjax.train").warning(
            "Checkpoint %s/%d could not be restored (%s: %s); moved it to %d.corrupt and trying the "
            "previous one.", self.directory, step, type(e).__name__, str(e)[:200], step)
        self._set_aside(step)
    return None, None, None

  def _set_aside(self, step: int):
    if jax.process_index() == 0:
      source = os.path.join(self.directory, str(step))
      target, n = source + ".corrupt", 1
      while os.path.exists(target):
        target, n = f"{source}.corrupt{n}", n + 1
      os.replace(source, target)
    self._manager.reload()

  def wait(self):
    self._manager.wait_until_finished()

  def close(self):
    self._manager.wait_until_finished()
    self._manager.close()
