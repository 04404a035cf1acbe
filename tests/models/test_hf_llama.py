"""Hugging Face LLaMA checkpoints in and out (lpjax.models.hf_llama), against references written
here: a numpy LLaMA forward pass read straight from the Hugging Face tensors (float64), and numpy
decoders of the OCP MX (E2M1 codes, E8M0 scales) and NVFP4 (E2M1, E4M3 scales, FP32 tensor scale)
layouts from the format definitions, not lpjax's decoder."""

import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

safetensors_numpy = pytest.importorskip("safetensors.numpy")

from lpjax import quant  # noqa: E402
from lpjax.models import hf_llama, llama  # noqa: E402

HIDDEN, FFN, HEADS, LAYERS, VOCAB = 64, 96, 4, 2, 67


# --- an independent reference ----------------------------------------------------------------


def _hf_tensors(kv_heads: int, tied: bool, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  hd = HIDDEN // HEADS
  w = lambda *shape: (rng.standard_normal(shape) * 0.15).astype(np.float32)
  t = {"model.embed_tokens.weight": w(VOCAB, HIDDEN),
       "model.norm.weight": (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)}
  if not tied:
    t["lm_head.weight"] = w(VOCAB, HIDDEN)
  for i in range(LAYERS):
    p = f"model.layers.{i}."
    t.update({p + "self_attn.q_proj.weight": w(HIDDEN, HIDDEN),
              p + "self_attn.k_proj.weight": w(kv_heads * hd, HIDDEN),
              p + "self_attn.v_proj.weight": w(kv_heads * hd, HIDDEN),
              p + "self_attn.o_proj.weight": w(HIDDEN, HIDDEN),
              p + "mlp.gate_proj.weight": w(FFN, HIDDEN), p + "mlp.up_proj.weight": w(FFN, HIDDEN),
              p + "mlp.down_proj.weight": w(HIDDEN, FFN),
              p + "input_layernorm.weight": 1 + w(HIDDEN),
              p + "post_attention_layernorm.weight": 1 + w(HIDDEN)})
  return t


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}  # 64: head_dim 16's wavelengths (6.3, 32.5,
# 168, ...) fall in all three bands: kept (< 64 / 4), smoothed, slowed (> 64 / 1)


def _hf_config(kv_heads: int, tied: bool, rope_scaling=None) -> dict:
  return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
          "hidden_size": HIDDEN, "intermediate_size": FFN, "num_attention_heads": HEADS,
          "num_key_value_heads": kv_heads, "num_hidden_layers": LAYERS,
          "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
          "hidden_act": "silu", "tie_word_embeddings": tied, "torch_dtype": "float32",
          "rope_scaling": rope_scaling}


def _write_hf(path, tensors: dict, config: dict, shards: int = 1):
  """A checkpoint directory as the Hugging Face hub has them, written with safetensors itself."""
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  names = sorted(tensors)
  if shards == 1:
    safetensors_numpy.save_file(tensors, os.path.join(path, "model.safetensors"))
    return
  parts = [names[i::shards] for i in range(shards)]
  files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
  for file, part in zip(files, parts):
    safetensors_numpy.save_file({k: tensors[k] for k in part}, os.path.join(path, file))
  with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {}, "weight_map": {k: file for file, part in zip(files, parts)
                                              for k in part}}, f)


