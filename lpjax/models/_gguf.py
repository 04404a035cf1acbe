"""GGUF (llama.cpp's file format) exports of lpjax's LLaMA: `--format gguf` (bf16 weights) and
`--format gguf-mxfp4` (the linear weights the run's policy quantized in GGML's MXFP4 type).

Why GGUF for MXFP4: no public loader reads MXFP4 `_blocks` / `_scales` safetensors for a dense
LLaMA. transformers 4.57.6 (quantizers/quantizer_mxfp4.py, integrations/mxfp4.py) converts only
gpt-oss's `GptOssExperts` into `Mxfp4GptOssExperts`; vLLM's quantization/mxfp4.py
(`Mxfp4Config.get_quant_method`) gives a dense `LinearBase` the unquantized method ("MXFP4 linear
layer is not implemented"; NotImplementedError in older releases), MXFP4 only for FusedMoE;
compressed-tensors' `mxfp4-pack-quantized` (`--format mxfp4-ct`) and GGUF's
MXFP4 type, which llama.cpp computes with on a CPU, are the public readers of dense MXFP4.

The layout, as llama.cpp defines it (ggml/src/ggml-common.h `block_mxfp4`, ggml-quants.c
`dequantize_row_mxfp4`; gguf-py/gguf/quants.py `MXFP4`): each row of a (out, in) weight is cut
into blocks of 32 elements, each stored as 17 bytes: one E8M0 byte e, then 16 bytes whose low
nibble is element j and high nibble element j + 16 (lpjax's packing puts elements 2i and 2i+1 in
one byte: the nibbles are reordered, never requantized). A nibble indexes
kvalues_mxfp4 = (0, 1, 2, 3, 4, 6, 8, 12, -0, -1, ..., -12) = 2 x E2M1 (OCP's codes), and the
block decodes as kvalues[q] * 2^(e - 128) = E2M1(q) * 2^(e - 127): the run's codes and E8M0
scales, bit for bit. Tensor names and keys follow llama.cpp's converter for LlamaForCausalLM
(convert_hf_to_gguf.py, gguf-py/gguf/constants.py MODEL_ARCH.LLAMA): `token_embd`,
`blk.{i}.attn_{q,k,v,output}`, `blk.{i}.ffn_{gate,up,down}`, `blk.{i}.{attn,ffn}_norm`,
`output_norm`, `output` (absent when tied), `rope_freqs` for Llama 3's rope_scaling; q / k rows are
permuted from Hugging Face's half-split RoPE to GGML's adjacent pairs (the converter's
`LlamaModel.permute`). Norms are float32; the embedding, LM head and kept layers bf16. No
vocabulary is written (tokenizer.ggml.model "no_vocab": token ids in, logits out).

Written with llama.cpp's own `gguf` package (requirements-interop.txt; pure Python).
"""

from __future__ import annotations

import json
import math
import os

import ml_dtypes
import numpy as np

GGUF_FORMATS = ("gguf", "gguf-mxfp4")
FILE = "model.gguf"
_BLOCK = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
          "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def gguf_name(hf_module: str) -> str:
  """llama.cpp's tensor name (without ".weight") of a Hugging Face LLaMA module name."""
  if hf_module in _TOP:
    return _TOP[hf_module]
  _, _, block, rest = hf_module.split(".", 3)
  return f"blk.{block}.{_BLOCK[rest]}"


def permute_rope_rows(w: np.ndarray, heads: int) -> np.ndarray:
  """q / k rows (out, ...) from the half-split RoPE order to GGML's adjacent pairs
  (convert_hf_to_gguf.py LlamaModel.permute). Rows move whole, so MXFP4 blocks move intact."""
  return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
      w.shape)


