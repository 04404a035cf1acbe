"""A workdir resumed with another config: a checkpoint of another state structure stops the run
before anything changes (one-line error naming the keys); `resume=restart` / `resume=params`
archive the old run; structure-keeping changes (recipe, steps) resume and are logged. Only
integrity failures set a checkpoint aside as corrupt."""

import json
import logging
import os

import jax
import numpy as np
import pytest

from config_helpers import small

from lpjax.train import ConfigError
from lpjax.train.loop._trainer import Trainer


def _files(workdir):
  """{relative path: (size, mtime_ns)} of every file under the workdir but the run lock."""
  out = {}
  for root, _, names in os.walk(workdir):
    for name in names:
      if name == ".lock":
        continue
      st = os.stat(os.path.join(root, name))
      out[os.path.relpath(os.path.join(root, name), workdir)] = (st.st_size, st.st_mtime_ns)
  return out


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """A 2-step adamw run on the tiny LLaMA; tests copy its workdir."""
  workdir = str(tmp_path_factory.mktemp("finished"))
  trainer = Trainer(small(steps=2), workdir)
  trainer.run()
  return workdir, trainer.final_state


def _copy(finished, tmp_path):
  import shutil
  target = str(tmp_path / "run")
  shutil.copytree(finished[0], target)
  return target


@pytest.mark.parametrize("changes, named", [
    ({"optimizer.name": "stable_spam"}, "optimizer.name 'adamw' -> 'stable_spam'"),
    ({"model.size": "20m"}, "model.size 'tiny' -> '20m'"),
])
def test_another_state_structure_stops_before_touching_anything(finished, tmp_path, changes,
                                                                named):
  workdir = _copy(finished, tmp_path)
  before = _files(workdir)
  with pytest.raises(ConfigError) as e:
    Trainer(small(steps=4, **changes), workdir).run()
  message = str(e.value)
  assert "\n" not in message and named in message
  assert "--config.resume=restart" in message and "--config.resume=params" in message
  assert "new --workdir" in message
  assert _files(workdir) == before  # no checkpoint set aside, no metrics erased


def test_resume_restart_archives_the_old_run_and_starts_afresh(finished, tmp_path):
  workdir = _copy(finished, tmp_path)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    old_metrics = f.read()
  results = Trainer(small(steps=1, **{"model.size": "20m", "resume": "restart"}), workdir).run()
  assert results["steps"] == 1
  (stamp,) = os.listdir(os.path.join(workdir, "archive"))
  archived = os.path.join(workdir, "archive", stamp)
  assert sorted(os.listdir(os.path.join(archived, "checkpoints"))) == ["2"]
  with open(os.path.join(archived, "metrics.jsonl")) as f:
    assert f.read() == old_metrics  # the old run's metrics are kept whole


def test_resume_params_starts_from_the_old_parameters_with_a_new_optimizer(finished, tmp_path):
  workdir = _copy(finished, tmp_path)
  trainer = Trainer(small(steps=1, optimizer="stable_spam", resume="params"), workdir)
  state, meta = trainer.restore_or_init()
  assert meta == {} and int(state.step) == 0
  for got, want in zip(_leaves(state.params), _leaves(finished[1].params)):
    np.testing.assert_array_equal(got, want)
  assert os.path.isdir(os.path.join(workdir, "archive"))


def test_resume_params_with_other_parameter_shapes_is_an_error(finished, tmp_path):
  workdir = _copy(finished, tmp_path)
  before = _files(workdir)
  with pytest.raises(ConfigError, match="resume=params needs the parameters"):
    Trainer(small(steps=1, **{"model.size": "20m", "resume": "params"}), workdir).restore_or_init()
  assert _files(workdir) == before


def test_a_changed_recipe_or_schedule_resumes_and_is_logged(finished, tmp_path, caplog):
  workdir = _copy(finished, tmp_path)
  with caplog.at_level(logging.INFO, logger="lpjax.train"):
    results = Trainer(small(recipe="mxfp4", steps=3), workdir).run()
  assert results["steps"] == 3
  assert "Resumed from" in caplog.text and "quant.recipe 'bf16' -> 'mxfp4'" in caplog.text
  assert "steps 2 -> 3" in caplog.text


def test_each_checkpoint_records_its_config(finished):
  from lpjax.train.state._checkpoint import Checkpointer
  checkpointer = Checkpointer(os.path.join(finished[0], "checkpoints"))
  meta = checkpointer.saved_meta(2)
  checkpointer.close()
  assert meta["config"]["optimizer.name"] == "adamw" and meta["config"]["steps"] == 2
  json.dumps(meta)  # plain JSON


def test_unknown_resume_choice_is_a_config_error(tmp_path):
  with pytest.raises(ConfigError, match="resume 'maybe' is unknown; valid: auto, restart, params"):
    Trainer(small(resume="maybe"), str(tmp_path))