def _reference_logits(t: dict, config: dict, tokens: np.ndarray) -> np.ndarray:
  """LlamaForCausalLM's forward pass in float64 numpy: RMSNorm, half-split RoPE (rotate_half),
  grouped-query attention (query head h reads k / v head h // (heads / kv_heads)), SwiGLU."""
  g = lambda name: np.asarray(t[name], np.float64)
  heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
  d = config["hidden_size"]
  hd, eps, n = d // heads, config["rms_norm_eps"], tokens.shape[-1]

  def norm(x, w):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w

  inv = 1.0 / config["rope_theta"] ** (np.arange(0, hd, 2) / hd)
  scaling = config.get("rope_scaling")
  if scaling:  # Llama 3.1's frequency bands, from Meta's reference apply_scaling
    factor, old = scaling["factor"], scaling["original_max_position_embeddings"]
    low_wavelen = old / scaling["low_freq_factor"]
    high_wavelen = old / scaling["high_freq_factor"]
    out = []
    for f in inv:
      wavelen = 2 * np.pi / f
      if wavelen < high_wavelen:
        out.append(f)
      elif wavelen > low_wavelen:
        out.append(f / factor)
      else:
        smooth = (old / wavelen - scaling["low_freq_factor"]) / (
            scaling["high_freq_factor"] - scaling["low_freq_factor"])
        out.append((1 - smooth) * f / factor + smooth * f)
    inv = np.array(out)
  ang = np.arange(n)[:, None] * inv[None]
  cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

  def rope(x):  # (b, heads, n, hd)
    rotated = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
    return x * cos + rotated * sin

  x = g("model.embed_tokens.weight")[tokens]
  b = x.shape[0]
  for i in range(config["num_hidden_layers"]):
    p = f"model.layers.{i}."
    h = norm(x, g(p + "input_layernorm.weight"))
    q = (h @ g(p + "self_attn.q_proj.weight").T).reshape(b, n, heads, hd).transpose(0, 2, 1, 3)
    k = (h @ g(p + "self_attn.k_proj.weight").T).reshape(b, n, kv, hd).transpose(0, 2, 1, 3)
    v = (h @ g(p + "self_attn.v_proj.weight").T).reshape(b, n, kv, hd).transpose(0, 2, 1, 3)
    q, k = rope(q), rope(k)
    group = np.arange(heads) // (heads // kv)
    s = q @ k[:, group].transpose(0, 1, 3, 2) / np.sqrt(hd)
    s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    o = (a @ v[:, group]).transpose(0, 2, 1, 3).reshape(b, n, d)
    x = x + o @ g(p + "self_attn.o_proj.weight").T
    h = norm(x, g(p + "post_attention_layernorm.weight"))
    gate, up = h @ g(p + "mlp.gate_proj.weight").T, h @ g(p + "mlp.up_proj.weight").T
    x = x + (gate / (1 + np.exp(-gate)) * up) @ g(p + "mlp.down_proj.weight").T
  head = "model.embed_tokens.weight" if config["tie_word_embeddings"] else "lm_head.weight"
  return norm(x, g("model.norm.weight")) @ g(head).T


FP32 = quant.QuantPolicy(recipe="fp32", high_precision="fp32")  # every GEMM in float32


def _lpjax_logits(cfg, params, tokens, policy=FP32):
  graphdef, _ = llama.abstract_model(cfg, policy)
  return np.asarray(llama.apply(graphdef, cfg, params, jnp.asarray(tokens), policy,
                                jax.random.key(0)))


TOKENS = np.random.default_rng(1).integers(0, VOCAB, (2, 12))


# --- import -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kv_heads,tied,shards,scan,scaling", [
    (4, False, 1, True, None), (2, True, 3, False, None), (1, False, 2, True, None),
    (2, True, 1, True, LLAMA3)])  # Llama-3 style: GQA, tied, rope_scaling llama3, theta 500000
