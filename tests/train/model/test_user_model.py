"""The trainer with the user's own Flax model (`model.factory`), its GEMMs quantized by
interception: bit-identical to lpjax's LLaMA when it is the same model, sharded under fsdp,
linen and NNX, LM and classification, and a clear error for a bad factory."""

import json

import jax
import numpy as np
import pytest

from config_helpers import override, small
from lpjax.train.cli._vision_configs import vision_config
from lpjax.train import ConfigError
from lpjax.train.loop._trainer import Trainer

FACTORY = "user_models:plain_llama"


def _run(tmp_path, name, config, devices=None):
  trainer = Trainer(config, str(tmp_path / name), devices=devices)
  return trainer, trainer.run()


@pytest.mark.slow
def test_plain_flax_llama_trains_bit_identically_to_lpjax_llama(tmp_path):
  """Same weights (the factory loads lpjax's init from the run's key), same batches and keys:
  MXFP4 + Stable-SPAM losses agree to the bit, step by step."""
  lp, r_lp = _run(tmp_path, "lpjax", small("mxfp4", "stable_spam", steps=3))
  ours, r_ours = _run(tmp_path, "factory", small("mxfp4", "stable_spam", steps=3,
                                                 **{"model.factory": FACTORY}))
  lines = lambda d: [json.loads(l) for l in (tmp_path / d / "metrics.jsonl").read_text().splitlines()
                     if "train/loss" in l]
  assert [l["train/loss"] for l in lines("factory")] == [l["train/loss"] for l in lines("lpjax")]
  for key in ("final_train_loss", "final_eval_loss", "final_eval_loss_fp"):
    assert r_ours[key] == r_lp[key], key
  assert json.loads((tmp_path / "factory" / "results.json").read_text())["model"] == FACTORY


@pytest.mark.slow
def test_plain_flax_llama_under_fsdp_is_bit_identical_to_lpjax_llama(tmp_path):
  """8 devices, fsdp: the same sharding (the model's partition_rules) and the FP4 weight
  all-gather through the interception give lpjax's LLaMA's losses to the bit."""
  c = lambda **kw: small("mxfp4", "stable_spam", steps=2, **{"mesh.data": 1, "mesh.fsdp": 8, **kw})
  lp, r_lp = _run(tmp_path, "lpjax", c())
  ours, r_ours = _run(tmp_path, "factory", c(**{"model.factory": FACTORY}))
  kernel = ours.final_state.params["layers"]["mlp"]["up_proj"]["kernel"][...]
  assert "fsdp" in str(kernel.sharding.spec) and len(kernel.sharding.device_set) == 8
  for key in ("final_train_loss", "final_eval_loss"):
    assert r_ours[key] == r_lp[key], key


@pytest.mark.slow
def test_factory_model_under_fsdp_matches_one_device(tmp_path):
  c = lambda **kw: small("mxfp4_naive", steps=2, **{"model.factory": "user_models:linen_lm",
                                                      "mesh.data": 1, **kw})
  _, r1 = _run(tmp_path, "one", c(), devices=jax.devices()[:1])
  eight, r8 = _run(tmp_path, "eight", c(**{"mesh.fsdp": 8}))
  up = eight.final_state.params["up"]["kernel"]
  assert "fsdp" in str(up.sharding.spec) and len(up.sharding.device_set) == 8
  np.testing.assert_allclose(r8["final_train_loss"], r1["final_train_loss"], rtol=1e-5)


def test_factory_model_kept_sites_run_as_given_with_high_precision_auto(tmp_path):
  """quant.high_precision_recipe="auto" (the library's default; the config's stays "bf16"): the
  fp32 factory model's kept sites run its own GEMMs, and the report says so."""
  c = small("mxfp4_naive", steps=2, **{"model.factory": "user_models:linen_lm",
                                       "quant.high_precision_recipe": "auto"})
  _, results = _run(tmp_path, "auto", c, devices=jax.devices()[:1])
  assert results["steps"] == 2 and np.isfinite(results["final_train_loss"])
  rows = [l.split() for l in (tmp_path / "auto" / "quant_report.txt").read_text().splitlines()]
  head = next(r for r in rows if r and r[0] == "lm_head")
  up = next(r for r in rows if r and r[0] == "up")
  assert "auto" in head and "high" in head and "mxfp4_naive" in up and "quantized" in up


def test_linen_classifier_with_batch_statistics(tmp_path):
  c = override(vision_config("resnet_tiny", recipe="mxfp4"), steps=2, batch_size=16, eval_every=0,
               checkpoint_every=0, eval_steps=1, progress_bar=False, **{
                   "data.prefetch": 0, "model.factory": "user_models:linen_cnn"})
  trainer, results = _run(tmp_path, "cnn", c)
  assert results["steps"] == 2 and np.isfinite(results["final_eval_loss"])
  stats = trainer.final_state.model_state["batch_stats"]["bn"]["mean"]
  assert not np.allclose(np.asarray(stats), 0.0)  # updated in train mode


@pytest.mark.parametrize("factory,match", [
    ("user_models", "write 'package.module:function'"),
    ("no_such_package.models:build", "cannot import 'no_such_package.models'"),
    ("user_models:missing", "has no function 'missing'"),
    ("user_models:not_a_model", "must return a Flax linen or NNX module"),
])
def test_bad_factory_is_a_config_error(tmp_path, factory, match):
  with pytest.raises(ConfigError, match=match):
    Trainer(small(steps=1, **{"model.factory": factory}), str(tmp_path))
