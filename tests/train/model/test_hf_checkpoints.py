"""A Hugging Face checkpoint in (model.init_from=hf:PATH), a few FP4 steps, the run out
(python -m lpjax.export): the trainer starts from the checkpoint's weights, and the export holds
what the run's forward pass used."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("safetensors")

from config_helpers import config_file, override  # noqa: E402
from lpjax import export as lpexport  # noqa: E402
from lpjax import quant  # noqa: E402
from lpjax.models import hf_llama, llama  # noqa: E402
from lpjax.train import ConfigError  # noqa: E402
from lpjax.train.loop._trainer import Trainer  # noqa: E402

V, D, F, H, KV, L = 257, 64, 96, 4, 2, 2


TOKENIZER = {"tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}',
             "tokenizer_config.json": b'{"tokenizer_class": "LlamaTokenizerFast"}',
             "generation_config.json": b'{"bos_token_id": 1, "eos_token_id": 2}'}


def _hf(path, tied=True, extra=None):
  rng = np.random.default_rng(0)
  w = lambda *s: (rng.standard_normal(s) * 0.05).astype(np.float32)
  t = {"model.embed_tokens.weight": w(V, D), "model.norm.weight": np.ones(D, np.float32)}
  for i in range(L):
    p = f"model.layers.{i}."
    t.update({p + "self_attn.q_proj.weight": w(D, D), p + "self_attn.o_proj.weight": w(D, D),
              p + "self_attn.k_proj.weight": w(KV * D // H, D),
              p + "self_attn.v_proj.weight": w(KV * D // H, D),
              p + "mlp.gate_proj.weight": w(F, D), p + "mlp.up_proj.weight": w(F, D),
              p + "mlp.down_proj.weight": w(D, F), p + "input_layernorm.weight": w(D) + 1,
              p + "post_attention_layernorm.weight": w(D) + 1})
  config = {"model_type": "llama", "vocab_size": V, "hidden_size": D, "intermediate_size": F,
            "num_attention_heads": H, "num_key_value_heads": KV, "num_hidden_layers": L,
            "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": tied,
            **(extra or {})}
  hf_llama.write_checkpoint(str(path), config, t)
  return t


def _decode_mxfp4(packed: dict, name: str) -> np.ndarray:
  """The float32 values of the packed MXFP4 weight `name` (OCP MX: two E2M1 codes a byte, low
  nibble first; E8M0 scales per 32), decoded here, not by lpjax."""
  blocks, scales = packed[name + ".weight_blocks"], packed[name + ".weight_scales"]
  codes = np.stack([blocks & 15, blocks >> 4], -1).reshape(blocks.shape[0], -1)
  e2m1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
  return e2m1[codes] * np.repeat(np.exp2(scales.astype(np.float32) - 127), 32, axis=1)


def _config(hf_path, steps, recipe="mxfp4_naive"):
  c = config_file("llama_tiny_mxfp4")
  return override(c, steps=steps, eval_every=0, checkpoint_every=0, eval_steps=1, log_every=1,
                  progress_bar=False, batch_size=8, seq_len=16,
                  **{"data.prefetch": 0, "optimizer.warmup_steps": 1, "quant.recipe": recipe,
                     "model.init_from": f"hf:{hf_path}"})


def test_init_from_starts_from_the_checkpoint(tmp_path):
  tensors = _hf(tmp_path / "hf")
  trainer = Trainer(_config(tmp_path / "hf", 1), str(tmp_path / "run"))
  cfg = trainer.task.model_config
  assert (cfg.hidden, cfg.intermediate, cfg.heads, cfg.layers, cfg.vocab_size) == (D, F, H, L, V)
  assert (cfg.kv_heads, cfg.tie_embeddings) == (KV, True)  # GQA and tied, as the checkpoint
  params = trainer.init_state().params
  np.testing.assert_array_equal(np.asarray(params["embed"]["embedding"][...]),
                                tensors["model.embed_tokens.weight"])
  assert "lm_head" not in params  # tied: the head is the embedding table
  np.testing.assert_array_equal(np.asarray(params["layers"]["attn"]["k_proj"]["kernel"][...][0]),
                                tensors["model.layers.0.self_attn.k_proj.weight"].T)
  np.testing.assert_array_equal(np.asarray(params["layers"]["mlp"]["down_proj"]["kernel"][...][1]),
                                tensors["model.layers.1.mlp.down_proj.weight"].T)


def test_a_bad_init_from_is_a_config_error(tmp_path):
  with pytest.raises(ConfigError, match="hf:PATH"):
    Trainer(override(_config(tmp_path, 1), **{"model.init_from": str(tmp_path)}),
            str(tmp_path / "a"))
  with pytest.raises(ConfigError, match="has no config.json"):
    Trainer(_config(tmp_path / "nowhere", 1), str(tmp_path / "b"))


def test_train_then_export_holds_what_the_forward_pass_used(tmp_path):
  source = _hf(tmp_path / "hf")
  # 1 step, as the module's other runs: their compiled train step comes from the compile cache
  trainer = Trainer(_config(tmp_path / "hf", 1), str(tmp_path / "run"))
  trainer.run()
  state = trainer.restore_or_init()[0]
  params, cfg = state.params, trainer.task.model_config
  assert lpexport.main([f"--workdir={tmp_path / 'run'}", f"--out={tmp_path / 'mx'}",
                        "--format=mxfp4"]) == 0
  assert lpexport.main([f"--workdir={tmp_path / 'run'}", f"--out={tmp_path / 'bf16'}",
                        "--format=bf16"]) == 0
  assert lpexport.main([f"--workdir={tmp_path / 'run'}", f"--out={tmp_path / 'nv'}",
                        "--format=nvfp4"]) == 1  # not what the run trained
  with open(tmp_path / "mx" / "config.json") as f:
    assert json.load(f)["quantization_config"]["quant_method"] == "mxfp4"
  packed = hf_llama.read_tensors(str(tmp_path / "mx"))
  op = quant.get_recipe("mxfp4_naive").fwd.rhs
  kernel = np.asarray(params["layers"]["attn"]["q_proj"]["kernel"][...][1])
  want = np.asarray(quant.fake_quant_operand(jnp.asarray(kernel.T), op, axis=-1))
  got = _decode_mxfp4(packed, "model.layers.1.self_attn.q_proj")
  assert np.array_equal(got, want)
  assert packed["model.embed_tokens.weight"].dtype.name == "bfloat16"
  # the export has the checkpoint's structure: GQA k / v of KV heads, tied (no lm_head)
  bf16 = hf_llama.read_tensors(str(tmp_path / "bf16"))
  assert {k: v.shape for k, v in bf16.items()} == {k: v.shape for k, v in source.items()}
  assert _exported_config(tmp_path / "bf16")["num_key_value_heads"] == KV
  # the bf16 export imports back as the trained weights rounded to bf16
  cfg2, back = hf_llama.load_pretrained(str(tmp_path / "bf16"), max_seq_len=cfg.max_seq_len)
  assert (cfg2.hidden, cfg2.layers, cfg2.vocab_size) == (cfg.hidden, cfg.layers, cfg.vocab_size)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(back)):
    assert np.array_equal(np.asarray(a).astype(jnp.bfloat16).astype(np.float32), np.asarray(b))
  assert os.path.getsize(tmp_path / "mx" / "model.safetensors") < os.path.getsize(
      tmp_path / "bf16" / "model.safetensors")


def test_a_run_in_the_default_mxfp4_recipe_exports_only_with_allow_requantize(tmp_path, capsys):
  """The `mxfp4` preset rotates W (RHT-32) before rounding it: the export says so and names the
  flag; with --allow_requantize it writes the OCP round-to-nearest of the trained weights and
  records that in config.json."""
  _hf(tmp_path / "hf")
  trainer = Trainer(_config(tmp_path / "hf", 1), str(tmp_path / "run"))
  trainer.run()
  params = trainer.restore_or_init()[0].params
  # the export reads the run's recipe from its config.json: make it an `mxfp4` run (compiling an
  # mxfp4 train step costs ~40 s on CPU; what the export does depends only on config and weights)
  with open(tmp_path / "run" / "config.json") as f:
    config = json.load(f)
  config["quant"]["recipe"] = "mxfp4"
  with open(tmp_path / "run" / "config.json", "w") as f:
    json.dump(config, f)
  run, out = f"--workdir={tmp_path / 'run'}", f"--out={tmp_path / 'mx'}"
  assert lpexport.main([run, out, "--format=mxfp4"]) == 1
  err = capsys.readouterr().err
  assert "random Hadamard transform" in err and "--allow_requantize" in err
  assert lpexport.main([run, out, "--format=mxfp4", "--allow_requantize"]) == 0
  assert "NOT the values the training forward multiplied" in capsys.readouterr().err
  with open(tmp_path / "mx" / "config.json") as f:
    record = json.load(f)["quantization_config"]["lpjax_requantized"]
  assert record["why"][0].startswith("mxfp4's forward GEMM rotates W")
  packed = hf_llama.read_tensors(str(tmp_path / "mx"))
  kernel = np.asarray(params["layers"]["mlp"]["up_proj"]["kernel"][...][0])
  want = np.asarray(quant.fake_quant(jnp.asarray(kernel.T), "mxfp4"))  # RTN, OCP scales
  got = _decode_mxfp4(packed, "model.layers.0.mlp.up_proj")
  assert np.array_equal(got, want)


def embed_converter(tensors, params):
  """model.init_converter of the factory test: the checkpoint's embedding into TinyLM's."""
  return {**params, "embed": {"embedding": jnp.asarray(tensors["model.embed_tokens.weight"])}}


def test_a_factory_model_takes_a_converter(tmp_path):
  tensors = _hf(tmp_path / "hf")
  c = override(_config(tmp_path / "hf", 1), **{"model.factory": "examples.own_model:tiny_lm"})
  with pytest.raises(ConfigError, match="model.init_converter"):
    Trainer(c, str(tmp_path / "a")).init_state()
  c = override(c, **{"model.init_converter": f"{__name__}:embed_converter"})
  params = Trainer(c, str(tmp_path / "b")).init_state().params
  np.testing.assert_array_equal(np.asarray(params["embed"]["embedding"]),
                                tensors["model.embed_tokens.weight"])


def _exported_config(path):
  with open(os.path.join(path, "config.json")) as f:
    return json.load(f)


def test_the_export_keeps_the_imported_config_and_tokenizer(tmp_path):
  """max_position_embeddings, bos / eos and unknown keys survive a run at seq_len 16; the
  checkpoint's tokenizer files are copied beside the weights. Before: max_position_embeddings
  became 16, bos / eos were dropped, no tokenizer file was written."""
  _hf(tmp_path / "hf", extra={"bos_token_id": 1, "eos_token_id": 2, "pretraining_tp": 1})
  for name, content in TOKENIZER.items():
    (tmp_path / "hf" / name).write_bytes(content)
  Trainer(_config(tmp_path / "hf", 1), str(tmp_path / "run")).run()
  run, out = f"--workdir={tmp_path / 'run'}", tmp_path / "bf16"
  assert lpexport.main([run, f"--out={out}", "--format=bf16"]) == 0
  config = _exported_config(out)
  assert config["max_position_embeddings"] == 64  # the checkpoint's, not the run's seq_len 16
  assert (config["bos_token_id"], config["eos_token_id"], config["pretraining_tp"]) == (1, 2, 1)
  assert config["torch_dtype"] == "bfloat16" and "quantization_config" not in config
  for name, content in TOKENIZER.items():
    assert (out / name).read_bytes() == content, name
  # the run's length replaces it only when the run sets model.max_seq_len
  with open(tmp_path / "run" / "config.json") as f:
    run_config = json.load(f)
  run_config["model"]["max_seq_len"] = 32
  with open(tmp_path / "run" / "config.json", "w") as f:
    json.dump(run_config, f)
  assert lpexport.main([run, f"--out={tmp_path / 'b2'}", "--format=bf16"]) == 0
  assert _exported_config(tmp_path / "b2")["max_position_embeddings"] == 32


def test_a_run_whose_init_from_folder_moved_exports_and_resumes_from_its_workdir(tmp_path, capsys):
  """The run keeps the checkpoint's config.json and tokenizer files in <workdir>/init_from: with
  the folder moved, the export and the trainer (what `python -m lpjax.advise --workdir` builds)
  read them there, and the weights from the run's checkpoint. Before: a ConfigError traceback."""
  _hf(tmp_path / "hf", extra={"bos_token_id": 1, "eos_token_id": 2})
  for name, content in TOKENIZER.items():
    (tmp_path / "hf" / name).write_bytes(content)
  config = _config(tmp_path / "hf", 1)
  Trainer(config, str(tmp_path / "run")).run()
  os.rename(tmp_path / "hf", tmp_path / "moved")
  run = f"--workdir={tmp_path / 'run'}"
  assert lpexport.main([run, f"--out={tmp_path / 'out'}", "--format=mxfp4"]) == 0
  exported = _exported_config(tmp_path / "out")
  assert (exported["max_position_embeddings"], exported["bos_token_id"]) == (64, 1)
  assert (tmp_path / "out" / "tokenizer.json").read_bytes() == TOKENIZER["tokenizer.json"]
  trainer = Trainer(config, str(tmp_path / "run"))
  state, _ = trainer.restore_or_init()
  assert int(state.step) == 1
  # a workdir with the copy but no checkpoint of its own cannot start: one config error
  os.makedirs(tmp_path / "run2")
  os.rename(tmp_path / "run" / "init_from", tmp_path / "run2" / "init_from")
  with pytest.raises(ConfigError, match="that folder is gone and this run has no checkpoint"):
    Trainer(config, str(tmp_path / "run2")).init_state()
  # a run without the copy (written before it was kept): one error line, no traceback
  assert lpexport.main([run, f"--out={tmp_path / 'out2'}", "--format=mxfp4"]) == 1
  err = capsys.readouterr().err
  assert "has no config.json" in err and len(err.strip().splitlines()) == 1


