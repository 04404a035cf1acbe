"""`validate(config, device_count)`: every problem of a training config, found before anything compiles.

Keys and types are checked first (a wrong key or type stops there, with every such problem
named). Then every value: ranges of each numeric hyperparameter, names, the model and data
against each other and against the machine. All problems found are reported in one ConfigError,
one line each, with the fix.

Examples:
  >>> from lpjax.train.config import llama_config
  >>> c = llama_config("tiny")
  >>> c.optimizer.lr, c.optimizer.b2, c.eval_steps = float("nan"), 1.5, 0
  >>> try:
  ...   validate(c, device_count=1)
  ... except ConfigError as e:
  ...   print(e)
  3 problems in the config:
    - eval_steps must be >= 1 (batches per evaluation), got 0.
    - optimizer.lr must be a finite number >= 0, got nan.
    - optimizer.b2 must be in [0, 1), got 1.5.
"""

from __future__ import annotations

import codecs
import difflib
import glob
import math
import os

import ml_collections

from lpjax.models.llama_sizes import LLAMA_SIZES
from lpjax.train._config_schema import (DATA_KEYS_BY_SOURCE, GRAD_ACCUM_DTYPES, IMAGE_SOURCES,
                                        OPTIMIZERS,
                                        PARAM_ROUNDINGS, RESUME_CHOICES, STATE_DTYPES, TASKS,
                                        TEXT_SOURCES, VISION_MODELS, ConfigError, base_config,
                                        flat_keys, task_keys, tasks_of)

class _Problems(list):
  """The messages of one validation; `raise_if_any` raises them as one ConfigError."""

  def raise_if_any(self):
    if len(self) == 1:
      raise ConfigError(self[0])
    if self:
      raise ConfigError(f"{len(self)} problems in the config:\n" +
                        "\n".join(f"  - {p}" for p in self))


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


def _owners(key: str) -> str:
  tasks = tasks_of(key)
  names = " and ".join(repr(t) for t in tasks)
  return f"task{'s' if len(tasks) > 1 else ''} {names}"


def _did_you_mean(key: str) -> str:
  """`key`, with the closest key of any task's schema ("optimizer.lrr (did you mean
  optimizer.lr?)")."""
  known = sorted(set().union(*(task_keys(t) for t in TASKS)))
  close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
  if not close:  # a misspelt section: compare the leaf names within the sections
    leaf = key.rsplit(".", 1)[-1]
    close = [k for k in known if k.rsplit(".", 1)[-1] == leaf][:1]
  return f"{key} (did you mean {close[0]}?)" if close else key


def _check_keys(config):
  """Every key belongs to the schema of config.task; unknown and other tasks' keys are named."""
  keys = flat_keys(config)
  unknown = sorted(k for k in keys if not tasks_of(k))
  if unknown:
    raise ConfigError(f"Unknown config key(s): {', '.join(_did_you_mean(k) for k in unknown)}. "
                      "Valid keys are listed in lpjax/train/_config_schema.py base_config(); "
                      "check the spelling.")
  task = config.get("task")
  if task not in TASKS:
    raise ConfigError(f"task {task!r} is unknown; valid: {', '.join(TASKS)}.")
  foreign = sorted(keys - task_keys(task))
  if foreign:
    owned = "; ".join(f"{k} applies to {_owners(k)} only" for k in foreign)
    raise ConfigError(f"{owned}; this config's task is {task!r}. Start from "
                      f"base_config({task!r}) (lpjax/train/config.py), or remove the key(s).")
  missing = sorted(task_keys(task) - keys)
  if missing:
    raise ConfigError(f"Config key(s) of task {task!r} missing: {', '.join(missing)}. Start from "
                      f"base_config({task!r}) (lpjax/train/config.py), which has every key.")


def _check_types(config, reference, problems, prefix=""):
  """Each field has its default's type (an int where a float is expected is fine)."""
  for key, default in reference.items():
    value, name = config[key], prefix + key
    if isinstance(default, ml_collections.ConfigDict):
      if not isinstance(value, ml_collections.ConfigDict):
        problems.append(f"{name} must be a section (ConfigDict), got {type(value).__name__}.")
      else:
        _check_types(value, default, problems, name + ".")
      continue
    expected = type(default)
    ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
    ok = ok or (expected is float and isinstance(value, int) and not isinstance(value, bool))
    if not ok:
      problems.append(f"{name} must be a {expected.__name__} (like its default {default!r}), "
                      f"got {value!r} of type {type(value).__name__}.")


