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


# --- packed FP4 -------------------------------------------------------------------------------


def _e2m1(codes: np.ndarray) -> np.ndarray:
  """OCP E2M1: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0; exponent 0 subnormal."""
  sign = np.where(codes & 8, -1.0, 1.0)
  e, m = (codes >> 1) & 3, codes & 1
  return sign * np.where(e == 0, m * 0.5, 2.0 ** (e.astype(np.float64) - 1) * (1 + m / 2))


def _unpack(packed: np.ndarray) -> np.ndarray:
  """Two codes a byte, element 2i in the low nibble."""
  return np.stack([packed & 0xF, packed >> 4], -1).reshape(*packed.shape[:-1], -1)


def _e4m3(byte: np.ndarray) -> np.ndarray:
  """OCP E4M3 (fn): exponent bits 6-3 (bias 7), mantissa bits 2-0; exponent 0 subnormal."""
  e, m = (byte >> 3) & 0xF, byte & 7
  return np.where(e == 0, m / 8 * 2.0**-6, 2.0 ** (e.astype(np.float64) - 7) * (1 + m / 8))


def _decode_mxfp4(t: dict, name: str) -> np.ndarray:
  blocks, scales = t[name + ".weight_blocks"], t[name + ".weight_scales"]
  assert blocks.dtype == np.uint8 and scales.dtype == np.uint8
  values = _e2m1(_unpack(blocks)).reshape(*scales.shape, 32)  # (out, in / 32, 32)
  scale = 2.0 ** (scales.astype(np.float64) - 127)  # E8M0
  return (values * scale[..., None]).reshape(scales.shape[0], -1).astype(np.float32)


def _decode_nvfp4(t: dict, name: str, amax: np.float32 | None = None):
  codes, scales = t[name + ".weight"], t[name + ".weight_scale"].view(np.uint8)
  ws2 = t[name + ".weight_scale_2"]
  assert codes.dtype == np.uint8 and ws2.dtype == np.float32 and ws2.shape == ()
  unit = (_e2m1(_unpack(codes)).reshape(*scales.shape, 16)
          * _e4m3(scales)[..., None]).astype(np.float32)  # exact: 2 x 4 significant bits
  if amax is None:  # the public two-level decode: codes * (block scale * weight_scale_2)
    return (unit * ws2).reshape(scales.shape[0], -1)
  # docs/numerics.md section 5: ((s_b * amax_t) * fl32(1/2688)) per block
  mult = ((_e4m3(scales).astype(np.float32) * amax) * np.float32(1 / 2688)).astype(np.float32)
  values = _e2m1(_unpack(codes)).reshape(*scales.shape, 16).astype(np.float32) * mult[..., None]
  return values.reshape(scales.shape[0], -1)


LINEAR = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def _trained(compute_dtype="float32"):
  cfg = llama.LlamaConfig(vocab_size=VOCAB, hidden=HIDDEN, intermediate=FFN, heads=HEADS,
                          layers=LAYERS, max_seq_len=32, compute_dtype=compute_dtype)
  params = llama.init_params(cfg, jax.random.key(5))
  return cfg, jax.tree.map(lambda a: a * jnp.linspace(0.5, 40.0, a.shape[-1]), params)


def _weight_t(cfg, params, i: int, module: str):
  """W^T (out, in) of block i's `module` in the compute dtype, as the forward GEMM gets it."""
  lp = {v: k for k, v in hf_llama._BLOCK.items()}[module]
  group, name = lp.split("/")
  return jnp.asarray(params["layers"][group][name]["kernel"][...][i]).astype(cfg.compute_dtype).T


@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_mxfp4_export_decodes_to_the_runs_fake_quant_bit_for_bit(compute_dtype):
  cfg, params = _trained(compute_dtype)
  policy = quant.QuantPolicy.from_settings("mxfp4_naive")
  config, t = hf_llama.export_tensors(cfg, params, layout="mxfp4", policy=policy)
  qc = config["quantization_config"]
  assert qc["quant_method"] == "mxfp4" and qc["modules_to_not_convert"] == ["lm_head"]
  assert t["model.embed_tokens.weight"].dtype == ml_dtypes.bfloat16
  op = quant.get_recipe("mxfp4_naive").fwd.rhs
  for i in range(LAYERS):
    for module in LINEAR:
      w_t = _weight_t(cfg, params, i, module)
      want = np.asarray(quant.fake_quant_operand(w_t, op, axis=-1), np.float32)
      got = _decode_mxfp4(t, f"model.layers.{i}.{module}")
      assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (i, module)


