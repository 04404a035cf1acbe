"""Hugging Face LLaMA checkpoints <-> lpjax's LLaMA: config.json + safetensors in, and out.

The Hugging Face layout (`LlamaForCausalLM`): tensors `model.embed_tokens.weight`,
`model.layers.{i}.self_attn.{q,k,v,o}_proj.weight`,
`model.layers.{i}.mlp.{gate,up,down}_proj.weight`,
`model.layers.{i}.input_layernorm.weight`, `model.layers.{i}.post_attention_layernorm.weight`,
`model.norm.weight` and `lm_head.weight` (absent when `tie_word_embeddings`), linear weights in
PyTorch's (out, in) orientation; lpjax's kernels are (in, out). Both apply RoPE in the half-split
convention (`rotate_half`, lpjax.models.llama.rope), so q and k need no permutation. Grouped-query
attention (num_key_value_heads < num_attention_heads), tied embeddings and Llama 3's rope_scaling
are lpjax's LLaMA's own (LlamaConfig.num_kv_heads, tie_embeddings, rope_scaling): a checkpoint is
imported and exported with its structure, k / v weights as they are, no lm_head when tied.

Exports (`export_tensors`) write bf16 (or float32) weights, or the linear weights packed in the
public FP4 layouts with a `quantization_config` (`QUANT_LAYOUTS`: gpt-oss's MXFP4 `*_blocks` /
`*_scales`, NVIDIA ModelOpt's NVFP4).

This module maps configs, tensor names and shapes between the two models. The FP4 layouts' tensors
are described and packed in lpjax/models/_hf_fp4_layouts.py; checkpoint directories are read and
written (the `safetensors` package, `pip install safetensors`) in
lpjax/models/_hf_checkpoint_files.py.

Examples:
  >>> import jax, tempfile
  >>> cfg = LlamaConfig(vocab_size=40, hidden=32, intermediate=64, heads=2, layers=1, max_seq_len=8)
  >>> params = init_params(cfg, jax.random.key(0))
  >>> d = tempfile.mkdtemp()
  >>> save_pretrained(d, cfg, params, dtype="float32")
  >>> cfg2, params2 = load_pretrained(d, max_seq_len=8)
  >>> same = params2["lm_head"]["kernel"][...] == params["lm_head"]["kernel"][...]
  >>> cfg2.hidden, bool(same.all())
  (32, True)
"""

from __future__ import annotations

import json
import os

import jax
import ml_dtypes
import numpy as np

from lpjax import quant
from lpjax.models._hf_checkpoint_files import (  # noqa: F401 (re-exported)
    CONFIG, INDEX, SINGLE, CheckpointError, read_tensors, write_checkpoint, write_directory)
from lpjax.models._hf_config import (  # noqa: F401 (re-exported)
    HFLayout, hf_config, layout_of, llama_config_from_hf)
from lpjax.models._hf_fp4_layouts import (FORMATS, QUANT_LAYOUTS, hf_quant_config,
                                           quantization_config)
from lpjax.models.llama import LlamaConfig, abstract_model, init_params  # noqa: F401 (examples)
from lpjax.quant import QuantPolicy, path_str

# lpjax module path (after the block) -> Hugging Face module name (after "model.layers.{i}.")
_BLOCK = {
    "attn/q_proj": "self_attn.q_proj", "attn/k_proj": "self_attn.k_proj",
    "attn/v_proj": "self_attn.v_proj", "attn/o_proj": "self_attn.o_proj",
    "mlp/gate_proj": "mlp.gate_proj", "mlp/up_proj": "mlp.up_proj",
    "mlp/down_proj": "mlp.down_proj",
    "attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
}


# --- lpjax params <-> Hugging Face tensors ----------------------------------------------------


def _lpjax_path(path) -> str:
  return path_str(tuple(k for k in path if getattr(k, "name", None) != "value"))