def _at_least(problems, name, value, low, what=""):
  if not (math.isfinite(value) and value >= low):
    problems.append(f"{name} must be a finite number >= {low:g}{what}, got {value!r}.")


def _in_unit(problems, name, value, closed_top=False):
  ok = math.isfinite(value) and 0 <= value and (value <= 1 if closed_top else value < 1)
  if not ok:
    problems.append(f"{name} must be in [0, 1{']' if closed_top else ')'}, got {value!r}.")


def _check_numbers(config, problems):
  """Ranges of the loop's counts and of every optimizer hyperparameter."""
  for name in ("steps", "batch_size", "log_every", "max_consecutive_skips"):
    if config[name] <= 0:
      problems.append(f"{name} must be positive, got {config[name]}.")
  for name in ("eval_every", "checkpoint_every", "max_rollbacks"):
    if config[name] < 0:
      problems.append(f"{name} must be >= 0, got {config[name]}.")
  if config.task == "lm" and config.eval_steps < 1:  # the image tasks read 0 as the whole split
    problems.append(f"eval_steps must be >= 1 (batches per evaluation), got {config.eval_steps}.")
  elif config.eval_steps < 0:
    problems.append(f"eval_steps must be >= 0 (0: the whole eval split), got {config.eval_steps}.")
  if config.keep_checkpoints < 1:
    problems.append(f"keep_checkpoints must be >= 1 (the last checkpoint is what a crash resumes "
                    f"from), got {config.keep_checkpoints}.")
  o = config.optimizer
  _at_least(problems, "optimizer.lr", o.lr, 0)
  if o.warmup_steps < 0:
    problems.append(f"optimizer.warmup_steps must be >= 0, got {o.warmup_steps}.")
  _in_unit(problems, "optimizer.min_lr_ratio", o.min_lr_ratio, closed_top=True)
  _at_least(problems, "optimizer.weight_decay", o.weight_decay, 0)
  _at_least(problems, "optimizer.grad_clip", o.grad_clip, 0, " (0: off)")
  for name in ("b1", "b2", "gamma1", "gamma2", "gamma3"):
    _in_unit(problems, f"optimizer.{name}", o[name])
  if not (math.isfinite(o.eps) and o.eps > 0):
    problems.append(f"optimizer.eps must be a finite number > 0, got {o.eps!r}.")
  if o.reset_interval < 0:
    problems.append(f"optimizer.reset_interval must be >= 0, got {o.reset_interval}.")
  if "total_steps" in o and o.total_steps < -1:
    problems.append(f"optimizer.total_steps must be >= 0 (0: off) or -1 (the run's steps), got "
                    f"{o.total_steps}.")
  if "eta_min" in o:
    _in_unit(problems, "optimizer.eta_min", o.eta_min, closed_top=True)


