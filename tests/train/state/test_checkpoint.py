"""lpjax's CPU checkpoint handler writes the files orbax's stock handler writes, and restores them."""

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from lpjax.train.state._checkpoint import Checkpointer


def _state():
  mesh = Mesh(np.asarray(jax.devices()).reshape(2, -1), ("a", "b"))
  sharded = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("a", "b")))
  replicated = jax.device_put(jnp.ones((3, 5), jnp.bfloat16), NamedSharding(mesh, P()))
  return {"w": sharded, "m": replicated, "step": jnp.int32(7)}


def _files(root):
  """The set of relative paths, every data file of tensorstore (random names, a number that
  depends on write concurrency, in a directory named d) as one "d/*"."""
  paths = (os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files)
  return sorted({re.sub(r"(^|/)d/[0-9a-f]+$", r"\1d/*", p) for p in paths})


def test_the_files_are_the_stock_handlers_and_restore_bit_exactly(tmp_path):
  state = _state()
  ours = Checkpointer(str(tmp_path / "ours"), async_save=False)
  ours.save(3, state, {"note": "x"})
  ours.wait()
  stock = ocp.CheckpointManager(
      str(tmp_path / "stock"), options=ocp.CheckpointManagerOptions(create=True),
      item_handlers={"state": ocp.StandardCheckpointHandler(),
                     "meta": ocp.JsonCheckpointHandler()})
  stock.save(3, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                        meta=ocp.args.JsonSave({"note": "x"})))
  stock.wait_until_finished()
  ours_files = _files(tmp_path / "ours" / "3")
  assert any("array_metadatas" in f for f in ours_files)  # orbax's per-array metadata is kept
  assert ours_files == _files(tmp_path / "stock" / "3")
  restored, meta = ours.restore(3, state)
  assert meta == {"note": "x"}
  for name in state:
    assert restored[name].dtype == state[name].dtype
    assert restored[name].sharding == state[name].sharding
    assert np.array_equal(np.asarray(restored[name]), np.asarray(state[name]))
