"""benchmarks/memory/llama_memory.py (the JSON contract, what it measures) and benchmarks/memory/sharding_hints.py."""

import json
import os
import subprocess
import sys

import jax

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path[:0] = [os.path.join(os.path.join(ROOT, "benchmarks"), d)
                for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/

import llama_memory  # noqa: E402


def test_last_line_is_the_json_result_and_record_holds_its_figures(tmp_path):
  out = subprocess.run(
      [sys.executable, os.path.join(ROOT, "benchmarks", "memory", "llama_memory.py"),
       "--config=configs/llama_tiny_mxfp4.py", "--devices=8", "--vocab=512", "--record=tiny_mem"],
      cwd=ROOT, capture_output=True, text=True, timeout=600, check=True,
      env=dict(os.environ, LPJAX_RECORDS_DIR=str(tmp_path))).stdout
  result = json.loads(out.strip().splitlines()[-1])
  assert result["devices"] == 8
  assert result["per_device_bytes"] > 0 and result["baseline_per_device_bytes"] > 0
  assert abs(result["ratio"] - result["per_device_bytes"] / result["baseline_per_device_bytes"]) < 1e-9
  record = json.loads((tmp_path / "tiny_mem.json").read_text())
  figures = record["figures"]
  assert figures["per_device_bytes"] == result["per_device_bytes"]
  assert figures["per_device_gib"] == result["per_device_bytes"] / 2**30
  assert figures["baseline_gib"] == result["baseline_per_device_bytes"] / 2**30
  assert figures["ratio"] == result["ratio"]
  assert record["command"] == ("python benchmarks/memory/llama_memory.py --config=configs/llama_tiny_mxfp4.py "
                               "--devices=8 --vocab=512 --record=tiny_mem")


def test_remat_and_fsdp_lower_the_per_device_memory():
  """Rematerialization keeps less, and fsdp over 8 devices holds 1/8 of the weights per device."""
  config = llama_memory.baseline_of(llama_memory.load_config(
      os.path.join(ROOT, "configs", "llama_tiny_mxfp4.py")))
  config.batch_size, config.seq_len = 64, 128
  config.mesh.data, config.mesh.fsdp = 1, 8
  sizes = {}
  for remat in (False, True):
    config.model.remat = remat
    sizes[remat] = llama_memory.per_device_bytes(config.copy_and_resolve_references(), 512,
                                                 jax.devices()[:8])
  assert sizes[True][1]["temporaries"] < sizes[False][1]["temporaries"]
  one = config.copy_and_resolve_references()
  one.mesh.data, one.mesh.fsdp = 1, 1
  _, parts_one, _ = llama_memory.per_device_bytes(one, 512, jax.devices()[:1])
  params_8 = sizes[True][1]["arguments"]
  assert params_8 < parts_one["arguments"] / 4  # weights and moments sharded 8 ways (+ the batch)
  # The breakdown, re-derived: FP32 Adam on one device holds 4 bytes per parameter, m and v 4
  # each (plus its step count); parameters + optimizer state are the arguments but the batch.
  from lpjax.models import llama
  from lpjax.train.tasks.lm import llama_config_of
  n = sum(a.size for a in jax.tree.leaves(jax.eval_shape(
      lambda: llama.init_params(llama_config_of(one, 512), jax.random.key(0)))))
  assert parts_one["parameters"] == parts_one["gradients"] == 4 * n
  assert 8 * n <= parts_one["optimizer_state"] <= 8 * n + 64
  assert parts_one["accumulators"] == (4 * n if one.grad_accum_steps > 1 else 0)
  batch = parts_one["arguments"] - parts_one["parameters"] - parts_one["optimizer_state"]
  assert 0 <= batch <= 2 * one.batch_size * one.seq_len * 4 + 64  # inputs, targets, the key
  eight = sizes[True][1]  # per device under fsdp 8: a shard of each (norm scales replicated)
  assert parts_one["parameters"] / 8 <= eight["parameters"] < parts_one["parameters"] / 4
  assert parts_one["activations_and_other"] == (parts_one["temporaries"] - parts_one["gradients"]
                                                - parts_one["accumulators"])


def test_sharding_hints_benchmark_runs():
  out = subprocess.run(
      [sys.executable, os.path.join(ROOT, "benchmarks", "memory", "sharding_hints.py"), "--devices=8",
       "--recipe=bf16", "--optimizer=adamw", "--batch_size=16", "--seq_len=32", "--repeats=1"],
      cwd=ROOT, capture_output=True, text=True, timeout=600, check=True).stdout
  result = json.loads(out.strip().splitlines()[-1])
  assert result["step_s_with_hints"] > 0 and result["step_s_without_hints"] > 0


def test_the_baseline_is_adam_with_the_adamw_configs_clipping():
  """The FP4 configs run Stable-SPAM without global clipping; their FP32 Adam baseline clips at
  1.0 as the AdamW configs do (before, it inherited the config's 0 and ran an unusual Adam)."""
  config = llama_memory.load_config(os.path.join(ROOT, "configs", "llama_1b_mxfp4.py"))
  assert config.optimizer.grad_clip == 0 and config.optimizer.total_steps == -1
  base = llama_memory.baseline_of(config)
  assert base.optimizer.name == "adam" and base.optimizer.state_dtype == "float32"
  assert base.optimizer.grad_clip == 1.0 and base.optimizer.total_steps == 0
  assert config.optimizer.grad_clip == 0  # the config itself is unchanged