def _hf_name(path: str, block: int | None) -> str:
  """The Hugging Face name of lpjax parameter `path` ("layers/attn/q_proj/kernel") in `block`."""
  if path == "embed/embedding":
    return "model.embed_tokens.weight"
  if path == "norm/scale":
    return "model.norm.weight"
  if path == "lm_head/kernel":
    return "lm_head.weight"
  module = path.split("/", 1)[1].rsplit("/", 1)[0]
  return f"model.layers.{block}.{_BLOCK[module]}.weight"


def expected_shapes(cfg: LlamaConfig, layout: HFLayout) -> dict[str, tuple[int, ...]]:
  """{Hugging Face name: shape} of a LLaMA checkpoint of `cfg` / `layout`."""
  d, f, hd = cfg.hidden, cfg.intermediate, cfg.hidden // cfg.heads
  out = {"model.embed_tokens.weight": (cfg.vocab_size, d), "model.norm.weight": (d,)}
  if not layout.tied:
    out["lm_head.weight"] = (cfg.vocab_size, d)
  for i in range(cfg.layers):
    p = f"model.layers.{i}."
    out.update({p + "self_attn.q_proj.weight": (d, d),
                p + "self_attn.k_proj.weight": (layout.kv_heads * hd, d),
                p + "self_attn.v_proj.weight": (layout.kv_heads * hd, d),
                p + "self_attn.o_proj.weight": (d, d), p + "mlp.gate_proj.weight": (f, d),
                p + "mlp.up_proj.weight": (f, d), p + "mlp.down_proj.weight": (d, f),
                p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,)})
  return out


def check_tensors(tensors: dict, expected: dict, where: str = "the checkpoint"):
  """Raises one CheckpointError listing every missing, extra and misshapen tensor."""
  missing = sorted(set(expected) - set(tensors))
  extra = sorted(k for k in set(tensors) - set(expected) if not k.endswith("rotary_emb.inv_freq"))
  bad = sorted(f"{k} {tuple(tensors[k].shape)} (expected {expected[k]})"
               for k in set(expected) & set(tensors) if tuple(tensors[k].shape) != expected[k])
  if missing or extra or bad:
    parts = [f"{label} ({len(items)}): {', '.join(items)}"
             for label, items in (("missing", missing), ("extra", extra), ("misshapen", bad))
             if items]
    raise CheckpointError(f"{where} does not match a LLaMA of its config.json: "
                          + "; ".join(parts) + ".")


def _from_hf(tensor: np.ndarray, path: str, cfg: LlamaConfig, layout: HFLayout) -> np.ndarray:
  """One Hugging Face tensor as lpjax's parameter at `path` (float32)."""
  del cfg, layout  # the model has the checkpoint's structure
  t = np.asarray(tensor).astype(np.float32)
  return t.T if path.endswith("kernel") else t


def params_from_tensors(tensors: dict, cfg: LlamaConfig, layout: HFLayout,
                        policy: QuantPolicy | None = None, where: str = "the checkpoint"):
  """lpjax LLaMA params (laid out for `policy`: scanned or unrolled) from Hugging Face tensors."""
  if layout != layout_of(cfg):
    raise ValueError(f"{where}: the checkpoint has {layout}, the model {layout_of(cfg)}; build "
                     "the LlamaConfig with llama_config_from_hf.")
  check_tensors(tensors, expected_shapes(cfg, layout), where)
  _, abstract = abstract_model(cfg, policy)
  stacked = cfg.scanned(policy if policy is not None else QuantPolicy())
  dtype = np.dtype(cfg.param_dtype)

  def one(path, leaf):
    name = _lpjax_path(path)
    if name.startswith("layers/"):
      if stacked:
        canonical = name
        return np.stack([_from_hf(tensors[_hf_name(canonical, i)], canonical, cfg, layout)
                         for i in range(cfg.layers)]).astype(dtype)
      _, block, rest = name.split("/", 2)
      canonical = f"layers/{rest}"
      return _from_hf(tensors[_hf_name(canonical, int(block))], canonical, cfg,
                      layout).astype(dtype)
    return _from_hf(tensors[_hf_name(name, None)], name, cfg, layout).astype(dtype)

  return jax.tree_util.tree_map_with_path(lambda p, x: jax.numpy.asarray(one(p, x)), abstract)