def test_nvfp4_export_codes_scales_and_tensor_scale_are_the_runs_bit_for_bit():
  cfg, params = _trained()
  policy = quant.QuantPolicy.from_settings("nvfp4")
  config, t = hf_llama.export_tensors(cfg, params, layout="nvfp4", policy=policy)
  qc = config["quantization_config"]
  # ModelOpt's weight-only variant: no input_scale is expected (vLLM's ModelOptNvFp4Config)
  assert (qc["quant_method"], qc["quant_algo"], qc["group_size"]) == (
      "modelopt", "W4A16_NVFP4", 16)
  assert qc["ignore"] == ["lm_head"] and not any(k.endswith("input_scale") for k in t)
  op = quant.get_recipe("nvfp4").fwd.rhs
  assert op.format.tile  # 16x16 weight tiles
  ulps = []
  for i in range(LAYERS):
    for module in LINEAR:
      name = f"model.layers.{i}.{module}"
      w_t = np.asarray(_weight_t(cfg, params, i, module))
      want = np.asarray(quant.fake_quant_operand(jnp.asarray(w_t), op, axis=-1), np.float32)
      amax = np.float32(np.abs(w_t).max())
      assert t[name + ".weight_scale_2"] == np.float32(amax / np.float32(2688))
      # each 16x16 tile has one scale: the 16 rows of a tile carry the same bytes
      s = t[name + ".weight_scale"].view(np.uint8)
      assert np.array_equal(s, np.repeat(s[::16], 16, axis=0))
      got = _decode_nvfp4(t, name, amax)
      assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), name
      public = _decode_nvfp4(t, name)
      ulps.append(np.abs(public.view(np.int32) - want.view(np.int32)).max())
  # the public two-level decode rounds s_b * (amax_t / 2688) where lpjax rounds
  # (s_b * amax_t) * (1 / 2688): two roundings in another order, at most two float32 ulps apart
  assert max(ulps) <= 2


def test_export_refuses_a_format_other_than_the_runs_and_a_rotated_forward():
  cfg, params = _trained()
  with pytest.raises(ValueError, match="What you train is what you serve"):
    hf_llama.export_tensors(cfg, params, layout="nvfp4",
                            policy=quant.QuantPolicy.from_settings("mxfp4_naive"))
  with pytest.raises(ValueError, match="Hadamard.*--allow_requantize"):
    hf_llama.export_tensors(cfg, params, layout="mxfp4",
                            policy=quant.QuantPolicy.from_settings("mxfp4"))


def _ocp_mxfp4_rtn(w_t: np.ndarray) -> np.ndarray:
  """numpy OCP MX v1.0 MXFP4 round-to-nearest-even of W^T (out, in) along `in`: per 32-block,
  scale 2^(floor(log2 amax) - 2) (E8M0), elements rounded to E2M1 (ties to even), saturating."""
  out, n = w_t.shape
  blocks = w_t.astype(np.float64).reshape(out, n // 32, 32)
  amax = np.abs(blocks).max(-1, keepdims=True)
  scale = np.exp2(np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 2)
  grid = np.array([0, .5, 1, 1.5, 2, 3, 4, 6])
  a = np.minimum(np.abs(blocks) / scale, 6.0)
  # nearest grid point; a tie goes to the even code (mantissa bit 0 = index even): a float32 / 2^k
  # that is no tie is at least 2^-21 from one, far more than the 1e-9 tie-breaker
  i = (np.abs(a[..., None] - grid) + 1e-9 * (np.arange(8) % 2)).argmin(-1)
  return (np.sign(blocks) * grid[i] * scale).reshape(out, n).astype(np.float32)


@pytest.mark.parametrize("recipe", ["mxfp4", "quartet"])
def test_allow_requantize_exports_ocp_rtn_of_the_trained_weights_and_records_it(recipe):
  """The `mxfp4` preset (RHT-32 in the forward) and quartet (QuEST after H-32): their forward
  weights live in a rotated basis; with requantize the export is the OCP round-to-nearest of W,
  decoded by the independent numpy decoder, and config.json says the values are not the
  forward's."""
  cfg, params = _trained()
  policy = quant.QuantPolicy.from_settings(recipe, high_precision="bf16")
  with pytest.warns(UserWarning, match="requantized"):
    config, t = hf_llama.export_tensors(cfg, params, layout="mxfp4", policy=policy,
                                        requantize=True)
  qc = config["quantization_config"]
  assert qc["quant_method"] == "mxfp4" and qc["modules_to_not_convert"] == ["lm_head"]
  record = qc["lpjax_requantized"]
  assert "NOT the values" in record["values"] and record["why"][0].startswith(recipe)
  for i in range(LAYERS):
    for module in LINEAR:
      w_t = np.asarray(_weight_t(cfg, params, i, module))
      got = _decode_mxfp4(t, f"model.layers.{i}.{module}")
      assert np.array_equal(got, _ocp_mxfp4_rtn(w_t)), (i, module)
  # without requantize the export refuses; an exact recipe records nothing
  assert "lpjax_requantized" not in hf_llama.export_tensors(
      cfg, params, layout="mxfp4", policy=quant.QuantPolicy.from_settings("mxfp4_naive"),
      requantize=True)[0]["quantization_config"]


@pytest.mark.parametrize("layout,recipe,low,high", [("mxfp4", "mxfp4_naive", 0.26, 0.275),
                                                    ("nvfp4", "nvfp4", 0.275, 0.29)])
def test_packed_linear_weights_are_about_a_quarter_of_bf16(layout, recipe, low, high):
  cfg, params = _trained()
  _, bf16 = hf_llama.export_tensors(cfg, params, layout="bf16")
  _, packed = hf_llama.export_tensors(cfg, params, layout=layout,
                                      policy=quant.QuantPolicy.from_settings(recipe))
  linear = lambda t: sum(a.nbytes for k, a in t.items() if any(m in k for m in LINEAR))
  ratio = linear(packed) / linear(bf16)
  assert low < ratio < high, ratio
