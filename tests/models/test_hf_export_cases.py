"""Adversarial cases of the Hugging Face import / export and of export_weights: models and folders
lpjax did not write. One row per case: what used to happen, what happens now (each test fails on
the code before its fix). The cases that need a trained run (an init_from folder that moved) are
in tests/train/model/test_hf_checkpoints.py.

| case | before | now |
|---|---|---|
| export into a non-empty folder | written beside the old shards, stale weights read back | refused; overwrite replaces the folder whole |
| ModelOpt NVFP4 export | quant_algo NVFP4 (W4A4: loaders want input_scale), weight_scale_2 (1,), no hf_quant_config.json | W4A16_NVFP4, a scalar, hf_quant_config.json with exclude_modules, "ignore" in config.json |
| DenseGeneral (32, 4, 8) / Conv1D (5, 16, 32) kernel | split into 32 / 5 "blocks", packed | left as they are, listed in a warning |
| a scanned stack whose leading axis is not num_blocks | split | left as it is, listed |
| params/ or model/ prefixes | the policy's anchored rules missed: a bf16 layer packed as FP4 | rules match the model's own names |
| linen scan stack params/layers/up/kernel | params/0/layers/up/kernel | layers/0/up/kernel (param_path: no "params" collection) |
| a weight not named kernel | dropped silently | listed in a warning |
| GPT-2 config.json | KeyError: 'num_attention_heads' | "not a LLaMA lpjax can load: model_type is 'gpt2' ..." |
| checkpoint vocabulary 300 > tokenizer 257 | trains silently | a warning that says so |
| a shard the index names is missing / a tensor is missing | FileNotFoundError / CheckpointError traceback | one ConfigError line |
| the default mxfp4 run exported as nvfp4 | refused for the Hadamard transform, then for the format | both reasons in one error |
"""

import json
import os

import jax
import numpy as np
import pytest

pytest.importorskip("safetensors")

from config_helpers import config_file, override  # noqa: E402
from lpjax import export as lpexport  # noqa: E402
from lpjax import quant  # noqa: E402
from lpjax.models import hf_llama, llama  # noqa: E402
from lpjax.train import ConfigError  # noqa: E402

V, D, F, H, L = 257, 64, 96, 4, 2


def _cfg():
  return llama.LlamaConfig(vocab_size=V, hidden=D, intermediate=F, heads=H, layers=L,
                           max_seq_len=32)


def _kernel(*shape, seed=0):
  return jax.random.normal(jax.random.key(seed), shape)


NAIVE = quant.QuantPolicy(recipe="mxfp4_naive", keep_high_precision=())


# --- writing --------------------------------------------------------------------------------


def test_a_non_empty_folder_is_refused_and_overwrite_replaces_it_whole(tmp_path):
  cfg, out = _cfg(), tmp_path / "out"
  old = llama.init_params(cfg, jax.random.key(0))
  hf_llama.save_pretrained(str(out), cfg, old, max_shard_bytes=100_000)  # sharded
  assert (out / "model.safetensors.index.json").exists()
  new = llama.init_params(cfg, jax.random.key(1))
  with pytest.raises(hf_llama.CheckpointError, match="not empty.*overwrite"):
    hf_llama.save_pretrained(str(out), cfg, new)
  assert (out / "model.safetensors.index.json").exists()  # untouched
  hf_llama.save_pretrained(str(out), cfg, new, overwrite=True)
  assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]  # no stale shard
  assert sorted(os.listdir(tmp_path)) == ["out"]  # no temporary sibling left
  _, back = hf_llama.load_pretrained(str(out), max_seq_len=32)
  want = np.asarray(new["lm_head"]["kernel"][...]).astype(jax.numpy.bfloat16).astype(np.float32)
  assert np.array_equal(np.asarray(back["lm_head"]["kernel"][...]), want)


def test_the_export_cli_refuses_a_non_empty_out_in_one_line(tmp_path, capsys):
  (tmp_path / "out").mkdir()
  (tmp_path / "out" / "model-00001-of-00002.safetensors").write_bytes(b"old")
  assert lpexport.main([f"--workdir={tmp_path / 'run'}", f"--out={tmp_path / 'out'}"]) == 1
  err = capsys.readouterr().err
  assert "is not empty" in err and "--overwrite" in err and len(err.strip().splitlines()) == 1


def test_the_modelopt_nvfp4_export_is_the_weight_only_variant_with_its_files(tmp_path):
  """Before: quant_algo "NVFP4" (ModelOpt's weights-and-activations variant, whose loader wants an
  input_scale per layer), weight_scale_2 of shape (1,), no hf_quant_config.json, the kept modules
  under a key neither loader reads in config.json."""
  cfg = _cfg()
  params = llama.init_params(cfg, jax.random.key(0))
  hf_llama.save_pretrained(str(tmp_path / "nv"), cfg, params, dtype="nvfp4",
                           policy=quant.QuantPolicy.from_settings("nvfp4"))
  t = hf_llama.read_tensors(str(tmp_path / "nv"))
  assert t["model.layers.0.mlp.up_proj.weight_scale_2"].shape == ()
  assert not any(k.endswith("input_scale") for k in t)
  with open(tmp_path / "nv" / "hf_quant_config.json") as f:
    modelopt = json.load(f)["quantization"]
  assert (modelopt["quant_algo"], modelopt["group_size"]) == ("W4A16_NVFP4", 16)
  assert modelopt["exclude_modules"] == ["lm_head"]
  with open(tmp_path / "nv" / "config.json") as f:
    qc = json.load(f)["quantization_config"]
  assert (qc["quant_method"], qc["quant_algo"], qc["ignore"]) == (
      "modelopt", "W4A16_NVFP4", ["lm_head"])


