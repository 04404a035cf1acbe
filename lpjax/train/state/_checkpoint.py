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

import contextlib
import logging
import os

import jax
import numpy as np
import orbax.checkpoint as ocp

from lpjax.train.state._state_structure import StateMismatch, flat_structure, structure_differences


def _abstract(tree):
  def one(x):
    sharding = getattr(x, "sharding", None)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  return jax.tree.map(one, tree)


def _state_handler():
  """orbax's StandardCheckpointHandler; on a CPU backend without replica-parallel writes.

  With them, orbax slices every replicated array into one piece per device before the host copy,
  one dispatched (and, the first time per shape, compiled) slice op per piece: ~11 s for the
  690-array state of the tiny U-Net on 8 virtual CPU devices, where all replicas live in the
  same host memory and the split saves nothing. (orbax itself turns it off on GPU.) Every other
  handler, and the jax.Array handler's per-array metadata store, are orbax's defaults, so the
  files written are the stock handler's.
  """
  handler = ocp.StandardCheckpointHandler()
  if jax.default_backend() != "cpu" or not hasattr(handler, "_impl"):
    return handler
  handlers = ocp.type_handlers
  stock = handlers.get_type_handler(jax.Array)
  arrays = handlers.ArrayHandler(
      use_replica_parallel=False,
      array_metadata_store=getattr(stock, "_array_metadata_store", None))
  defaults = [(t, handlers.get_type_handler(t))
              for t in (int, float, bytes, np.number, np.ndarray, str)]
  registry = handlers.create_type_handler_registry(*defaults, (jax.Array, arrays))
  handler._impl = ocp.PyTreeCheckpointHandler(type_handler_registry=registry)
  return handler


class CheckpointWriteError(RuntimeError):
  """Writing a checkpoint failed (disk full, directory gone or unwritable): the run stops."""


class Checkpointer:
  """Saves {state, meta} under <directory>/<step>; orbax writes to a temporary name and renames."""

  def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True):
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(  # handlers named: a fresh manager reads metadata
        self.directory, options=options,
        item_handlers={"state": _state_handler(),
                       "meta": ocp.JsonCheckpointHandler()})

  def latest_step(self):
    return self._manager.latest_step()

  def all_steps(self):
    return sorted(self._manager.all_steps())

  def save(self, step: int, state, meta: dict, *, force: bool = True):
    """Starts writing step `step` (async); raises CheckpointWriteError when it (or an earlier
    async write) fails."""
    with self._write_errors():
      self._manager.save(int(step), args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=force)

  def check(self):
    """Raises CheckpointWriteError if an async write has failed since the last call (cheap)."""
    with self._write_errors():
      self._manager.check_for_errors()

  @contextlib.contextmanager
  def _write_errors(self):
    """Turns any error of a checkpoint write into a CheckpointWriteError naming the directory and
    the way on (the last complete checkpoint resumes the run)."""
    try:
      yield
    except (CheckpointWriteError, KeyboardInterrupt):
      raise
    except Exception as error:  # noqa: BLE001 -- whatever orbax or the file system raised
      try:
        complete = self.latest_step()
      except Exception:  # noqa: BLE001 -- the directory itself may be what failed
        complete = None
      raise CheckpointWriteError(
          f"Writing a checkpoint to {self.directory} failed ({type(error).__name__}: "
          f"{str(error)[:200]}). The run stopped; the last complete checkpoint is "
          f"{'step %d' % complete if complete is not None else 'none'}. Free space or fix the "
          "directory's permissions, then run the same command to resume.") from error

  def restore(self, step: int, target):
    """Restores into `target`'s structure, shapes, dtypes and shardings (arrays or abstract)."""
    restored = self._manager.restore(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardRestore(_abstract(target)), meta=ocp.args.JsonRestore()))
    return restored["state"], restored["meta"]

  def saved_structure(self, step: int) -> dict:
    """{path: (shape, dtype)} of the state saved at `step`, read from its metadata (raises when
    the metadata is unreadable: an integrity failure)."""
    return flat_structure(self._manager.item_metadata(int(step))["state"].tree)

  def saved_meta(self, step: int) -> dict | None:
    """The meta saved at `step`, or None when it does not restore."""
    try:
      return self._manager.restore(int(step), args=ocp.args.Composite(
          meta=ocp.args.JsonRestore()))["meta"]
    except Exception:  # noqa: BLE001 -- a missing or unreadable meta is reported as None
      return None

  def restore_latest(self, target):
    """(step, state, meta) of the newest checkpoint that restores; older ones if it is corrupt.

    A checkpoint that fails an integrity check (unreadable metadata, or data that does not
    restore) is renamed <step>.corrupt (kept for inspection, invisible to later saves and
    restores) and the previous one is tried. One that is intact but holds a state of another
    structure than `target` (another model or optimizer) raises `StateMismatch` and nothing
    is moved.
    """
    wanted = flat_structure(target)
    for step in reversed(self.all_steps()):
      try:
        saved = self.saved_structure(step)
      except Exception as e:  # noqa: BLE001 -- unreadable metadata: an integrity failure
        self._corrupt(step, e)
        continue
      differences = structure_differences(saved, wanted)
      if differences:
        meta = self.saved_meta(step) or {}
        raise StateMismatch(step, differences, meta.get("config"))
      try:
        state, meta = self.restore(step, target)
        return step, state, meta
      except Exception as e:  # noqa: BLE001 -- a partial or corrupt checkpoint
        self._corrupt(step, e)
    return None, None, None

  def restore_subtrees(self, step: int, target: dict) -> dict:
    """Only the state entries named by `target` ({"params": ..., ...}) from the checkpoint at
    `step`, into target's shapes and shardings (e.g. the parameters under a new optimizer)."""
    abstract = _abstract(target)
    return ocp.PyTreeCheckpointer().restore(
        os.path.join(self.directory, str(int(step)), "state"),
        args=ocp.args.PyTreeRestore(item=abstract, partial_restore=True,
                                    restore_args=ocp.checkpoint_utils.construct_restore_args(
                                        abstract)))

  def _corrupt(self, step: int, error: Exception):
    logging.getLogger("lpjax.train").warning(
        "Checkpoint %s/%d could not be restored (%s: %s); moved it to %d.corrupt and trying the "
        "previous one.", self.directory, step, type(error).__name__, str(error)[:200], step)
    self._set_aside(step)

  def _set_aside(self, step: int):
    if jax.process_index() == 0:
      source = os.path.join(self.directory, str(step))
      target, n = source + ".corrupt", 1
      while os.path.exists(target):
        target, n = f"{source}.corrupt{n}", n + 1
      os.replace(source, target)
    self._manager.reload()

  def wait(self):
    with self._write_errors():
      self._manager.wait_until_finished()

  def close(self):
    self._manager.wait_until_finished()
    self._manager.close()