def test_a_fresh_models_export_names_its_byte_tokenizer_and_trained_length(tmp_path):
  from lpjax._export_metadata import export_metadata

  c = override(config_file("llama_tiny_mxfp4"), seq_len=16,
               **{"data.seq_len_schedule": "24:0.5"})
  base, max_positions, files = export_metadata(c, str(tmp_path))
  assert base == {"max_position_embeddings": 24, "bos_token_id": 256, "eos_token_id": 256}
  assert max_positions is None
  assert sorted(files) == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
  assert json.loads(files["tokenizer_config.json"])["model_max_length"] == 24
  c = override(c, **{"model.max_seq_len": 48})
  assert export_metadata(c, str(tmp_path))[1] == 48


def test_a_fresh_model_takes_grouped_kv_heads_and_tied_embeddings(tmp_path):
  from lpjax.train.tasks.lm import LanguageModelTask

  c = override(config_file("llama_tiny_mxfp4"), seq_len=16, batch_size=2,
               **{"data.prefetch": 0, "model.num_kv_heads": 2, "model.tie_embeddings": True})
  task = LanguageModelTask(c)
  cfg = task.model_config
  assert (cfg.heads, cfg.kv_heads, cfg.tie_embeddings) == (4, 2, True)
  params = task.init_variables(jax.random.key(0))[0]
  assert "lm_head" not in params
  assert params["layers"]["attn"]["v_proj"]["kernel"][...].shape == (cfg.layers, 128, 64)
  with pytest.raises(ConfigError, match="model.num_kv_heads 3 must divide the 4"):
    Trainer(override(c, **{"model.num_kv_heads": 3}), str(tmp_path / "bad"))
  with pytest.raises(ConfigError, match="mesh.tensor 2 must divide model.num_kv_heads 1"):
    Trainer(override(c, **{"model.num_kv_heads": 1, "mesh.tensor": 2}), str(tmp_path / "bad2"))
