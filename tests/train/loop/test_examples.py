"""The own-model examples (examples/own_model.py) that README's "Your own model" and
docs/your_own_model.md give: the commands name files that exist, and each factory trains a few
steps of its command's config on the CPU (the full commands: about a minute)."""

import os
import re

import numpy as np
import pytest

from config_helpers import CONFIGS_DIR, config_file, override
from lpjax.train.loop._trainer import QUANT_REPORT, Trainer

ROOT = os.path.dirname(CONFIGS_DIR)
COMMAND = re.compile(r"python train\.py --config=configs/(\w+)\.py((?:\s*\\?\s*--config\.\S+)*)")


def _commands(path):
  """(config name, {override: value}) of every `python train.py ...` command in a file that uses
  an example factory."""
  text = open(os.path.join(ROOT, path)).read()
  out = []
  for name, flags in COMMAND.findall(text):
    overrides = dict(f.split("=", 1) for f in re.findall(r"--config\.(\S+)", flags))
    if overrides.get("model.factory", "").startswith("examples."):
      out.append((name, overrides))
  return out


def test_readme_and_docs_give_the_example_commands():
  readme, docs = _commands("README.md"), _commands("docs/your_own_model.md")
  assert ("resnet_tiny_digits_mxfp4", {"model.factory": "examples.own_model:digits_cnn"}) in readme
  factories = {o["model.factory"] for _, o in docs}
  assert factories == {"examples.own_model:digits_cnn", "examples.own_model:tiny_lm"}


@pytest.mark.parametrize("name,overrides", _commands("docs/your_own_model.md"),
                         ids=lambda x: x if isinstance(x, str) else x["model.factory"])
def test_example_factory_trains(tmp_path, name, overrides):
  c = config_file(name)
  for key, value in overrides.items():  # a flag's text in the type of the config's value
    node, (*parents, leaf) = c, key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = type(node[leaf])(value)
  c = override(c, steps=6, eval_every=0, checkpoint_every=0, eval_steps=1, log_every=1,
               progress_bar=False, batch_size=8, **{"data.prefetch": 0,
                                                    "optimizer.warmup_steps": 2})
  if c.task == "lm":
    c.seq_len = 32  # compiles in a third of the time of the command's 128
  results = Trainer(c, str(tmp_path)).run()
  assert results["steps"] == 6 and results["model"] == overrides["model.factory"]
  assert np.isfinite(results["final_train_loss"]) and np.isfinite(results["final_eval_loss"])
  report = (tmp_path / QUANT_REPORT).read_text()
  assert " quantized" in report and "high precision (kept by the policy)" in report


def test_example_module_docstring_runs():
  import doctest
  import importlib
  import sys

  sys.path.insert(0, ROOT)
  module = importlib.import_module("examples.own_model")
  assert doctest.testmod(module).failed == 0
