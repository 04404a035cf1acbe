"""Factory models with dropout and BatchNorm (issue 48, item 9) train, evaluate and resume exactly;
a factory run names its model and writes its call-site report (item 12).

Each model of CASES trains 4 steps straight and 2 + 2 steps (stopped and checkpointed at step 2,
resumed by a new Trainer): the logged losses, the final evaluation, the parameters and the model
state (BatchNorm statistics) agree to the bit. Dropout draws its masks from (seed, step): it is
active in training (two step keys give two outputs) and off in evaluation (any key, one output).
"""

import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from config_helpers import override, small
from lpjax.train.loop._trainer import QUANT_REPORT, Trainer
from lpjax.train.cli._vision_configs import vision_config

STEPS, STOP = 4, 2


def _config(task, factory, recipe):
  if task == "lm":
    return small(recipe, steps=STEPS, **{"model.factory": f"user_models:{factory}"})
  return override(vision_config("resnet_tiny", recipe=recipe), steps=STEPS, batch_size=16,
                  eval_every=0, checkpoint_every=0, eval_steps=1, log_every=1, progress_bar=False,
                  **{"data.prefetch": 0, "model.factory": f"user_models:{factory}"})


# (task, factory, recipe, has model state)
CASES = [
    ("lm", "linen_dropout_lm", "mxfp4", False),  # nn.Dropout, `deterministic` argument
    ("lm", "nnx_dropout_lm", "bf16", False),  # nnx.Dropout: its rng stream drawn per step
    ("classification", "nnx_batchnorm_cnn", "mxfp4", True),  # nnx.BatchNorm + nnx.Dropout
    ("classification", "linen_dropout_field", "bf16", False),  # the switch is a module field
    ("classification", "linen_cnn", "bf16", True),  # nn.BatchNorm, `train` argument
    ("classification", "nnx_train_argument", "bf16", False),  # NNX __call__(x, train)
    ("lm", "nnx_scan_dropout_lm", "bf16", False),  # nnx.scan over blocks, stacked dropout keys
    ("lm", "linen_scan_dropout_lm", "bf16", False),  # nn.scan, split dropout, `training`
]


def _losses(workdir):
  return [json.loads(line)["train/loss"] for line in (workdir / "metrics.jsonl").read_text()
          .splitlines() if "train/loss" in line]


@pytest.mark.parametrize("task,factory,recipe,stateful", CASES,
                         ids=[f"{c[1]}-{c[2]}" for c in CASES])
def test_trains_evaluates_and_resumes_exactly(tmp_path, task, factory, recipe, stateful):
  full = Trainer(_config(task, factory, recipe), str(tmp_path / "full"))
  r_full = full.run()
  Trainer(_config(task, factory, recipe), str(tmp_path / "split")).run(stop_after=STOP)
  resumed = Trainer(_config(task, factory, recipe), str(tmp_path / "split"))
  r_split = resumed.run()

  losses = _losses(tmp_path / "full")
  assert len(losses) == STEPS and all(np.isfinite(losses))
  assert _losses(tmp_path / "split") == losses
  for key in ("final_train_loss", "final_eval_loss", "final_eval_loss_fp"):
    assert r_split[key] == r_full[key], key
  for a, b in zip(jax.tree.leaves(full.final_state), jax.tree.leaves(resumed.final_state)):
    assert np.array_equal(np.asarray(a), np.asarray(b))
  state = full.final_state.model_state
  if stateful:  # BatchNorm statistics: the run's state, updated by training, checkpointed
    start = full.init_state().model_state
    moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(start),
                                                      jax.tree.leaves(state))]
    assert moved and all(moved)
  else:
    assert state is None  # dropout's rng streams are drawn per step, not carried as state


# (task, factory, whether dropout feeds the output layer directly: then the masks' mean is the
# evaluation output, as inverted dropout promises)
DROPOUT = [("lm", "linen_dropout_lm", True), ("lm", "nnx_dropout_lm", True),
           ("classification", "linen_dropout_field", True),
           ("classification", "nnx_train_argument", True),
           ("lm", "nnx_scan_dropout_lm", False), ("lm", "linen_scan_dropout_lm", False)]


@pytest.mark.parametrize("task,factory,last", DROPOUT, ids=[c[1] for c in DROPOUT])
def test_dropout_is_on_in_training_and_off_in_evaluation(tmp_path, task, factory, last):
  user = Trainer(_config(task, factory, "bf16"), str(tmp_path)).task.user
  params, state = user.init_variables(jax.random.key(0))
  inputs = (jnp.arange(64, dtype=jnp.int32).reshape(2, 32) if task == "lm" else
            jax.random.uniform(jax.random.key(3), (2, 8, 8, 1)))
  out = lambda train, key: np.asarray(user.forward(None, train=train)(
      params, state, inputs, jax.random.key(key))[0])
  assert not np.array_equal(out(True, 1), out(True, 2))  # new masks each step
  assert np.array_equal(out(True, 1), out(True, 1))  # the same step, the same masks (resume)
  assert np.array_equal(out(False, 1), out(False, 2))  # evaluation: no masks
  assert not np.array_equal(out(True, 1), out(False, 1))
  if last:  # evaluation is the model without dropout: the masks' mean (inverted dropout)
    mean = np.mean([out(True, k) for k in range(200)], axis=0)
    np.testing.assert_allclose(mean, out(False, 0), atol=0.15)


def test_factory_run_names_its_model_and_writes_the_call_site_report(tmp_path, caplog):
  c = _config("classification", "nnx_batchnorm_cnn", "mxfp4")
  c.steps = 1
  with caplog.at_level(logging.INFO, logger="lpjax.train"):
    results = Trainer(c, str(tmp_path)).run()
  log = "\n".join(r.getMessage() for r in caplog.records)
  assert "Model: user_models:nnx_batchnorm_cnn (NNX NNXBatchNormCNN), 362 parameters." in log
  assert results["model"] == "user_models:nnx_batchnorm_cnn"  # not the config's resnet_tiny
  assert json.loads((tmp_path / "results.json").read_text())["model"] == results["model"]
  report = (tmp_path / QUANT_REPORT).read_text()
  assert report in log + "\n"
  rows = {line.split()[0]: line for line in report.splitlines()[2:-1]}
  assert set(rows) == {"conv", "head"}
  assert "conv_general_dilated" in rows["conv"] and "quantized" in rows["conv"]
  assert "mxfp4" in rows["conv"]
  assert "high precision" in rows["head"]  # the default policy keeps a layer named head
  assert report.splitlines()[-1] == ("2 GEMM call sites: 1 quantized, 1 high precision, "
                                     "0 unchanged")