# --- export_weights on models lpjax did not write ----------------------------------------------


def test_3d_kernels_that_are_no_stack_of_blocks_are_not_split():
  params = {"attn": {"query": {"kernel": _kernel(32, 4, 8)}},  # DenseGeneral (in, heads, dim)
            "conv": {"kernel": _kernel(5, 16, 32)},  # Conv1D (width, in, out)
            "layers": {"up": {"kernel": _kernel(3, 64, 32)}}}  # a stack, but of 3, not 4 blocks
  with pytest.warns(UserWarning, match="left 3 array") as caught:
    packed = quant.export_weights(params, NAIVE.for_model(num_blocks=4))
  assert packed == {}
  message = str(caught[0].message)
  assert "attn/query/kernel (32, 4, 8)" in message and "conv/kernel (5, 16, 32)" in message
  # a real stack of the model's blocks is split, one entry per block
  packed = quant.export_weights({"layers": params["layers"]}, NAIVE.for_model(num_blocks=3))
  assert sorted(packed) == [f"layers/{i}/up/kernel" for i in range(3)]


def test_params_and_model_prefixes_do_not_hide_the_policys_rules():
  policy = quant.QuantPolicy(recipe="mxfp4_naive", keep_high_precision=(),
                             rules=((r"^mlp/down", "bf16"),))
  for prefix in ("params", "model"):
    params = {prefix: {"mlp": {"down": {"kernel": _kernel(64, 32)},
                               "up": {"kernel": _kernel(64, 32, seed=1)}}}}
    packed = quant.export_weights(params, policy)
    # down stays bf16; the name is param_path's: linen's "params" collection is left out
    assert sorted(packed) == [("" if prefix == "params" else "model/") + "mlp/up/kernel"], prefix


def test_a_linen_scan_stack_gets_its_block_index_after_the_stack():
  params = {"params": {"layers": {"up": {"kernel": _kernel(2, 64, 32)}}}}
  packed = quant.export_weights(params, NAIVE.for_model(num_blocks=2))
  assert sorted(packed) == ["layers/0/up/kernel", "layers/1/up/kernel"]
  want = quant.fake_quant(params["params"]["layers"]["up"]["kernel"][1].T, "mxfp4")
  assert np.array_equal(np.asarray(packed["layers/1/up/kernel"].dequantize()), want)


def test_a_weight_not_named_kernel_is_listed_not_dropped_silently():
  params = {"proj": {"w": _kernel(64, 32)}, "embed": {"embedding": _kernel(10, 64)},
            "norm": {"scale": _kernel(64)}}
  with pytest.warns(UserWarning, match=r"proj/w \(64, 32\): not named kernel"):
    assert quant.export_weights(params, NAIVE) == {}


# --- import -----------------------------------------------------------------------------------


def test_a_gpt2_config_is_not_a_llama_not_a_key_error():
  gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "vocab_size": 50257}
  with pytest.raises(hf_llama.CheckpointError, match="not a LLaMA.*'gpt2'.*num_attention_heads"):
    hf_llama.llama_config_from_hf(gpt2)


def _hf_checkpoint(path, vocab=V, drop=None, lose_shard=False):
  cfg = llama.LlamaConfig(vocab_size=vocab, hidden=D, intermediate=F, heads=H, layers=L,
                          max_seq_len=32)
  params = llama.init_params(cfg, jax.random.key(0))
  config, tensors = hf_llama.export_tensors(cfg, params, layout="float32")
  if drop:
    del tensors[drop]
  hf_llama.write_checkpoint(str(path), config, tensors, max_shard_bytes=200_000)
  if lose_shard:
    os.remove(sorted(path.glob("model-*.safetensors"))[-1])


def _task_config(path):
  return override(config_file("llama_tiny_mxfp4"), seq_len=16, batch_size=2,
                  **{"data.prefetch": 0, "model.init_from": f"hf:{path}"})


@pytest.fixture
def hf300(tmp_path):
  path = tmp_path / "hf300"
  path.mkdir()
  with open(path / "config.json", "w") as f:
    json.dump({**hf_llama.hf_config(_cfg()), "vocab_size": 300}, f)
  return path


def test_a_checkpoint_vocabulary_larger_than_the_tokenizers_warns(hf300):
  from lpjax.train.tasks.lm import llama_config_of

  with pytest.warns(UserWarning, match="300 tokens, the data's tokenizer 257"):
    cfg = llama_config_of(_task_config(hf300), 257)
  assert cfg.vocab_size == 300


@pytest.mark.parametrize("case,match", [("shard", "names 1 safetensors file.*not there"),
                                        ("tensor", "missing \\(1\\): model.norm.weight")])
def test_a_missing_shard_or_tensor_is_one_config_error(tmp_path, case, match):
  from lpjax.train.tasks.lm import LanguageModelTask

  path = tmp_path / "hf"
  _hf_checkpoint(path, drop="model.norm.weight" if case == "tensor" else None,
                 lose_shard=case == "shard")
  task = LanguageModelTask(_task_config(path))
  with pytest.raises(ConfigError, match=match) as error:
    task.pretrained_variables()
  assert error.value.__cause__ is None and "\n" not in str(error.value)


# --- refusals ---------------------------------------------------------------------------------


def test_the_default_mxfp4_run_exported_as_nvfp4_gives_both_reasons_at_once():
  cfg = _cfg()
  params = llama.init_params(cfg, jax.random.key(0))
  with pytest.raises(ValueError) as error:
    hf_llama.export_tensors(cfg, params, layout="nvfp4",
                            policy=quant.QuantPolicy.from_settings("mxfp4"))
  message = str(error.value)
  assert "What you train is what you serve" in message and "random Hadamard" in message
