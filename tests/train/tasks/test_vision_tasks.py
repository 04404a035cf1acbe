"""The tiny ResNet and U-Net configs run in the same trainer: results, metrics, sample grids, and
BatchNorm statistics that train, checkpoint and resume exactly."""

import glob
import json
import os

import jax
import numpy as np
import pytest

from config_helpers import config_file, override
from lpjax.train.loop._trainer import Trainer


def tiny(name, steps=2, **overrides):
  c = config_file(name)
  c.steps, c.batch_size, c.eval_every, c.checkpoint_every, c.log_every = steps, 16, 0, 0, 1
  c.eval_steps, c.progress_bar, c.data.prefetch = 2, False, 0
  c.optimizer.warmup_steps = 1
  if c.task == "diffusion":  # the ResNet configs have no diffusion section
    c.diffusion.num_samples, c.diffusion.sample_steps = 4, 2
  return override(c, **overrides)


@pytest.fixture(scope="module")
def resnet_bf16(tmp_path_factory):
  """(trainer, results, workdir) of one 2-step run of resnet_tiny_digits_bf16: its config test
  reads the files, the BatchNorm test resumes a split run against its final state."""
  workdir = tmp_path_factory.mktemp("resnet_bf16")
  trainer = Trainer(tiny("resnet_tiny_digits_bf16"), str(workdir))
  return trainer, trainer.run(), workdir


@pytest.mark.parametrize("name", ["resnet_tiny_digits_bf16", "resnet_tiny_digits_mxfp4"])
def test_resnet_tiny_configs_run(tmp_path, request, name):
  if name == "resnet_tiny_digits_bf16":  # the module's shared run
    _, results, workdir = request.getfixturevalue("resnet_bf16")
  else:
    results, workdir = Trainer(tiny(name), str(tmp_path)).run(), tmp_path
  saved = json.loads((workdir / "results.json").read_text())
  assert saved == results
  assert results["steps"] == 2 and results["images"] == 32 and results["task"] == "classification"
  for key in ("final_eval_loss", "final_eval_top1", "final_eval_top5", "final_eval_loss_fp",
              "final_eval_top1_fp", "final_eval_top5_fp"):
    assert np.isfinite(results[key]), key
  assert 0.0 <= results["final_eval_top1"] <= results["final_eval_top5"] <= 1.0
  lines = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert any("train/accuracy" in r and "train/images_per_second" in r for r in lines)


# unet_tiny_digits_mxfp4's own recipe (E4M3-scaled FP4) takes minutes to compile on a CPU (35
# quantized layers x 6 quantizers with exact two-level scale arithmetic), so CI runs that config
# with the E8M0 RTN recipe and the real one is a benchmark (pytest -m benchmark).
@pytest.mark.parametrize("name,overrides", [
    ("unet_tiny_digits_bf16", {}),
    ("unet_tiny_digits_mxfp4", {"quant.recipe": "mxfp4_naive"}),
    pytest.param("unet_tiny_digits_mxfp4", {}, marks=pytest.mark.benchmark),
], ids=["bf16", "mxfp4_config_e8m0_rtn", "mxfp4_config"])
def test_unet_tiny_configs_run_and_save_sample_grids(tmp_path, name, overrides):
  results = Trainer(tiny(name, **overrides), str(tmp_path)).run()
  assert results["task"] == "diffusion" and results["steps"] == 2
  assert np.isfinite(results["final_eval_loss"]) and np.isfinite(results["final_eval_loss_fp"])
  assert 0.2 < results["final_eval_loss_fp"] < 3.0  # eps-MSE of a barely trained model: ~1
  grids = glob.glob(str(tmp_path / "samples" / "step_*.png"))
  assert [os.path.basename(g) for g in grids] == ["step_0000002.png"]
  assert open(grids[0], "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_batchnorm_statistics_train_checkpoint_and_resume_exactly(tmp_path, resnet_bf16):
  full = resnet_bf16[0]  # 2 steps, uninterrupted
  init_stats = full.init_state().model_state
  moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(init_stats),
                                                    jax.tree.leaves(full.final_state.model_state))]
  assert moved and all(moved)  # every running mean / variance was updated by training
  split = tiny("resnet_tiny_digits_bf16")
  Trainer(split, str(tmp_path / "split")).run(stop_after=1)
  resumed = Trainer(split, str(tmp_path / "split"))
  resumed.run()
  for a, b in zip(jax.tree.leaves(full.final_state), jax.tree.leaves(resumed.final_state)):
    assert np.array_equal(np.asarray(a), np.asarray(b))