def test_import_matches_a_numpy_llama_to_1e_5(tmp_path, kv_heads, tied, shards, scan, scaling):
  tensors, config = _hf_tensors(kv_heads, tied), _hf_config(kv_heads, tied, scaling)
  _write_hf(tmp_path, tensors, config, shards)
  cfg, params = hf_llama.load_pretrained(str(tmp_path), scan_layers=scan)
  assert (cfg.hidden, cfg.heads, cfg.layers, cfg.vocab_size, cfg.norm_eps) == (
      HIDDEN, HEADS, LAYERS, VOCAB, 1e-5)
  assert (cfg.kv_heads, cfg.tie_embeddings) == (kv_heads, tied)  # its own structure
  flat = hf_llama._flat_params(params)
  assert flat["layers/0/attn/k_proj/kernel"].shape == (HIDDEN, kv_heads * HIDDEN // HEADS)
  assert ("lm_head/kernel" in flat) == (not tied)
  got = _lpjax_logits(cfg, params, TOKENS)
  want = _reference_logits(tensors, config, TOKENS)
  assert np.abs(want).max() > 1.0  # logits of a size where an error shows
  assert np.abs(got - want).max() < 1e-5


def test_missing_extra_and_misshapen_tensors_are_named_in_one_message(tmp_path):
  tensors = _hf_tensors(4, False)
  del tensors["model.layers.1.mlp.up_proj.weight"]
  tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(HIDDEN, np.float32)
  tensors["model.norm.weight"] = np.ones(HIDDEN + 1, np.float32)
  _write_hf(tmp_path, tensors, _hf_config(4, False))
  with pytest.raises(hf_llama.CheckpointError) as error:
    hf_llama.load_pretrained(str(tmp_path))
  message = str(error.value)
  assert "missing (1): model.layers.1.mlp.up_proj.weight" in message
  assert "extra (1): model.layers.0.self_attn.q_proj.bias" in message
  assert "misshapen (1): model.norm.weight (65,) (expected (64,))" in message


@pytest.mark.parametrize("scaling", [{"rope_type": "yarn", "factor": 4.0},
                                     {"rope_type": "llama3", "factor": 8.0}])
def test_a_config_lpjax_cannot_run_is_refused(tmp_path, scaling):
  config = {**_hf_config(4, False), "rope_scaling": scaling}
  _write_hf(tmp_path, _hf_tensors(4, False), config)
  with pytest.raises(hf_llama.CheckpointError, match="rope_scaling"):
    hf_llama.load_pretrained(str(tmp_path))


# --- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("kv_heads,tied,scaling", [(4, False, None), (2, True, LLAMA3)])
def test_hf_to_lpjax_to_hf_is_exact(tmp_path, kv_heads, tied, scaling):
  """Every tensor back bit for bit, under its own name and shape: a GQA model's k / v stay
  kv_heads wide, a tied one gets no lm_head; config.json keeps its structure."""
  tensors, config = _hf_tensors(kv_heads, tied), _hf_config(kv_heads, tied, scaling)
  _write_hf(tmp_path / "in", tensors, config)
  cfg, params = hf_llama.load_pretrained(str(tmp_path / "in"))
  hf_llama.save_pretrained(str(tmp_path / "out"), cfg, params, dtype="float32",
                           max_shard_bytes=60_000, base_config=config)
  assert os.path.exists(tmp_path / "out" / "model.safetensors.index.json")  # sharded
  back = hf_llama.read_tensors(str(tmp_path / "out"))
  assert sorted(back) == sorted(tensors)
  for name, t in tensors.items():
    assert back[name].dtype == np.float32 and np.array_equal(back[name], t), name
  with open(tmp_path / "out" / "config.json") as f:
    out = json.load(f)
  for key in ("num_key_value_heads", "tie_word_embeddings", "rope_scaling", "rope_theta",
              "max_position_embeddings"):
    assert out[key] == config[key], key


@pytest.mark.parametrize("scan", [True, False])
def test_lpjax_to_bf16_to_lpjax_is_exact(tmp_path, scan):
  cfg = llama.LlamaConfig(vocab_size=VOCAB, hidden=HIDDEN, intermediate=FFN, heads=HEADS,
                          layers=LAYERS, max_seq_len=32, scan_layers=scan)
  params = llama.init_params(cfg, jax.random.key(3))
  hf_llama.save_pretrained(str(tmp_path), cfg, params)  # bf16
  cfg2, params2 = hf_llama.load_pretrained(str(tmp_path), scan_layers=scan, max_seq_len=32)
  assert cfg2 == cfg
  want = jax.tree.map(lambda a: np.asarray(a).astype(ml_dtypes.bfloat16).astype(np.float32),
                      params)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(params2)):
    assert np.array_equal(a, np.asarray(b))


def test_bf16_export_logits_equal_the_trained_models_within_bf16_rounding(tmp_path):
  cfg = llama.LlamaConfig(vocab_size=VOCAB, hidden=HIDDEN, intermediate=FFN, heads=HEADS,
                          layers=LAYERS, max_seq_len=32)
  params = llama.init_params(cfg, jax.random.key(4))
  params = jax.tree.map(lambda a: a * 5.0, params)  # weights of a trained size
  hf_llama.save_pretrained(str(tmp_path), cfg, params)
  with open(tmp_path / "config.json") as f:
    config = json.load(f)
  exported = _reference_logits(hf_llama.read_tensors(str(tmp_path)), config, TOKENS)
  trained = _lpjax_logits(cfg, params, TOKENS)
  rounded = _lpjax_logits(cfg, jax.tree.map(
      lambda a: jnp.asarray(a).astype(jnp.bfloat16).astype(jnp.float32), params), TOKENS)
  scale = np.abs(trained).max()
  assert np.abs(exported - rounded).max() < 1e-5 * scale  # the file holds exactly the bf16 weights
  # and these differ from the float32 weights by their bf16 rounding (2**-9 relative), which two
  # blocks of these large weights amplify to ~2% of the largest logit
  assert 0 < np.abs(exported - trained).max() < 0.05 * scale
