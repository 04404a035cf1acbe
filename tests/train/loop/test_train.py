"""The LLaMA trainer end to end on CPU: tiny configs, loss falls, fsdp == 1 device, exact resume."""

import json
import os

import jax
import numpy as np
import pytest

from config_helpers import small
from lpjax.train import ConfigError, validate
from lpjax.train.loop._trainer import Trainer


def leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("recipe,optimizer", [("bf16", "adamw"), ("mxfp4", "stable_spam"),
                                              ("nvfp4", "adamw")])
def test_tiny_configs_run_and_write_results(tmp_path, recipe, optimizer):
  results = Trainer(small(recipe, optimizer), str(tmp_path)).run()
  saved = json.loads((tmp_path / "results.json").read_text())
  for key in ("steps", "tokens", "final_train_loss", "final_eval_loss", "final_eval_ppl",
              "final_eval_loss_fp", "wall_time_s"):
    assert key in saved, key
  assert saved["steps"] == 3 and saved["tokens"] == 3 * 8 * 32
  (segment,) = saved["segments"]  # one process: one segment, its time the run's
  assert (segment["start_step"], segment["end_step"], segment["ended"]) == (0, 3, "finished")
  assert saved["wall_time_s"] == pytest.approx(segment["wall_s"], abs=0.01)
  assert np.isfinite(saved["final_eval_loss"]) and np.isfinite(saved["final_eval_loss_fp"])
  assert abs(saved["final_eval_ppl"] - np.exp(saved["final_eval_loss"])) < 1e-6 * saved["final_eval_ppl"]
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert any("train/loss" in l for l in lines) and any("eval/loss_fp" in l for l in lines)
  assert os.listdir(tmp_path / "tensorboard")
  assert results["final_eval_loss"] == saved["final_eval_loss"]


