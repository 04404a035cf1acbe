"""Re-running a finished command: "already complete", nothing touched; more steps continue; the
results file is always valid JSON."""

import json
import logging
import os

from config_helpers import small

from lpjax.train.loop._trainer import Trainer


def _snapshot(workdir):
  """{relative path: (size, mtime_ns)} of every file in the workdir but the run lock."""
  out = {}
  for root, _, files in os.walk(workdir):
    for name in files:
      if name == ".lock":  # each run takes it (and notes its pid)
        continue
      path = os.path.join(root, name)
      st = os.stat(path)
      out[os.path.relpath(path, workdir)] = (st.st_size, st.st_mtime_ns)
  return out


def test_a_finished_run_rerun_changes_nothing(tmp_path, caplog):
  workdir = str(tmp_path)
  first = Trainer(small(steps=2), workdir).run()
  before = _snapshot(workdir)
  with caplog.at_level(logging.INFO, logger="lpjax.train"):
    again = Trainer(small(steps=2), workdir).run()
  assert "already complete" in caplog.text
  assert again == first
  assert _snapshot(workdir) == before  # results.json, metrics.jsonl, checkpoints untouched
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    evals = [r for r in map(json.loads, f) if "eval/loss" in r]
  assert [r["step"] for r in evals] == [2]  # no duplicate eval record


def test_more_steps_continue_from_the_finished_run(tmp_path):
  workdir = str(tmp_path)
  Trainer(small(steps=2), workdir).run()
  results = Trainer(small(steps=3), workdir).run()
  assert results["steps"] == 3


def test_results_json_is_strict_json_even_with_a_nan_loss(tmp_path):
  # A NaN at the last step: final_train_loss is NaN, written as null (JSON has no NaN).
  results = Trainer(small(steps=2, **{"debug.nan_at_step": 1, "log_every": 1}), str(tmp_path)).run()
  assert results["final_train_loss"] is None
  with open(tmp_path / "results.json") as f:
    text = f.read()
  assert "NaN" not in text and json.loads(text)["final_train_loss"] is None
