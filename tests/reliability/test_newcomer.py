"""What a newcomer met on a first run: the learning rate in metrics.jsonl, progress and log lines
kept apart in log files, a TensorBoard command that works, a clean package install."""

import json
import logging
import os
import re
import tomllib

from config_helpers import small

from lpjax.train import learning_rate_schedule, tensorboard_command
from lpjax.train.outputs._metrics import Progress
from lpjax.train.loop._trainer import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_metrics_jsonl_has_the_learning_rate_of_each_logged_step(tmp_path):
  config = small(steps=4)
  Trainer(config, str(tmp_path)).run()
  schedule = learning_rate_schedule(config)
  with open(tmp_path / "metrics.jsonl") as f:
    records = [r for r in map(json.loads, f) if "train/loss" in r]
  assert [r["step"] for r in records] == [1, 2, 3, 4]
  for r in records:  # the step-r["step"] update used the schedule's value at index step - 1
    assert r["train/lr"] == float(schedule(r["step"] - 1))
  assert records[0]["train/lr"] == 0.0 and records[-1]["train/lr"] > 0  # warm-up from 0


def test_without_a_terminal_progress_is_whole_log_lines(caplog):
  progress = Progress(0, 3, 100.0, True, terminal=False, line_seconds=0.0)
  with caplog.at_level(logging.INFO, logger="lpjax.train"):
    for step in (1, 2, 3):
      progress.update(step, 2.5)
  progress.close()
  lines = [r.getMessage() for r in caplog.records]
  assert len(lines) == 3 and lines[-1].startswith("step 3/3: loss 2.5000, ")
  assert all("\r" not in line for line in lines) and "ETA 0:00:00" in lines[-1]


def test_without_a_terminal_progress_lines_are_rate_limited(caplog):
  progress = Progress(0, 100, 1.0, True, terminal=False, line_seconds=3600.0)
  with caplog.at_level(logging.INFO, logger="lpjax.train"):
    for step in range(1, 101):
      progress.update(step, 1.0)
  assert len(caplog.records) == 1 and caplog.records[0].getMessage().startswith("step 100/100")


def test_the_tensorboard_command_names_an_existing_program_or_installs_it():
  command = tensorboard_command("runs/x/tensorboard")
  program = command.split()[0]
  assert os.path.exists(program)  # this environment's tensorboard, or its pip to install it
  assert command.endswith("--logdir runs/x/tensorboard")
  if program.endswith("pip"):
    assert "install tensorboard &&" in command


def test_the_package_metadata_builds_without_setuptools_deprecation_warnings():
  # A license table (instead of an SPDX string) made setuptools >= 77 print ~27 lines of
  # deprecation warnings on every install.
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    project = tomllib.load(f)
  assert isinstance(project["project"]["license"], str)
  assert "setuptools>=77" in project["build-system"]["requires"]


def _names(requirements):
  """Normalized distribution names of requirement strings ("ml_dtypes>=0.6" -> "ml-dtypes")."""
  return {re.split(r"[<>=\[ ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_pip_install_brings_only_what_lpjax_always_imports_and_extras_the_rest():
  # The README's stock-GPU-image set-up: lpjax runs without TFDS, grain, array_record,
  # tensorboardX, tqdm, sentencepiece and scikit-learn (tests/reliability/test_stock_environment.py),
  # so `pip install lpjax` must not pull them (TFDS drags in a large tree); `lpjax[data]`,
  # `lpjax[logging]` and `lpjax[all]` do, and requirements.txt pins every one for CI.
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    project = tomllib.load(f)["project"]
  core = _names(project["dependencies"])
  optional = {"tensorflow-datasets", "array-record", "grain", "tensorboardx", "tqdm",
              "sentencepiece", "scikit-learn"}
  assert not core & optional
  assert {"jax", "flax", "optax", "orbax-checkpoint", "ml-collections", "ml-dtypes"} <= core
  extras = project["optional-dependencies"]
  assert _names(extras["data"]) | _names(extras["logging"]) == optional
  assert extras["all"] == ["lpjax[data,logging]"]
  with open(os.path.join(ROOT, "requirements.txt")) as f:
    pinned = _names(l for l in f.read().splitlines() if l.strip() and not l.startswith("#"))
  assert core | optional <= pinned