def mxfp4_rows(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
  """GGML MXFP4 bytes (out, in / 32 * 17) of lpjax's packed codes `blocks` (out, in / 32, 16),
  element 2i in the low nibble, and E8M0 `scales` (out, in / 32).

  Examples:
    >>> codes = np.arange(32, dtype=np.uint8) % 16  # elements 0..31 of one block
    >>> packed = (codes[0::2] | codes[1::2] << 4).reshape(1, 1, 16)
    >>> row = mxfp4_rows(packed, np.array([[127]], np.uint8))
    >>> int(row[0, 0]), [int(b) & 15 for b in row[0, 1:4]], [int(b) >> 4 for b in row[0, 1:4]]
    (127, [0, 1, 2], [0, 1, 2])
  """
  out, nb, _ = blocks.shape
  nibbles = np.stack([blocks & 15, blocks >> 4], axis=-1).reshape(out, nb, 2, 16)
  qs = nibbles[:, :, 0] | (nibbles[:, :, 1] << 4)
  return np.concatenate([scales.reshape(out, nb, 1), qs], axis=-1).reshape(out, nb * 17)


def _rope_factors(hf: dict) -> np.ndarray | None:
  """llama.cpp's `rope_freqs` (head_dim / 2 divisors of the frequencies) of Llama 3's
  rope_scaling (convert_hf_to_gguf.py LlamaModel.generate_extra_tensors), None without it."""
  s = hf.get("rope_scaling") or {}
  if s.get("rope_type", s.get("type")) != "llama3":
    return None
  dim = hf["hidden_size"] // hf["num_attention_heads"]
  freqs = 1.0 / hf.get("rope_theta", 10000.0) ** (np.arange(0, dim, 2, dtype=np.float32) / dim)
  factor, low, high = (float(s[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
  old = float(s["original_max_position_embeddings"])
  out = []
  for f in freqs:
    wavelen = 2 * math.pi / f
    if wavelen < old / high:
      out.append(1.0)
    elif wavelen > old / low:
      out.append(factor)
    else:
      smooth = (old / wavelen - low) / (high - low)
      out.append(1 / ((1 - smooth) / factor + smooth))
  return np.array(out, np.float32)


def gguf_tensors(hf: dict, tensors: dict[str, np.ndarray]) -> dict:
  """{GGUF name: (array, GGML type name)} of an export's Hugging Face tensors (from
  `hf_llama.export_tensors`: "float32" for gguf, "mxfp4" for gguf-mxfp4)."""
  heads, kv = hf["num_attention_heads"], hf.get("num_key_value_heads", hf["num_attention_heads"])
  out = {}
  for name in sorted(tensors):
    module, _, kind = name.rpartition(".")
    t = tensors[name]
    if kind == "weight_scales":
      continue
    if kind == "weight_blocks":
      t, kind = mxfp4_rows(t, tensors[f"{module}.weight_scales"]), "MXFP4"
    elif t.ndim == 1:
      t, kind = np.asarray(t, np.float32), "F32"
    else:
      t, kind = np.asarray(t, np.float32).astype(ml_dtypes.bfloat16), "BF16"
    if module.endswith(("q_proj", "k_proj")):
      t = permute_rope_rows(t, heads if module.endswith("q_proj") else kv)
    out[f"{gguf_name(module)}.weight"] = (t, kind)
  factors = _rope_factors(hf)
  if factors is not None:
    out["rope_freqs.weight"] = (factors, "F32")
  return out


def write_gguf(directory: str, hf: dict, tensors: dict[str, np.ndarray], fmt: str,
               files: dict | None = None) -> None:
  """Writes `directory`/model.gguf (llama architecture) of an export's config.json dict `hf` and
  its tensors, the export's config.json beside it (with quantization_config for gguf-mxfp4:
  which modules were kept) and `files` (the tokenizer's)."""
  try:
    import gguf  # noqa: PLC0415
  except ImportError as error:
    raise ImportError("--format gguf needs llama.cpp's gguf package: pip install -r "
                      "requirements-interop.txt (or pip install gguf).") from error
  mxfp4 = fmt == "gguf-mxfp4"
  w = gguf.GGUFWriter(os.path.join(directory, FILE), "llama")
  heads = hf["num_attention_heads"]
  w.add_name("lpjax LLaMA")
  w.add_vocab_size(hf["vocab_size"])
  w.add_context_length(hf["max_position_embeddings"])
  w.add_embedding_length(hf["hidden_size"])
  w.add_block_count(hf["num_hidden_layers"])
  w.add_feed_forward_length(hf["intermediate_size"])
  w.add_head_count(heads)
  w.add_head_count_kv(hf.get("num_key_value_heads", heads))
  w.add_rope_dimension_count(hf["hidden_size"] // heads)
  w.add_rope_freq_base(float(hf.get("rope_theta", 10000.0)))
  w.add_layer_norm_rms_eps(float(hf["rms_norm_eps"]))
  w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if not mxfp4 else gguf.LlamaFileType.GUESSED)
  w.add_tokenizer_model("no_vocab")
  for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id)):
    if isinstance(hf.get(key), int):
      add(hf[key])
  for name, (t, kind) in gguf_tensors(hf, tensors).items():
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    if kind == "BF16":
      w.add_tensor(name, t.view(np.uint16), raw_dtype=qtype)
    elif kind == "MXFP4":
      w.add_tensor(name, t, raw_dtype=qtype)
    else:
      w.add_tensor(name, t)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(hf, f, indent=2)
  for name, content in (files or {}).items():
    with open(os.path.join(directory, name), "wb") as f:
      f.write(content.encode() if isinstance(content, str) else content)


def save_gguf(path: str, cfg, params, fmt: str, *, policy=None, requantize: bool = False,
              base_config: dict | None = None, max_positions: int | None = None,
              files: dict | None = None, overwrite: bool = False) -> None:
  """Writes `params` (lpjax's LLaMA of `cfg`) as `path`/model.gguf in `fmt` ("gguf": bf16;
  "gguf-mxfp4": the linear weights `policy` quantizes as its forward GEMMs quantized them, the
  checks and `requantize` of `hf_llama.export_tensors`); `path` is replaced whole
  (`write_directory`)."""
  from lpjax.models import hf_llama  # noqa: PLC0415

  if fmt not in GGUF_FORMATS:
    raise ValueError(f"format={fmt!r}; the GGUF formats are {', '.join(GGUF_FORMATS)}.")
  layout = "mxfp4" if fmt == "gguf-mxfp4" else "float32"
  hf, tensors = hf_llama.export_tensors(cfg, params, layout=layout, policy=policy,
                                        requantize=requantize, base_config=base_config,
                                        max_positions=max_positions)
  if fmt == "gguf-mxfp4":
    odd = sorted(n for n, t in tensors.items() if n.endswith("weight_blocks")
                 and _in_features(cfg, n) % 32)
    if odd:
      raise ValueError(f"--format=gguf-mxfp4: GGML's MXFP4 rows are whole 32-element blocks, and "
                       f"{', '.join(odd)} have an input width that is not a multiple of 32; "
                       "export --format=mxfp4-ct or gguf.")
  hf_llama.write_directory(path, lambda tmp: write_gguf(tmp, hf, tensors, fmt, files),
                           overwrite=overwrite)


def _in_features(cfg, name: str) -> int:
  return cfg.intermediate if "down_proj" in name else cfg.hidden
