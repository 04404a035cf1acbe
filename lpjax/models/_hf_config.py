"""Hugging Face LLaMA config.json <-> lpjax's LlamaConfig.

`llama_config_from_hf` reads a config.json dict (refusing, in one message, what lpjax's LLaMA
cannot run). `hf_config` writes one: the architecture from the LlamaConfig, and everything else
from `base`, the config.json of the checkpoint the run was imported from (its
`max_position_embeddings`, `bos_token_id` / `eos_token_id`, `rope_scaling` and any key lpjax does
not interpret), so that an export describes the same model the import read. Only what the export
itself decides is rewritten: the sizes, `torch_dtype` and `quantization_config` (dropped here; the
FP4 layouts add their own).

Examples:
  >>> from lpjax.models.llama import LlamaConfig
  >>> cfg = LlamaConfig(vocab_size=40, hidden=32, intermediate=64, heads=2, layers=1, max_seq_len=8)
  >>> hf_config(cfg)["max_position_embeddings"]  # a fresh model: its own length
  8
  >>> base = {"max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2,
  ...         "torch_dtype": "float16", "transformers_version": "4.44.0"}
  >>> out = hf_config(cfg, "bfloat16", base)
  >>> out["max_position_embeddings"], out["bos_token_id"], out["torch_dtype"]
  (4096, 1, 'bfloat16')
  >>> hf_config(cfg, "bfloat16", base, max_positions=2048)["max_position_embeddings"]
  2048
"""

from __future__ import annotations

import dataclasses

from lpjax.models._hf_checkpoint_files import CheckpointError
from lpjax.models.llama import LlamaConfig

_LLAMA3 = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# keys of a base config.json that describe its file, not the model: never carried over
_DROPPED = ("quantization_config", "torch_dtype", "dtype", "transformers_version", "_name_or_path")


@dataclasses.dataclass(frozen=True)
class HFLayout:
  """What a Hugging Face config adds to a LlamaConfig: the k / v heads and the tying."""

  kv_heads: int  # num_key_value_heads (GQA when < heads)
  tied: bool  # tie_word_embeddings: no lm_head.weight, the LM head is the embedding table


def llama_config_from_hf(hf: dict, **fields) -> tuple[LlamaConfig, HFLayout]:
  """(LlamaConfig, HFLayout) of a Hugging Face LLaMA config.json dict; `fields` set the rest
  (max_seq_len defaults to max_position_embeddings; scan_layers, dtypes, ...)."""
  problems = []
  kind = hf.get("model_type", "llama")
  if kind != "llama":
    problems.append(f"model_type is {kind!r}, not 'llama'")
  required = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
              "vocab_size")
  absent = [key for key in required if key not in hf]
  if absent:
    problems.append(f"it has no {', '.join(absent)}")
  if absent or kind != "llama":
    raise CheckpointError("This Hugging Face config is not a LLaMA lpjax can load: "
                          + "; ".join(problems) + ".")
  if hf.get("hidden_act", "silu") != "silu":
    problems.append(f"hidden_act {hf.get('hidden_act')!r} (lpjax's LLaMA: silu)")
  for key in ("attention_bias", "mlp_bias"):
    if hf.get(key):
      problems.append(f"{key} is true (lpjax's LLaMA has no biases)")
  scaling = hf.get("rope_scaling") or {}
  kind_of_scaling = scaling.get("rope_type", scaling.get("type"))
  if scaling and kind_of_scaling != "llama3":
    problems.append(f"rope_scaling {scaling!r} (lpjax's LLaMA: plain RoPE or rope_type 'llama3')")
  elif scaling and not all(k in scaling for k in _LLAMA3):
    problems.append(f"rope_scaling {scaling!r} lacks {', '.join(k for k in _LLAMA3 if k not in scaling)}")
  heads, hidden = int(hf["num_attention_heads"]), int(hf["hidden_size"])
  kv = int(hf.get("num_key_value_heads") or heads)
  if hidden % heads or heads % kv:
    problems.append(f"hidden_size {hidden}, num_attention_heads {heads} and num_key_value_heads "
                    f"{kv} do not divide")
  if hf.get("head_dim") not in (None, hidden // max(heads, 1)):
    problems.append(f"head_dim {hf['head_dim']} is not hidden_size / num_attention_heads")
  if problems:
    raise CheckpointError("This Hugging Face config is not a LLaMA lpjax can load: "
                          + "; ".join(problems) + ".")
  fields.setdefault("max_seq_len", int(hf.get("max_position_embeddings", 2048)))
  cfg = LlamaConfig(vocab_size=int(hf["vocab_size"]), hidden=hidden,
                    intermediate=int(hf["intermediate_size"]), heads=heads,
                    layers=int(hf["num_hidden_layers"]),
                    rope_theta=float(hf.get("rope_theta", 10000.0)),
                    norm_eps=float(hf.get("rms_norm_eps", 1e-6)), num_kv_heads=0 if kv == heads else kv,
                    tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
                    rope_scaling=_scaling_pairs(scaling), **fields)
  return cfg, layout_of(cfg)


def _scaling_pairs(scaling: dict) -> tuple:
  """LlamaConfig.rope_scaling of a Hugging Face rope_scaling dict (llama3's keys)."""
  if not scaling:
    return ()
  out = {k: float(scaling[k]) for k in _LLAMA3}
  out["original_max_position_embeddings"] = int(scaling["original_max_position_embeddings"])
  return tuple(sorted({**out, "rope_type": "llama3"}.items()))


def layout_of(cfg: LlamaConfig) -> HFLayout:
  """The HFLayout of lpjax's LLaMA `cfg`: its own k / v heads and tying."""
  return HFLayout(kv_heads=cfg.kv_heads, tied=cfg.tie_embeddings)


def hf_config(cfg: LlamaConfig, dtype: str = "bfloat16", base: dict | None = None,
              max_positions: int | None = None) -> dict:
  """The Hugging Face config.json dict of `cfg` (its k / v heads, tying and rope_scaling).

  base: the config.json the model was imported from (or the keys a fresh model's export sets:
    bos / eos of its tokenizer, the length it trained at); every key the architecture does not
    decide is kept from it.
  max_positions: max_position_embeddings to write instead of base's (a run that set
    model.max_seq_len); without base either, cfg.max_seq_len.
  """
  out = {k: v for k, v in (base or {}).items() if k not in _DROPPED}
  positions = max_positions or out.get("max_position_embeddings") or cfg.max_seq_len
  out.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden,
              "intermediate_size": cfg.intermediate, "num_attention_heads": cfg.heads,
              "num_key_value_heads": cfg.kv_heads, "num_hidden_layers": cfg.layers,
              "head_dim": cfg.hidden // cfg.heads, "max_position_embeddings": int(positions),
              "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
              "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
              "tie_word_embeddings": cfg.tie_embeddings, "torch_dtype": dtype})
  if cfg.rope_scaling:
    out["rope_scaling"] = {**(out.get("rope_scaling") or {}), **dict(cfg.rope_scaling)}
  else:
    out["rope_scaling"] = None
  return out