def _check_names(config, problems):
  from lpjax.quant import recipes

  if config.optimizer.name not in OPTIMIZERS:
    problems.append(f"optimizer.name {config.optimizer.name!r} is unknown; valid: "
                    f"{', '.join(OPTIMIZERS)}.")
  if config.optimizer.state_dtype not in STATE_DTYPES:
    problems.append(f"optimizer.state_dtype must be one of {', '.join(STATE_DTYPES)}.")
  if config.optimizer.param_rounding not in PARAM_ROUNDINGS:
    valid = " or ".join(map(repr, PARAM_ROUNDINGS))
    problems.append(f"optimizer.param_rounding must be {valid} (how bfloat16 parameters take "
                    f"their updates), got {config.optimizer.param_rounding!r}.")
  if config.grad_accum_dtype not in GRAD_ACCUM_DTYPES:
    valid = " or ".join(map(repr, GRAD_ACCUM_DTYPES))
    problems.append(f"grad_accum_dtype must be {valid} (the sum of the microbatch gradients), got "
                    f"{config.grad_accum_dtype!r}.")
  if config.model.get("param_dtype", "float32") not in ("float32", "bfloat16"):
    problems.append(f"model.param_dtype must be 'float32' or 'bfloat16' (master weights), got "
                    f"{config.model.param_dtype!r}.")
  if config.resume not in RESUME_CHOICES:
    problems.append(f"resume {config.resume!r} is unknown; valid: {', '.join(RESUME_CHOICES)}.")
  for field in ("recipe", "high_precision_recipe"):
    value = config.quant[field]
    try:
      recipes.get(value)
    except (ValueError, TypeError) as e:
      if isinstance(value, str) and ":" in value:  # a variant: the spec parser names the problem
        problems.append(f"quant.{field}: {e} (grammar '<preset>:key=value,...', see "
                        "lpjax/quant/_recipe_variants.py).")
      else:
        problems.append(f"quant.{field} {value!r} is unknown; valid: {', '.join(recipes.NAMES)}, "
                        "or a variant '<preset>:key=value,...' such as 'mxfp4:block_size=16' "
                        "(lpjax/quant/_recipe_variants.py).")
  if config.quant.residuals not in ("", "high_precision", "quantized"):
    problems.append("quant.residuals must be '', 'high_precision' or 'quantized'.")
  if config.quant.policy not in ("default", "pure"):
    problems.append("quant.policy must be 'default' or 'pure'.")
  for name in ("keep_first", "keep_last"):
    if config.quant[name] < 0:
      problems.append(f"quant.{name} must be >= 0 (blocks kept in high precision), got "
                      f"{config.quant[name]}.")
  if not 0.0 <= config.quant.keep_last_fraction < 1.0:
    problems.append(f"quant.keep_last_fraction must be in [0, 1) (the NVIDIA recipe keeps 0.15), "
                    f"got {config.quant.keep_last_fraction}.")
  fractions = {k: config.quant[k] for k in ("warmup_fraction", "qaf_fraction", "finish_fraction")}
  bad = [f"quant.{k}={v}" for k, v in fractions.items() if not 0.0 <= v <= 1.0]
  if bad:
    problems.append(f"{', '.join(bad)}: each phase fraction must be in [0, 1].")
  elif sum(fractions.values()) > 1.0:
    problems.append("quant.warmup_fraction + quant.qaf_fraction + quant.finish_fraction must be "
                    f"<= 1, got {sum(fractions.values()):g}.")


def validate(config, device_count: int, process_count: int = 1):
  """Checks `config` and fills derived fields (mesh.data); raises ConfigError with every problem."""
  _check_keys(config)
  problems = _Problems()
  _check_types(config, base_config(config.task), problems)
  problems.raise_if_any()  # the value checks below rely on the types
  _check_names(config, problems)
  _check_numbers(config, problems)
  heads = _validate_lm(config, problems) if config.task == "lm" else _validate_vision(config, problems)
  _check_data_keys(config, problems)
  data = _check_mesh(config, device_count, process_count, heads, problems)
  problems.raise_if_any()
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.mesh.data = data
  return config


def _check_mesh(config, device_count, process_count, heads, problems) -> int:
  """The resolved mesh.data; problems with the mesh and the batch are appended."""
  fsdp, tensor, data = config.mesh.fsdp, config.mesh.tensor, config.mesh.data
  if fsdp < 1 or tensor < 1:
    problems.append("mesh.fsdp and mesh.tensor must be >= 1.")
    return data
  if data == -1:
    if device_count % (fsdp * tensor):
      problems.append(f"mesh.fsdp * mesh.tensor = {fsdp * tensor} does not divide the "
                      f"{device_count} devices.")
      return data
    data = device_count // (fsdp * tensor)
  if data * fsdp * tensor != device_count:
    problems.append(f"Impossible mesh: data {data} x fsdp {fsdp} x tensor {tensor} = "
                    f"{data * fsdp * tensor}, but there are {device_count} devices. Set "
                    "mesh.data=-1 to use all remaining devices.")
    return data
  if config.batch_size % (data * fsdp) or config.batch_size % process_count:
    problems.append(f"batch_size {config.batch_size} is not divisible by the {data * fsdp} batch "
                    f"shards (mesh.data x mesh.fsdp) and {process_count} processes; use a "
                    "multiple of both.")
  elif config.grad_accum_steps < 1 or config.batch_size % (config.grad_accum_steps * data * fsdp):
    problems.append(f"batch_size {config.batch_size} is not divisible by grad_accum_steps "
                    f"{config.grad_accum_steps} x the {data * fsdp} batch shards; every "
                    "microbatch needs the same number of rows on each shard.")
  if tensor > 1 and heads and heads % tensor:
    problems.append(f"mesh.tensor {tensor} must divide the {heads} attention heads.")
  return data


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


def _validate_lm(config, problems) -> int:
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


def _check_data_keys(config, problems):
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


def _validate_vision(config, problems) -> int:
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
      problems.append("grad_accum_steps > 1 would change BatchNorm statistics; use 1 for "
                      "ResNets.")
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
