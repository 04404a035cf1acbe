"""The model and data checks of `validate`: the model against its task, the tokenizer, the data
source's files and keys, the sequence-length schedule and the diffusion settings.

Each check appends its problems (one line each, with the fix) to the list it is given; `validate`
(lpjax/train/schema/_validate.py) raises them together.

Examples:
  >>> parse_schedule("64:0.2,128:0.5")
  [(64, 0.2), (128, 0.5)]
"""

from __future__ import annotations

import codecs
import glob
import math
import os

from lpjax.models.llama_sizes import LLAMA_SIZES
from lpjax.train.schema._config_schema import (DATA_KEYS_BY_SOURCE, IMAGE_SOURCES, TEXT_SOURCES,
                                        VISION_MODELS, ConfigError, base_config)

def parse_schedule(text: str, problems=None):
  """[(seq_len, fraction)] of data.seq_len_schedule ("64:0.2,128:0.5")."""
  points = []
  for part in filter(None, (p.strip() for p in text.split(","))):
    try:
      length, fraction = part.split(":")
      points.append((int(length), float(fraction)))
    except ValueError:
      msg = (f"data.seq_len_schedule entry {part!r} is not 'seq_len:fraction', e.g. "
             "'64:0.2,128:0.5'.")
      if problems is None:
        raise ConfigError(msg) from None
      problems.append(msg)
  return points


def _tokenizer_vocab(tok: str, problems) -> int | None:
  """The tokenizer's vocabulary size, or None (with the problem) when it cannot be built."""
  from lpjax.data import get_tokenizer

  try:
    return int(get_tokenizer(tok).vocab_size)
  except ImportError as e:
    problems.append(f"data.tokenizer {tok!r} needs the sentencepiece package ({e}); install it "
                    "with: pip install sentencepiece (or use data.tokenizer='byte').")
  except Exception as e:  # noqa: BLE001  (sentencepiece's own errors are RuntimeError / OSError)
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    problems.append(f"data.tokenizer {tok!r} is not a SentencePiece model file ({first}); give the "
                    "path of a .model file (e.g. T5's spiece.model) or 'byte'.")
  return None


def validate_lm(config, problems) -> int:
  """Checks the model and data fields of an lm config; returns the attention heads (0 if unknown)."""
  if config.model.name != "llama":
    problems.append(f"task 'lm' trains model.name 'llama', got {config.model.name!r}; set "
                    "task='classification' or 'diffusion' for the vision models.")
  heads = 0
  if config.model.size not in LLAMA_SIZES:
    problems.append(f"model.size {config.model.size!r} is unknown; valid: "
                    f"{', '.join(LLAMA_SIZES)}.")
  else:
    size = LLAMA_SIZES[config.model.size]
    heads = size.heads
    if size.hidden % size.heads:
      problems.append("model hidden size must be divisible by the number of heads.")
    kv = config.model.get("num_kv_heads", 0)
    if kv < 0 or (kv and size.heads % kv):
      problems.append(f"model.num_kv_heads {kv} must divide the {size.heads} attention heads of "
                      f"model.size {config.model.size!r} (0: one k / v head per query head).")
    tensor = config.mesh.get("tensor", 1)
    if kv > 0 and tensor > 1 and kv % tensor:
      problems.append(f"mesh.tensor {tensor} must divide model.num_kv_heads {kv}: the k / v "
                      "projections are split by heads.")
    kept = config.quant.keep_first + config.quant.keep_last
    if kept > size.layers:
      problems.append(f"quant.keep_first + quant.keep_last = {kept} exceeds the model's "
                      f"{size.layers} blocks.")
  if config.seq_len <= 0:
    problems.append(f"seq_len must be positive, got {config.seq_len}.")
  chunks = config.model.vocab_chunks
  if chunks < 0 or (chunks > 1 and 0 < config.model.vocab_size < chunks):
    problems.append(f"model.vocab_chunks must be in [0, vocab size], got {chunks} (0 or 1: the "
                    "whole logits at once).")
  if chunks > 1 and config.quant.policy == "pure":
    problems.append("model.vocab_chunks > 1 needs a high-precision LM head, and quant.policy "
                    "'pure' quantizes it (a slice of a block-scaled head would get other scales); "
                    "use quant.policy='default' or model.vocab_chunks=0.")
  if config.model.max_seq_len and config.seq_len > config.model.max_seq_len:
    problems.append(f"seq_len {config.seq_len} exceeds model.max_seq_len "
                    f"{config.model.max_seq_len}; lower seq_len or raise model.max_seq_len.")
  for length, fraction in parse_schedule(config.data.seq_len_schedule, problems):
    if not 0 < length <= config.seq_len:
      problems.append(f"data.seq_len_schedule length {length} must be in "
                      f"(0, seq_len={config.seq_len}].")
    if not (math.isfinite(fraction) and 0 <= fraction <= 1):
      problems.append(f"data.seq_len_schedule fraction {fraction} must be in [0, 1] (a fraction "
                      "of steps).")
  tok = config.data.tokenizer
  if tok not in ("byte", "bytes") and not os.path.isfile(tok):
    problems.append(f"data.tokenizer {tok!r} is neither 'byte' nor an existing SentencePiece "
                    ".model file; give the path of the model file (e.g. T5's spiece.model).")
  else:
    vocab = _tokenizer_vocab(tok, problems)
    if config.model.vocab_size < 0:
      problems.append(f"model.vocab_size must be >= 0 (0: the tokenizer's), got "
                      f"{config.model.vocab_size}.")
    elif vocab and 0 < config.model.vocab_size < vocab:
      problems.append(f"model.vocab_size {config.model.vocab_size} is smaller than the "
                      f"tokenizer's {vocab} tokens (every step would be NaN); use 0 (the "
                      "tokenizer's size) or at least that.")
  if config.data.source == "text" and not config.data.path:
    problems.append("data.source='text' needs data.path (a file or a glob).")
  elif config.data.source == "text":
    _check_text_files(config.data, problems)
  if config.data.source == "tfds" and not config.data.tfds_name:
    problems.append("data.source='tfds' needs data.tfds_name, e.g. 'c4/en'.")
  if config.data.source not in TEXT_SOURCES:
    problems.append(f"data.source {config.data.source!r} is unknown; valid: "
                    f"{', '.join(TEXT_SOURCES)}.")
  if config.data.tfds_reader not in ("auto", "data_source", "tf_data"):
    problems.append(f"data.tfds_reader {config.data.tfds_reader!r} is unknown; valid: auto, "
                    "data_source (array_record), tf_data (needs TensorFlow).")
  return heads


