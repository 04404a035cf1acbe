"""Real clients read lpjax's exports: transformers (PyTorch, CPU) loads the bf16 export, and with
the compressed-tensors package the nvfp4-ct / mxfp4-ct exports (decompressed at load), and its
logits match lpjax's for the same (dequantized) weights. Needs the interop extra
(requirements-interop.txt, `make test-interop`); skipped without it.

Measured (tiny LLaMA 64 wide, 2 blocks, weights x5; max |logit| ~13-15), the client's logits
against lpjax's for the weights the client decoded:
| format | client | max |logits diff| | file size vs bf16 |
| bf16 | transformers 4.57.6 | 2.2e-5 | 1 (159 kB) |
| mxfp4-ct | transformers + compressed-tensors 0.20.1 | 2.7e-5 (weights decoded bit-exact) | 0.37 |
| nvfp4-ct | transformers + compressed-tensors 0.20.1 | 2.1e-5 (weights = bf16(lpjax's decode)) | 0.39 |
compressed-tensors decodes NVFP4 into bf16 whatever the dtype asked for: against lpjax's float32
decode the logits differ by 0.50, exactly what bf16 weights change in lpjax's own forward (this
model, weights x5, amplifies; 5.4e-4 at weights x1, max |logit| 0.56).
(the embedding and LM head stay bf16 and dominate these tiny files; the linear weights alone are
~0.27 of bf16: tests/models/test_hf_fp4_export.py)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import os  # noqa: E402

from lpjax import quant  # noqa: E402
from lpjax.models import hf_llama, llama  # noqa: E402

FP32 = quant.QuantPolicy(recipe="fp32", high_precision="fp32")
TOKENS = np.random.default_rng(1).integers(0, 67, (2, 12))


def _lpjax_logits(cfg, params, tokens):
  graphdef, _ = llama.abstract_model(cfg, FP32)
  return np.asarray(llama.apply(graphdef, cfg, params, jnp.asarray(tokens), FP32,
                                jax.random.key(0)))


def _transformers_model(path, compressed=False):
  kwargs = {}
  if compressed:  # compressed-tensors decompresses the packed weights at load (in bf16)
    pytest.importorskip("compressed_tensors")
    kwargs["quantization_config"] = transformers.CompressedTensorsConfig(run_compressed=False)
  model = transformers.AutoModelForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32,
                                                            **kwargs)
  for p in model.parameters():  # the decoded weights, computed with in float32 as lpjax's
    p.data = p.data.float()
  return model.eval()


def _transformers_logits(path, tokens, compressed=False):
  model = _transformers_model(path, compressed)
  with torch.no_grad():
    return model(torch.as_tensor(tokens)).logits.numpy()


def test_transformers_loads_the_bf16_export_and_its_logits_match_lpjax(tmp_path):
  cfg = llama.LlamaConfig(vocab_size=67, hidden=64, intermediate=96, heads=4, layers=2,
                          max_seq_len=16)
  params = jax.tree.map(lambda a: a * 5.0, llama.init_params(cfg, jax.random.key(0)))
  hf_llama.save_pretrained(str(tmp_path), cfg, params)  # bf16
  rounded = jax.tree.map(
      lambda a: jnp.asarray(np.asarray(a).astype(ml_dtypes.bfloat16).astype(np.float32)), params)
  want = _lpjax_logits(cfg, rounded, TOKENS)
  got = _transformers_logits(tmp_path, TOKENS)
  assert np.abs(want).max() > 1.0
  assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()


def _bf16(a):
  return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def _dequantized(cfg, params, packed):
  """params with each linear kernel replaced by its packed weight's lpjax decode (W^T back to
  (in, out)) and the rest rounded to bf16, as the export holds them."""
  from lpjax.models.hf_llama import _lpjax_path

  def one(path, leaf):
    name = _lpjax_path(path)
    if name.startswith("layers/") and name.endswith("kernel"):
      rest = name.split("/", 1)[1]
      return jnp.stack([packed[f"layers/{i}/{rest}"].dequantize().T for i in range(cfg.layers)])
    return jnp.asarray(np.asarray(leaf).astype(ml_dtypes.bfloat16).astype(np.float32))

  return jax.tree_util.tree_map_with_path(one, params)


@pytest.mark.parametrize("fmt,recipe", [("mxfp4-ct", "mxfp4_naive"), ("nvfp4-ct", "nvfp4")])
def test_transformers_loads_the_compressed_tensors_fp4_export(tmp_path, fmt, recipe):
  cfg = llama.LlamaConfig(vocab_size=67, hidden=64, intermediate=96, heads=4, layers=2,
                          max_seq_len=16)
  params = jax.tree.map(lambda a: a * 5.0, llama.init_params(cfg, jax.random.key(0)))
  policy = quant.QuantPolicy.from_settings(recipe)
  hf_llama.save_pretrained(str(tmp_path / "fp4"), cfg, params, dtype=fmt, policy=policy)
  hf_llama.save_pretrained(str(tmp_path / "bf16"), cfg, params)
  packed = quant.export_weights(params, policy.for_model(num_blocks=cfg.layers))
  model = _transformers_model(tmp_path / "fp4", compressed=True)
  # The client's decoded weights are lpjax's decode rounded to bf16, bit for bit, for every linear
  # weight: compressed-tensors decompresses into bfloat16 whatever torch_dtype asks (nvfp4/
  # helpers.py unpack_fp4_from_uint8(dtype=torch.bfloat16), cast back to it after e2m1 *
  # (scale / global_scale) in float32). Exact for MXFP4 (E2M1 x 2^k is a bf16); for NVFP4 the
  # rounding is the client's, not the export's (global_scale = 2688 / amax_t in float32, as
  # compressed-tensors' own generate_gparam writes it).
  state = {k: v.numpy() for k, v in model.state_dict().items()}
  for name, w in packed.items():
    _, i, module, proj, _ = name.split("/")
    got_w = state[f"model.layers.{i}.{hf_llama._BLOCK[module + '/' + proj]}.weight"]
    assert np.array_equal(got_w, _bf16(w.dequantize())), name
  with torch.no_grad():
    got = model(torch.as_tensor(TOKENS)).logits.numpy()
  # lpjax's logits for the client's own weights: equal at float32 GEMM tolerance (measured
  # 2.1e-5 for NVFP4 and 2.7e-5 for MXFP4, max |logit| ~15)
  deq = _dequantized(cfg, params, packed)
  held = jax.tree.map(lambda a: jnp.asarray(_bf16(a)), deq)
  want = _lpjax_logits(cfg, held, TOKENS)
  scale = np.abs(want).max()
  assert np.abs(got - want).max() < 1e-5 * scale
  if fmt == "nvfp4-ct":  # the bf16 rounding alone moves this (weights x5) model's logits by 0.50
    exact = _lpjax_logits(cfg, deq, TOKENS)
    assert np.abs(exact - want).max() > 100 * np.abs(got - want).max()
  size = lambda d: os.path.getsize(tmp_path / d / "model.safetensors")
  assert size("fp4") < 0.7 * size("bf16")


def test_a_llama3_style_checkpoint_imports_with_transformers_logits_to_1e_5(tmp_path):
  """GQA (2 k / v heads for 4), tied embeddings, rope_scaling llama3, rope_theta 500000: lpjax's
  import computes what transformers' LlamaForCausalLM computes from the same files."""
  rng = np.random.default_rng(0)
  d, f, heads, kv, layers, vocab = 64, 96, 4, 2, 2, 67
  hd = d // heads
  w = lambda *shape: (rng.standard_normal(shape) * 0.15).astype(np.float32)
  t = {"model.embed_tokens.weight": w(vocab, d), "model.norm.weight": 1 + w(d)}
  for i in range(layers):
    p = f"model.layers.{i}."
    t.update({p + "self_attn.q_proj.weight": w(d, d), p + "self_attn.k_proj.weight": w(kv * hd, d),
              p + "self_attn.v_proj.weight": w(kv * hd, d), p + "self_attn.o_proj.weight": w(d, d),
              p + "mlp.gate_proj.weight": w(f, d), p + "mlp.up_proj.weight": w(f, d),
              p + "mlp.down_proj.weight": w(d, f), p + "input_layernorm.weight": 1 + w(d),
              p + "post_attention_layernorm.weight": 1 + w(d)})
  config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
            "hidden_size": d, "intermediate_size": f, "num_attention_heads": heads,
            "num_key_value_heads": kv, "num_hidden_layers": layers,
            "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
            "hidden_act": "silu", "tie_word_embeddings": True, "torch_dtype": "float32"}
  hf_llama.write_checkpoint(str(tmp_path), config, t)
  cfg, params = hf_llama.load_pretrained(str(tmp_path), max_seq_len=16)
  assert (cfg.kv_heads, cfg.tie_embeddings, dict(cfg.rope_scaling)["rope_type"]) == (
      kv, True, "llama3")
  want = _transformers_logits(tmp_path, TOKENS)
  got = _lpjax_logits(cfg, params, TOKENS)
  assert np.abs(want).max() > 1.0
  assert np.abs(got - want).max() < 1e-5  # measured 3.0e-6 (max |logit| 4.1)
