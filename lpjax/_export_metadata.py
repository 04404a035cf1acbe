"""What an export of a training run writes beside the weights: the config.json keys it keeps and
the tokenizer files (python -m lpjax.export; lpjax/export.py).

A run imported from a Hugging Face checkpoint (model.init_from=hf:PATH) is exported with that
checkpoint's config.json as the base (`max_position_embeddings`, `bos_token_id` /
`eos_token_id`, `rope_scaling`, ...: lpjax.models._hf_config.hf_config) and its tokenizer files,
both read from PATH or, when PATH has moved, from the copy the run kept in <workdir>/init_from.
A fresh model's base holds its tokenizer's bos / eos and the longest sequence it trained at. The
run's sequence length replaces max_position_embeddings only when the run set model.max_seq_len.
Tokenizer files: the imported checkpoint's when it has some; else the run's tokenizer's (lpjax's
byte tokenizer as a tokenizer.json transformers loads; a SentencePiece model file as
tokenizer.model).
"""

from __future__ import annotations

import json
import os


def export_metadata(config, workdir: str) -> tuple[dict, int | None, dict]:
  """(base config.json dict, max_positions or None, {file name: bytes or str}) of the run of
  `config` in `workdir`."""
  from lpjax.data import get_tokenizer  # noqa: PLC0415
  from lpjax.models import hf_llama  # noqa: PLC0415
  from lpjax.models._hf_tokenizer import byte_tokenizer_files, tokenizer_files_in  # noqa: PLC0415
  from lpjax.train.schema._preflight import _max_seq_len  # noqa: PLC0415
  from lpjax.train.tasks.lm import init_checkpoint  # noqa: PLC0415

  max_positions = int(config.model.max_seq_len) or None
  source = init_checkpoint(config, workdir)
  base, files = {}, {}
  if source is not None:
    with open(os.path.join(source, hf_llama.CONFIG)) as f:
      base = json.load(f)
    files = tokenizer_files_in(source)
  else:
    base["max_position_embeddings"] = _max_seq_len(config)
  if not any(name.startswith("tokenizer") for name in files):
    spec = config.data.get("tokenizer", "byte")
    tokenizer = get_tokenizer(spec)
    positions = max_positions or base.get("max_position_embeddings")
    if tokenizer.name == "byte":
      files.update(byte_tokenizer_files(tokenizer.eos_id, positions))
      bos = tokenizer.eos_id  # documents follow the end-of-document token
    else:
      with open(spec, "rb") as f:
        files["tokenizer.model"] = f.read()
      bos = int(tokenizer._sp.bos_id())  # noqa: SLF001
    base.setdefault("eos_token_id", tokenizer.eos_id)
    base.setdefault("bos_token_id", bos if bos >= 0 else None)
  return base, max_positions, files
