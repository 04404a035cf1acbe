"""A newcomer's config and command line: `--print_config` lists every key with its value, default
and meaning; `--help` points at it; recipe names ignore case and an unknown one gets "did you
mean"; QuantPolicy's names for the keep-blocks keys are pointed at the config's; a finished run
asked to run with another config suggests a new workdir. (Bad flags and files that exit with
status 2: test_bad_inputs_train_py.py.)"""

from __future__ import annotations

import ast
import logging
import os
import subprocess
import sys

import pytest

from config_helpers import small

from lpjax.train import ConfigError, validate
from lpjax.train.cli import _cli as cli
from lpjax.train.schema._config_schema import TASKS, base_config, flat_keys, task_keys
from lpjax.train.loop._trainer import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "llama_tiny_mxfp4.py")


def _train_py(*args, cwd=ROOT):
  return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=cwd,
                        capture_output=True, text=True, timeout=120,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))


# --- --print_config and --help --------------------------------------------------------------


def test_every_key_of_every_task_has_a_comment():
  keys = set().union(*(task_keys(t) for t in TASKS))
  comments = cli.config_comments()
  assert keys - set(comments) == set()
  assert all(len(comments[k]) > 3 for k in keys)


def _parsed(listing: str) -> dict:
  """{key: value} of format_config's `key = value  # comment` lines."""
  out = {}
  for line in listing.splitlines():
    if not line or line.startswith("#"):
      continue
    key, _, rest = line.partition(" = ")
    value = rest.split("  # ", 1)[0]
    out[key] = ast.literal_eval(value)
  return out


@pytest.mark.parametrize("task", TASKS)
def test_format_config_lists_each_key_once_with_its_value(task):
  c = base_config(task, optimizer="stable_spam")
  c.steps, c.optimizer.lr = 77, 2.5e-3
  listing = cli.format_config(c)
  values = _parsed(listing)
  assert set(values) == flat_keys(c)
  assert values["steps"] == 77 and values["optimizer.lr"] == 2.5e-3
  assert "steps = 77  # optimizer steps [default 1000]" in listing
  assert "optimizer.lr = 0.0025  # peak learning rate [default 0.001]" in listing
  assert f"task = {task!r}  # lm (LLaMA)" in listing  # an unchanged key: no [default]


def test_print_config_prints_the_file_with_its_overrides_and_trains_nothing(tmp_path):
  r = _train_py(f"--config={TINY}", "--print_config", "--config.steps=7",
                "--config.quant.recipe=nvfp4", f"--workdir={tmp_path / 'run'}")
  assert r.returncode == 0, r.stderr
  values = _parsed(r.stdout)
  assert values["steps"] == 7 and values["quant.recipe"] == "nvfp4"
  assert values["optimizer.name"] == "stable_spam"  # the file's own value
  assert "# peak learning rate" in r.stdout
  assert not (tmp_path / "run").exists()


def test_print_config_names_a_misspelt_override():
  r = _train_py(f"--config={TINY}", "--print_config", "--config.optimizer.lrr=1")
  assert r.returncode == 2 and "Traceback" not in r.stderr
  assert "optimizer.lrr (did you mean optimizer.lr?)" in r.stderr
  assert "--print_config lists every key" in r.stderr


def test_help_points_at_print_config():
  r = _train_py("--help")  # absl's --help exits with status 1
  assert "--print_config" in r.stdout and "--config.<key>=<value>" in r.stdout


# --- recipe names -----------------------------------------------------------------------------


@pytest.mark.parametrize("given,runs_as", [("NVFP4", "nvfp4"), ("MxFp4", "mxfp4"),
                                           ("Quartet", "quartet"),
                                           ("MXFP4:block_size=16", "mxfp4:block_size=16")])
def test_recipe_names_ignore_case(given, runs_as):
  c = validate(small(**{"quant.recipe": given, "quant.high_precision_recipe": "BF16"}),
               device_count=8)
  assert c.quant.recipe == runs_as
  assert c.quant.high_precision_recipe == "bf16"


@pytest.mark.parametrize("given,hint", [("mxfp5", "(did you mean 'mxfp8' or 'mxfp4'?)"),
                                        ("nvfp", "(did you mean 'nvfp4'"),
                                        ("quartett", "(did you mean 'quartet'")])
def test_an_unknown_recipe_gets_did_you_mean(given, hint):
  with pytest.raises(ConfigError) as info:
    validate(small(**{"quant.recipe": given}), device_count=8)
  assert hint in str(info.value) and "docs/gemm.md" in str(info.value)
  assert "lpjax/quant/_" not in str(info.value)


def test_a_bad_variant_of_a_known_preset_names_the_modifier():
  with pytest.raises(ConfigError, match="unknown modifier 'colour'"):
    validate(small(**{"quant.recipe": "NVFP4:colour=red"}), device_count=8)


def test_no_recipe_name_is_close_gets_the_list_only():
  with pytest.raises(ConfigError) as info:
    validate(small(**{"quant.recipe": "zzzz"}), device_count=8)
  assert "did you mean" not in str(info.value) and "nvfp4" in str(info.value)


# --- keep_first / keep_last -------------------------------------------------------------------


@pytest.mark.parametrize("alias,key", [("keep_first_blocks", "keep_first"),
                                       ("keep_last_blocks", "keep_last")])
def test_quantpolicy_names_point_at_the_config_keys(alias, key):
  c = small()
  kept, unknown = cli.split_overrides(["train.py", f"--config.quant.{alias}=2"], c)
  with pytest.raises(ConfigError, match=f"the config key is quant.{key}, --config.quant.{key}=N"):
    validate(cli.add_overrides(c, unknown), device_count=8)


def test_readme_names_both_spellings_of_keep_blocks():
  readme = open(os.path.join(ROOT, "README.md")).read()
  assert "keep_first_blocks" in readme and "quant.keep_first" in readme


# --- a finished run asked for another experiment ----------------------------------------------


def test_a_finished_run_with_another_lr_suggests_a_new_workdir(tmp_path, caplog):
  workdir = str(tmp_path / "run")
  Trainer(small(steps=2), workdir).run()
  with caplog.at_level(logging.INFO, logger="lpjax.train"):
    again = Trainer(small(steps=2, **{"optimizer.lr": 5e-3}), workdir).run()
  assert again["steps"] == 2
  assert "already complete" in caplog.text and "give a new --workdir" in caplog.text
  assert "optimizer.lr 0.001 -> 0.005" in caplog.text
  assert "config changes" not in caplog.text  # not "resuming with changes": nothing resumed