def test_loss_falls_on_the_offline_corpus(tmp_path):
  c = small("mxfp4", "stable_spam", steps=50)
  c.optimizer.lr, c.optimizer.warmup_steps, c.log_every = 3e-3, 5, 5
  Trainer(c, str(tmp_path)).run()
  losses = [json.loads(l)["train/loss"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()
            if "train/loss" in l]
  assert losses[-1] < losses[0] - 1.0, losses  # from ~ln(257) = 5.5 to well below


def test_fsdp_over_8_devices_matches_one_device(tmp_path):
  """Same losses to fp32 tolerance (fp32 GEMMs; sharding only changes the summation order)."""
  assert jax.device_count() == 8
  one = Trainer(small("fp32", steps=3, **{"mesh.data": 1}), str(tmp_path / "one"),
                devices=jax.devices()[:1])
  r1 = one.run()
  eight = Trainer(small("fp32", steps=3, **{"mesh.data": 1, "mesh.fsdp": 8}), str(tmp_path / "eight"))
  r8 = eight.run()
  kernel = eight.final_state.params["layers"]["mlp"]["up_proj"]["kernel"][...]  # scanned: stacked
  assert "fsdp" in str(kernel.sharding.spec)  # really sharded
  assert len(kernel.sharding.device_set) == 8
  for key in ("final_train_loss", "final_eval_loss", "final_eval_loss_fp"):
    np.testing.assert_allclose(r8[key], r1[key], rtol=1e-5)


def test_gradient_accumulation_gives_the_same_update(tmp_path):
  cfg = {"batch_size": 32}  # 4 microbatches of 8 rows, one row per device each
  one = Trainer(small("fp32", steps=2, **cfg), str(tmp_path / "one"))
  one.run()
  four = Trainer(small("fp32", steps=2, grad_accum_steps=4, **cfg), str(tmp_path / "four"))
  four.run()
  for a, b in zip(leaves(one.final_state.opt_state), leaves(four.final_state.opt_state)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)  # Adam moments ~ 1e-3: the gradients


def test_stop_and_resume_is_bit_identical(tmp_path):
  # the config of test_tiny_configs_run_and_write_results[mxfp4-stable_spam] (3 steps): its
  # compiled steps come from the compile cache
  cfg = dict(recipe="mxfp4", optimizer="stable_spam", steps=3)
  full = Trainer(small(**cfg), str(tmp_path / "full"))
  full.run()
  first = Trainer(small(**cfg), str(tmp_path / "split"))
  assert first.run(stop_after=2)["stopped"]
  second = Trainer(small(**cfg), str(tmp_path / "split"))  # a new process would do the same
  results = second.run()
  assert results["steps"] == 3
  for a, b in zip(leaves(full.final_state), leaves(second.final_state)):
    assert np.array_equal(a, b)


def test_c4_through_tfds_mock_data(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  import tensorflow_datasets.text.c4  # noqa: F401

  c = small(steps=2, **{"data.source": "tfds", "data.tfds_name": "c4/en"})
  with tfds.testing.mock_data(num_examples=32, policy=tfds.testing.MockPolicy.USE_CODE):
    results = Trainer(c, str(tmp_path)).run()
  assert results["steps"] == 2 and np.isfinite(results["final_eval_loss"])


@pytest.mark.parametrize("overrides,match", [
    ({"mesh.fsdp": 3}, "does not divide"),
    ({"mesh.data": 2, "mesh.fsdp": 2}, "Impossible mesh"),
    ({"batch_size": 12}, "not divisible"),
    ({"batch_size": 16, "grad_accum_steps": 4}, "grad_accum_steps"),
    ({"model.max_seq_len": 16}, "exceeds model.max_seq_len"),
    ({"data.tokenizer": "/nonexistent/spiece.model"}, "SentencePiece"),
    ({"quant.recipe": "mxfp5"}, "valid: "),
    ({"optimizer.name": "sgd"}, "valid: adamw"),
    ({"data.source": "tfds"}, "needs data.tfds_name"),
])
def test_config_errors_fail_before_compiling(overrides, match):
  with pytest.raises(ConfigError, match=match):
    validate(small(**overrides), device_count=8)


def test_unknown_config_key_is_named():
  c = small()
  with c.unlocked():
    c.optimizer.lrr = 1e-3
  with pytest.raises(ConfigError, match="optimizer.lrr"):
    validate(c, device_count=8)


def test_sequence_length_curriculum(tmp_path):
  """Short sequences first: 2 steps of 16 tokens, then 2 of 32 (data.seq_len_schedule)."""
  from lpjax.train.config import seq_len_at

  c = small(steps=4, **{"data.seq_len_schedule": "16:0.5"})
  assert [seq_len_at(c, s) for s in range(4)] == [16, 16, 32, 32]
  results = Trainer(c, str(tmp_path)).run()
  assert results["tokens"] == 8 * (16 + 16 + 32 + 32)
  per_second = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()
                if "train/loss" in l]
  assert [r["step"] for r in per_second] == [1, 2, 3, 4]


def test_distributed_initialize_gets_the_configured_arguments(monkeypatch, tmp_path):
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
  c = small(**{"distributed.initialize": True, "distributed.coordinator_address": "10.0.0.1:1234",
               "distributed.num_processes": 1, "distributed.process_id": 0})
  Trainer(c, str(tmp_path))
  assert calls == [{"coordinator_address": "10.0.0.1:1234", "num_processes": 1, "process_id": 0}]
  calls.clear()
  Trainer(small(**{"distributed.initialize": True}), str(tmp_path / "auto"))
  assert calls == [{}]  # auto-detection (SLURM, TPU, ...) when nothing is given
  calls.clear()
  Trainer(small(), str(tmp_path / "off"))
  assert calls == []


def test_compile_time_is_logged_and_reported(tmp_path, caplog):
  with caplog.at_level("INFO", logger="lpjax.train"):
    results = Trainer(small("bf16", steps=2), str(tmp_path)).run()
  lines = [r.getMessage() for r in caplog.records if "compiled in" in r.getMessage()]
  assert len(lines) == 1 and lines[0].startswith("Train step for recipe bf16 compiled in ")
  seconds = float(lines[0].split("compiled in ")[1].split(" s")[0])
  assert results["compile_time_s"] == pytest.approx(seconds, abs=0.06) and seconds > 0