def _flat_params(params) -> dict[str, np.ndarray]:
  """{"layers/{i}/attn/q_proj/kernel" (blocks numbered) or "embed/embedding": float array}."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name, a = _lpjax_path(path), np.asarray(jax.device_get(leaf))
    if name.startswith("layers/") and not name.split("/")[1].isdigit():  # a scanned stack
      _, rest = name.split("/", 1)
      for i in range(a.shape[0]):
        out[f"layers/{i}/{rest}"] = a[i]
    else:
      out[name] = a
  return out


def _packed(params, policy: QuantPolicy, layout: str, dtype, requantize: bool) -> dict:
  """`quant.export_weights` of `params` for `layout`; every reason the export cannot be made
  (a format the run did not train in, a forward quantizer packed values cannot reproduce) in
  one ValueError."""
  problems = []
  fits, _ = FORMATS[layout]
  wrong = sorted({f"{getattr(r, 'name', '') or 'a recipe'} ({r.fwd.rhs.format.name})"
                  for r in quant.weight_recipes(params, policy).values()
                  if not fits(r.fwd.rhs.format)})
  if wrong:
    problems.append(f"--format={layout} cannot hold what the run trained: its weights were "
                    f"quantized by {', '.join(wrong)}. What you train is what you serve: "
                    "export the format the run's recipe uses, or bf16.")
  packed = {}
  try:
    packed = quant.export_weights(params, policy, dtype=dtype, requantize=requantize)
  except ValueError as error:
    problems.append(str(error))
  if problems:
    raise ValueError(" Also: ".join(problems) if len(problems) > 1 else problems[0])
  if not packed:
    raise ValueError(f"--format={layout}: the policy quantizes no linear weight (its last step "
                     "ran every layer in high precision); export bf16.")
  return packed


def export_tensors(cfg: LlamaConfig, params, *, layout: str = "bf16",
                   policy: QuantPolicy | None = None, requantize: bool = False,
                   base_config: dict | None = None, max_positions: int | None = None,
                   input_scales: dict | None = None) -> tuple[dict, dict]:
  """(config.json dict, {name: numpy tensor}) of lpjax LLaMA `params` in the Hugging Face layout.

  layout: "bf16" / "float32" (every weight in that dtype), or "mxfp4" / "nvfp4": the linear
  weights `policy` quantizes are packed as `policy`'s forward GEMMs quantize them
  (`lpjax.quant.export_weights`, in the model's compute dtype); embeddings, norms and kept layers
  stay bf16. A forward weight quantizer that packed values cannot reproduce (the `mxfp4`
  preset's random Hadamard transform, quartet's QuEST) is refused unless `requantize`: then the
  round-to-nearest-even of the trained weights is packed, with a warning, and config.json's
  quantization_config records it under "lpjax_requantized". `base_config` / `max_positions`:
  the config.json keys kept from the imported checkpoint (`hf_config`). `input_scales`
  ({lpjax layer path: float32 scalar}, layout "nvfp4" only: lpjax/models/_calibration.py) adds
  each packed linear's calibrated `input_scale`: ModelOpt's "NVFP4" (weights and activations)
  instead of the weight-only "W4A16_NVFP4".
  """
  if input_scales is not None and layout != "nvfp4":
    raise ValueError(f"input_scales (--calibration_batches) are ModelOpt NVFP4's; layout={layout!r} "
                     "is weight-only: export --format=nvfp4, or leave them out.")
  flat = _flat_params(params)
  dtype = np.float32 if layout == "float32" else ml_dtypes.bfloat16
  config = hf_config(cfg, "float32" if layout == "float32" else "bfloat16", base_config,
                     max_positions)
  packed = {}
  if layout in QUANT_LAYOUTS:
    if policy is None:
      raise ValueError(f"layout={layout!r} needs the policy the model was trained with.")
    policy = policy.for_model(num_blocks=cfg.layers)
    packed = _packed(params, policy, layout, cfg.compute_dtype, requantize)
  elif layout not in ("bf16", "float32"):
    raise ValueError(f"Unknown layout {layout!r}; valid: bf16, float32, "
                     f"{', '.join(QUANT_LAYOUTS)}.")
  tensors, kept = {}, []
  for name, a in flat.items():
    block = int(name.split("/")[1]) if name.startswith("layers/") else None
    canonical = f"layers/{name.split('/', 2)[2]}" if block is not None else name
    hf = _hf_name(canonical, block)
    if name in packed:
      for suffix, t in FORMATS[layout][1](packed[name]).items():
        tensors[hf[:-len("weight")] + suffix] = t
      if input_scales is not None:
        tensors[hf[:-len("weight")] + "input_scale"] = np.asarray(
            input_scales[name[:-len("/kernel")]], np.float32).reshape(())
      continue
    if layout in QUANT_LAYOUTS and name.endswith("kernel"):
      kept.append(hf[:-len(".weight")])
    tensors[hf] = (a.T if name.endswith("kernel") else a).astype(np.float32).astype(dtype)
  if layout in QUANT_LAYOUTS:
    if cfg.tie_embeddings:  # the client's lm_head module (tied to the embedding) stays unquantized
      kept.append("lm_head")
    config["quantization_config"] = quantization_config(
        layout, sorted(kept), [w.requantized for w in packed.values() if w.requantized],
        activations=input_scales is not None)
  return config, tensors


def save_pretrained(path: str, cfg: LlamaConfig, params, *, dtype: str = "bfloat16",
                    policy: QuantPolicy | None = None, max_shard_bytes: int | None = None,
                    requantize: bool = False, base_config: dict | None = None,
                    max_positions: int | None = None, files: dict | None = None,
                    overwrite: bool = False, input_scales: dict | None = None):
  """Writes `params` as a Hugging Face LLaMA checkpoint directory (`dtype`: "bfloat16",
  "float32", "mxfp4" or "nvfp4"; `requantize`, `base_config`, `max_positions`: see
  `export_tensors`; `files`: {file name: bytes} written beside the weights, e.g. the tokenizer's;
  a non-empty `path` is refused unless `overwrite`, then replaced whole: `write_checkpoint`)."""
  layout = {"bfloat16": "bf16"}.get(dtype, dtype)
  config, tensors = export_tensors(cfg, params, layout=layout, policy=policy,
                                   requantize=requantize, base_config=base_config,
                                   max_positions=max_positions, input_scales=input_scales)
  modelopt = hf_quant_config(config)
  if modelopt is not None:
    files = {**(files or {}), "hf_quant_config.json": json.dumps(modelopt, indent=2)}
  write_checkpoint(path, config, tensors, max_shard_bytes, files=files, overwrite=overwrite)


def load_pretrained(path: str, policy: QuantPolicy | None = None, **fields):
  """(LlamaConfig, params) of a Hugging Face LLaMA checkpoint directory; `fields` complete the
  LlamaConfig (max_seq_len, scan_layers, param_dtype, ...). Missing, extra or misshapen tensors
  raise one CheckpointError that lists them."""
  config_path = os.path.join(path, CONFIG)
  if not os.path.exists(config_path):
    raise CheckpointError(f"{path} has no {CONFIG}: give the directory of a Hugging Face LLaMA "
                          "checkpoint (config.json + *.safetensors).")
  with open(config_path) as f:
    hf = json.load(f)
  if hf.get("quantization_config"):
    raise CheckpointError(f"{path} is quantized ({hf['quantization_config'].get('quant_method')}); "
                          "lpjax imports bf16 / fp16 / fp32 checkpoints.")
  cfg, layout = llama_config_from_hf(hf, **fields)
  return cfg, params_from_tensors(read_tensors(path), cfg, layout, policy, where=path)