def _check_text_files(d, problems):
  """data.path names files (not a folder, not nothing), data.encoding and encoding_errors exist."""
  path = os.path.expanduser(d.path)
  if not any(os.path.isfile(f) for f in glob.glob(path, recursive=True)):
    if os.path.isdir(path):
      problems.append(f"data.path {d.path!r} is a folder; give a file or a glob of its text "
                      f"files, e.g. {os.path.join(d.path, '**', '*.txt')!r}.")
    else:
      problems.append(f"data.path {d.path!r} matches no file; give a text file or a glob such as "
                      "'corpus/*.txt'.")
  try:
    codecs.lookup(d.encoding)
  except LookupError:
    problems.append(f"data.encoding {d.encoding!r} is not an encoding Python knows; use e.g. "
                    "'utf-8' or 'latin-1'.")
  try:
    codecs.lookup_error(d.encoding_errors)
  except LookupError:
    problems.append(f"data.encoding_errors {d.encoding_errors!r} is unknown; valid: 'strict' (an "
                    "undecodable byte is an error), 'replace', 'ignore', 'backslashreplace'.")


def check_data_keys(config, problems):
  """Every data.* key that differs from its default is read by the configured data.source, and
  data.cache_dir, if set, is not a file."""
  cache = os.path.expanduser(config.data.cache_dir)
  if cache and os.path.exists(cache) and not os.path.isdir(cache):
    problems.append(f"data.cache_dir {config.data.cache_dir!r} is a file; give a folder for the "
                    "token cache, or '' for $LPJAX_CACHE_DIR or ~/.cache/lpjax.")
  kind = "lm" if config.task == "lm" else "images"
  by_source = DATA_KEYS_BY_SOURCE[kind]
  source = config.data.source
  if source not in by_source:
    return  # reported as an unknown source
  defaults = base_config(config.task).data
  for key in sorted(config.data.keys()):
    if key == "source" or key in by_source[source] or config.data[key] == defaults.get(key):
      continue
    readers = [s for s, keys in by_source.items() if key in keys]
    owners = " or ".join(repr(s) for s in readers) or "no source"
    problems.append(f"data.{key}={config.data[key]!r} is not read by data.source={source!r} (only "
                    f"by {owners}), so it would be ignored; remove it or set data.source.")


def validate_vision(config, problems) -> int:
  """Checks the model, data and diffusion fields of an image config; returns 0 (no heads)."""
  models = VISION_MODELS[config.task]
  if config.model.name not in models:
    problems.append(f"model.name {config.model.name!r} is not a {config.task} model; valid: "
                    f"{', '.join(models)}.")
  if config.data.source not in IMAGE_SOURCES:
    problems.append(f"data.source {config.data.source!r} is not an image source; valid: "
                    f"{', '.join(IMAGE_SOURCES)} (digits needs no download).")
  if config.data.source == "tfds" and not config.data.tfds_name:
    problems.append("data.source='tfds' needs data.tfds_name, e.g. 'cifar10' or 'imagenet2012'.")
  if config.data.classes not in ("", "imagenet100"):
    problems.append(f"data.classes {config.data.classes!r} is unknown; valid: '' or "
                    "'imagenet100'.")
  if config.data.image_size < 0:
    problems.append(f"data.image_size must be >= 0, got {config.data.image_size}.")
  if config.task == "classification":
    if config.model.stem not in ("", "imagenet", "small"):
      problems.append("model.stem must be '', 'imagenet' or 'small'.")
    if config.grad_accum_steps != 1:
      model = (f"model.factory {config.model.factory!r}" if config.model.get("factory")
               else f"model.name {config.model.name!r}")
      problems.append(f"grad_accum_steps={config.grad_accum_steps}: the classification task "
                      f"({model}) trains with grad_accum_steps=1 only (microbatches would give "
                      "BatchNorm statistics of a smaller batch); set grad_accum_steps=1, and "
                      "lower batch_size if memory is short.")
    return 0
  d = config.diffusion
  if d.schedule not in ("linear", "cosine"):
    problems.append(f"diffusion.schedule {d.schedule!r} is unknown; valid: linear, cosine.")
  if d.sampler not in ("ddim", "ddpm"):
    problems.append(f"diffusion.sampler {d.sampler!r} is unknown; valid: ddim, ddpm.")
  if d.timesteps < 2 or not 0 < d.sample_steps <= d.timesteps:
    problems.append("diffusion.timesteps must be >= 2 and 0 < diffusion.sample_steps <= "
                    "timesteps.")
  if d.fid_inception_path and not os.path.isfile(d.fid_inception_path):
    problems.append(f"diffusion.fid_inception_path {d.fid_inception_path!r} does not exist; "
                    "give the path of an Inception-v3 .npz checkpoint (the weights "
                    "lpjax.eval.load_inception reads; see lpjax/eval/_inception.py) or ''.")
  return 0
