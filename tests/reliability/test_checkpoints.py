"""A corrupt or partial latest checkpoint is detected and the previous one used, with a warning;
the run then reaches the same state as an uninterrupted one."""

import os

import jax
import numpy as np
import pytest

from config_helpers import small

from lpjax.train.loop._trainer import Trainer


def same(a, b):
  return all(np.array_equal(np.asarray(x), np.asarray(y))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def garble_files(directory):
  for root, _, files in os.walk(directory):
    for name in files:
      with open(os.path.join(root, name), "r+b") as f:
        size = os.path.getsize(f.name)
        f.write(b"\x00garbage" * max(1, size // 8))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  trainer = Trainer(small(steps=6), str(tmp_path_factory.mktemp("full")))
  trainer.run()
  return trainer.final_state


@pytest.mark.parametrize("damage", ["garbled", "emptied", "half_written"])
def test_a_bad_latest_checkpoint_falls_back_to_the_previous(tmp_path, caplog, uninterrupted, damage):
  workdir = str(tmp_path)
  first = Trainer(small(steps=6, checkpoint_every=2), workdir)
  first.run(stop_after=4)
  ckpts = os.path.join(workdir, "checkpoints")
  assert sorted(os.listdir(ckpts))[-2:] == ["2", "4"]
  if damage == "garbled":
    garble_files(os.path.join(ckpts, "4", "state"))
  elif damage == "emptied":
    for root, _, files in os.walk(os.path.join(ckpts, "4", "state")):
      for name in files:
        os.truncate(os.path.join(root, name), 0)
  else:  # a crash mid-write leaves orbax's temporary directory, never a step directory
    os.rename(os.path.join(ckpts, "4"), os.path.join(ckpts, "4.orbax-checkpoint-tmp-1"))
  second = Trainer(small(steps=6, checkpoint_every=2), workdir)
  with caplog.at_level("INFO", logger="lpjax.train"):
    results = second.run()
  if damage != "half_written":
    assert "could not be restored" in caplog.text and "trying the previous one" in caplog.text
  assert "at step 2" in caplog.text
  assert results["steps"] == 6
  assert same(second.final_state.params, uninterrupted.params)
  assert same(second.final_state.opt_state, uninterrupted.opt_state)
