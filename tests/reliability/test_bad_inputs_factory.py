"""The bad-input table (issue 48, items 9-11), `model.factory`: a factory whose arguments do not
match, a model whose output is not the task's logits, and a model that draws random numbers in
evaluation each stop with one ConfigError (train.py prints it as one "Config error" line, exit
status 2) before anything compiles; the factories that do fit (any argument order, **kwargs, a
module class itself) build.

The factories are in tests/train/user_models.py. Rows construct the Trainer in-process (the task
builds the model abstractly, `jax.eval_shape`), so the table costs seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bad_input_cases import Case, Holds, Raises, check
from config_helpers import override, small

from lpjax.train import ConfigError
from lpjax.train.loop._trainer import Trainer
from lpjax.train.model._user_model import UserModel, factory_kwargs
from lpjax.train.cli._vision_configs import vision_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "tests", "train")  # user_models.py
sys.path.insert(0, MODELS)

CE = ConfigError
LM_PASSES = "The trainer passes by keyword those of vocab_size, seq_len, config, rngs"
CLS_PASSES = "The trainer passes by keyword those of num_classes, image_shape, config, rngs"


def _lm(factory, **overrides):
  return small("mxfp4", steps=1, **{"model.factory": f"user_models:{factory}", **overrides})


def _cls(factory):
  return override(vision_config("resnet_tiny", recipe="mxfp4"), steps=1, batch_size=8,
                  eval_steps=1, progress_bar=False,
                  **{"data.prefetch": 0, "model.factory": f"user_models:{factory}"})


def _trainer(tmp_path, config):
  return Trainer(config, str(tmp_path / "run"))


def _builds(tmp_path, config, kind):
  return _trainer(tmp_path, config).task.user.kind == kind


def _kwargs(factory, available):
  return factory_kwargs(factory, available, "m:build")


CASES = [
    # item 10: the factory's arguments
    Case("arguments", "names the trainer does not pass",
         lambda t: _trainer(t, _lm("wrong_arguments")),
         Raises(CE, "wrong_arguments() needs the argument(s) vocab, hidden, which the trainer "
                    "does not pass. " + LM_PASSES)),
    Case("arguments", "a classification factory with an LM's argument",
         lambda t: _trainer(t, _cls("linen_lm")),
         Raises(CE, "linen_lm() needs the argument(s) vocab_size, which the trainer does not "
                    "pass. " + CLS_PASSES)),
    Case("arguments", "keyword-only and defaulted arguments",
         lambda t: _kwargs(lambda *, vocab_size, depth=2: None, {"vocab_size": 5, "seq_len": 8})
         == {"vocab_size": 5}, Holds("passed by name, the default kept")),
    Case("arguments", "**kwargs takes every name",
         lambda t: _kwargs(lambda **kw: None, {"vocab_size": 5, "seq_len": 8})
         == {"vocab_size": 5, "seq_len": 8}, Holds("all passed")),
    Case("arguments", "a positional-only argument cannot be passed by name",
         lambda t: _kwargs(lambda vocab_size, /: None, {"vocab_size": 5}),
         Raises(CE, "<lambda>() needs the argument(s) vocab_size, which the trainer does not "
                    "pass")),
    Case("arguments", "a linen module class is its own factory",
         lambda t: _builds(t, _lm("LinenLM"), "linen"), Holds("LinenLM(vocab_size=...)")),
    # item 11: the output, checked with jax.eval_shape before compiling
    Case("output", "an LM returning (B, vocab): the last token only",
         lambda t: _trainer(t, _lm("last_token_lm")),
         Raises(CE, "in training the model maps inputs (2, 32) int32 to logits (2, 257); the lm "
                    "task expects (batch, seq_len, vocab_size) = (2, 32, 257).")),
    Case("output", "an LM's logits wider than the vocabulary",
         lambda t: _trainer(t, _lm("wide_lm")),
         Raises(CE, "logits (2, 32, 264); the lm task expects (batch, seq_len, vocab_size) = "
                    "(2, 32, 257). The last dimension is 264, not 257")),
    Case("output", "a vocabulary padded in the model",
         lambda t: _trainer(t, _lm("padded_lm")),
         Raises(CE, "if the extra columns are deliberate (padding), set "
                    "--config.model.vocab_size=264.")),
    Case("output", "... and named in the config",
         lambda t: _builds(t, _lm("padded_lm", **{"model.vocab_size": 264}), "linen"),
         Holds("model.vocab_size=264 and the model's 264 columns agree")),
    Case("output", "a classifier with other classes than the data",
         lambda t: _trainer(t, _cls("wrong_classes")),
         Raises(CE, "(2, 12); the classification task expects (batch, num_classes) = (2, 10). "
                    "The last dimension is 12, not 10")),
    Case("output", "a tuple (logits, features)",
         lambda t: _trainer(t, _cls("tuple_classifier")),
         Raises(CE, "the model returns a tuple for inputs (2, 8, 8, 1) float32; the trainer "
                    "needs one array of logits (batch, num_classes) = (2, 10)")),
    # item 9: evaluation is deterministic
    Case("evaluation", "dropout that no argument turns off",
         lambda t: _trainer(t, _cls("linen_dropout_no_switch")),
         Raises(CE, "in evaluation the model still draws random numbers (Dropout_0 needs PRNG "
                    "for \"dropout\")")),
    Case("evaluation", "BatchNorm that no argument switches to its running averages",
         lambda t: _trainer(t, _cls("linen_batchnorm_no_switch")),
         Raises(CE, "in evaluation the model still updates its statistics (Cannot update "
                    "variable \"mean\" in \"/BatchNorm_0\" because collection \"batch_stats\" "
                    "is immutable). Give its __call__ a `train` argument")),
    Case("evaluation", "a dropout switch that is a module field",
         lambda t: _builds(t, _cls("linen_dropout_field"), "linen"),
         Holds("LinenDropoutField(deterministic=True) in evaluation")),
    Case("evaluation", "NNX BatchNorm and dropout",
         lambda t: _builds(t, _cls("nnx_batchnorm_cnn"), "nnx"), Holds("eval() mode")),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c.group}: {c.name}" for c in CASES])
def test_bad_factory(case, tmp_path):
  check(case, lambda: case.run(tmp_path))


def test_nothing_is_written_before_the_error(tmp_path):
  """The check runs while the Trainer is built: no checkpoint, metric or results file."""
  with pytest.raises(ConfigError):
    _trainer(tmp_path, _lm("last_token_lm"))
  left = sorted(os.listdir(tmp_path / "run")) if (tmp_path / "run").exists() else []
  assert left == [], left


def test_train_py_prints_one_config_error_line(tmp_path):
  """train.py: exit status 2, one "Config error" line naming what the trainer passes, and no
  traceback."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="",
             PYTHONPATH=os.pathsep.join([ROOT, MODELS]))
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, "train.py"),
       f"--config={os.path.join(ROOT, 'configs', 'llama_tiny_mxfp4.py')}",
       f"--workdir={tmp_path / 'run'}", "--config.model.factory=user_models:wrong_arguments"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
  assert errors == [
      "Config error: model.factory='user_models:wrong_arguments': wrong_arguments() needs the "
      "argument(s) vocab, hidden, which the trainer does not pass. " + LM_PASSES + " that the "
      "factory takes: rename the factory's arguments to these names, or give the others default "
      "values."], proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr


def test_user_model_needs_no_trainer():
  """UserModel checks a factory's output on its own (the task hands it `Expected`)."""
  import jax.numpy as jnp
  import user_models
  from lpjax.train.model._user_model import Expected

  with pytest.raises(ConfigError, match=r"logits \(2, 16\); the lm task expects"):
    UserModel(user_models.last_token_lm, {"vocab_size": 16}, jnp.zeros((1, 4), jnp.int32),
              spec="m:f", expected=Expected("(batch, seq_len, vocab_size)", (2, 4, 16),
                                            "model.vocab_size"), task="lm")
