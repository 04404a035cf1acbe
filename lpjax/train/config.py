"""The training configuration: the schema, model sizes, and validation before anything compiles.

A config file in configs/ starts from `base_config(task, optimizer=...)` (every key of `task`
with its default; the optimizer section holds that optimizer's paper hyperparameters) and then
assigns its run's values by name: steps, batch, sequence length, learning rate, warm-up,
schedule, recipe, data. `train.py` overrides fields from the command line
(`--config.optimizer.lr=2e-3`). `validate` checks a config against its task's keys and against
the machine, and fails with a message that says how to fix it.

Examples:
  >>> c = llama_config("tiny", recipe="mxfp4", optimizer="stable_spam")
  >>> c.model.size, c.quant.recipe, c.optimizer.name, c.optimizer.gamma1
  ('tiny', 'mxfp4', 'stable_spam', 0.7)
  >>> validate(c, device_count=8, process_count=1).mesh.data
  8
  >>> with c.unlocked():
  ...   c.diffusion = {"timesteps": 50}
  >>> try:
  ...   validate(c, device_count=8)
  ... except ConfigError as e:
  ...   print(str(e).split(";")[0])
  diffusion.timesteps applies to task 'diffusion' only
"""

from __future__ import annotations

import os

import ml_collections

from lpjax.models.llama_sizes import LLAMA_SIZES
from lpjax.train._config_schema import (IMAGE_SOURCES, OPTIMIZERS, STATE_DTYPES, TASKS,
                                        TEXT_SOURCES, VISION_MODELS, ConfigError, base_config,
                                        flat_keys, optimizer_defaults, task_keys, tasks_of)

__all__ = ["IMAGE_SOURCES", "LLAMA_SIZES", "OPTIMIZERS", "STATE_DTYPES", "TASKS", "TEXT_SOURCES",
           "VISION_MODELS", "ConfigError", "base_config", "flat_keys", "llama_config",
           "optimizer_defaults", "seq_len_at", "task_keys", "validate"]


def llama_config(size: str = "tiny", *, recipe: str = "bf16", optimizer: str = "adamw"):
  """An lm config of LLaMA `size` with GEMM recipe `recipe` and `optimizer`'s paper settings.

  The other keys keep their `base_config("lm")` defaults (a short CPU run on the offline corpus).

  Examples:
    >>> c = llama_config("60m", recipe="nvfp4", optimizer="spam")
    >>> c.task, c.model.size, c.quant.recipe, c.optimizer.name, c.optimizer.reset_interval
    ('lm', '60m', 'nvfp4', 'spam', 500)
  """
  c = base_config("lm", optimizer=optimizer)
  c.model.size = size
  c.quant.recipe = recipe
  return c


def _parse_schedule(text: str):
  points = []
  for part in filter(None, (p.strip() for p in text.split(","))):
    try:
      length, fraction = part.split(":")
      points.append((int(length), float(fraction)))
    except ValueError as e:
      raise ConfigError(f"data.seq_len_schedule entry {part!r} is not 'seq_len:fraction', e.g. "
                        "'64:0.2,128:0.5'.") from e
  return points


def _owners(key: str) -> str:
  tasks = tasks_of(key)
  names = " and ".join(repr(t) for t in tasks)
  return f"task{'s' if len(tasks) > 1 else ''} {names}"


def _check_keys(config):
  """Every key belongs to the schema of config.task; unknown and other tasks' keys are named."""
  keys = flat_keys(config)
  unknown = sorted(k for k in keys if not tasks_of(k))
  if unknown:
    raise ConfigError(f"Unknown config key(s): {', '.join(unknown)}. Valid keys are listed in "
                      "lpjax/train/_config_schema.py base_config(); check the spelling.")
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


def validate(config, device_count: int, process_count: int = 1):
  """Checks `config` and fills derived fields (mesh.data); raises ConfigError with the fix."""
  from lpjax.quant import recipes

  _check_keys(config)
  _check_types(config, base_config(config.task))
  if config.optimizer.name not in OPTIMIZERS:
    raise ConfigError(f"optimizer.name {config.optimizer.name!r} is unknown; valid: "
                      f"{', '.join(OPTIMIZERS)}.")
  if config.optimizer.state_dtype not in STATE_DTYPES:
    raise ConfigError(f"optimizer.state_dtype must be one of {', '.join(STATE_DTYPES)}.")
  for field in ("recipe", "high_precision_recipe"):
    value = config.quant[field]
    try:
      recipes.get(value)
    except (ValueError, TypeError) as e:
      if isinstance(value, str) and ":" in value:  # a variant: the spec parser names the problem
        raise ConfigError(f"quant.{field}: {e} (grammar '<preset>:key=value,...', see "
                          "lpjax/quant/recipe_spec.py).") from e
      raise ConfigError(f"quant.{field} {value!r} is unknown; valid: {', '.join(recipes.NAMES)}, "
                        "or a variant '<preset>:key=value,...' such as 'mxfp4:block_size=16' "
                        "(lpjax/quant/recipe_spec.py).") from e
  if config.quant.residuals not in ("", "high_precision", "quantized"):
    raise ConfigError("quant.residuals must be '', 'high_precision' or 'quantized'.")
  if config.quant.policy not in ("default", "pure"):
    raise ConfigError("quant.policy must be 'default' or 'pure'.")
  for name in ("steps", "batch_size", "log_every", "max_consecutive_skips"):
    if config[name] <= 0:
      raise ConfigError(f"{name} must be positive, got {config[name]}.")
  for name in ("eval_every", "eval_steps", "checkpoint_every", "keep_checkpoints", "max_rollbacks"):
    if config[name] < 0:
      raise ConfigError(f"{name} must be >= 0, got {config[name]}.")
  if config.keep_checkpoints < 1:
    raise ConfigError("keep_checkpoints must be >= 1 (the last checkpoint is what a crash "
                      "resumes from).")
  heads = _validate_lm(config) if config.task == "lm" else _validate_vision(config)

  fsdp, tensor, data = config.mesh.fsdp, config.mesh.tensor, config.mesh.data
  if fsdp < 1 or tensor < 1:
    raise ConfigError("mesh.fsdp and mesh.tensor must be >= 1.")
  if data == -1:
    if device_count % (fsdp * tensor):
      raise ConfigError(f"mesh.fsdp * mesh.tensor = {fsdp * tensor} does not divide the "
                        f"{device_count} devices.")
    data = device_count // (fsdp * tensor)
  if data * fsdp * tensor != device_count:
    raise ConfigError(f"Impossible mesh: data {data} x fsdp {fsdp} x tensor {tensor} = "
                      f"{data * fsdp * tensor}, but there are {device_count} devices. Set "
                      "mesh.data=-1 to use all remaining devices.")
  if config.batch_size % (data * fsdp) or config.batch_size % process_count:
    raise ConfigError(f"batch_size {config.batch_size} is not divisible by the {data * fsdp} "
                      f"batch shards (mesh.data x mesh.fsdp) and {process_count} processes; use a "
                      "multiple of both.")
  if config.grad_accum_steps < 1 or config.batch_size % (config.grad_accum_steps * data * fsdp):
    raise ConfigError(f"batch_size {config.batch_size} is not divisible by grad_accum_steps "
                      f"{config.grad_accum_steps} x the {data * fsdp} batch shards; every "
                      "microbatch needs the same number of rows on each shard.")
  if tensor > 1 and heads and heads % tensor:
    raise ConfigError(f"mesh.tensor {tensor} must divide the {heads} attention heads.")
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.mesh.data = data
  return config


def _check_types(config, reference, prefix=""):
  """Each field has its default's type (an int where a float is expected is fine)."""
  for key, default in reference.items():
    value, name = config[key], prefix + key
    if isinstance(default, ml_collections.ConfigDict):
      if not isinstance(value, ml_collections.ConfigDict):
        raise ConfigError(f"{name} must be a section (ConfigDict), got {type(value).__name__}.")
      _check_types(value, default, name + ".")
      continue
    expected = type(default)
    ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
    ok = ok or (expected is float and isinstance(value, int) and not isinstance(value, bool))
    if not ok:
      raise ConfigError(f"{name} must be a {expected.__name__} (like its default {default!r}), "
                        f"got {value!r} of type {type(value).__name__}.")


def _validate_lm(config) -> int:
  """Checks the model and data fields of an lm config; returns the attention heads."""
  if config.model.name != "llama":
    raise ConfigError(f"task 'lm' trains model.name 'llama', got {config.model.name!r}; set "
                      "task='classification' or 'diffusion' for the vision models.")
  if config.model.size not in LLAMA_SIZES:
    raise ConfigError(f"model.size {config.model.size!r} is unknown; valid: "
                      f"{', '.join(LLAMA_SIZES)}.")
  size = LLAMA_SIZES[config.model.size]
  if size.hidden % size.heads:
    raise ConfigError("model hidden size must be divisible by the number of heads.")
  if config.seq_len <= 0:
    raise ConfigError(f"seq_len must be positive, got {config.seq_len}.")
  if config.model.max_seq_len and config.seq_len > config.model.max_seq_len:
    raise ConfigError(f"seq_len {config.seq_len} exceeds model.max_seq_len "
                      f"{config.model.max_seq_len}; lower seq_len or raise model.max_seq_len.")
  for length, _ in _parse_schedule(config.data.seq_len_schedule):
    if not 0 < length <= config.seq_len:
      raise ConfigError(f"data.seq_len_schedule length {length} must be in "
                        f"(0, seq_len={config.seq_len}].")
  tok = config.data.tokenizer
  if tok not in ("byte", "bytes") and not os.path.isfile(tok):
    raise ConfigError(f"data.tokenizer {tok!r} is neither 'byte' nor an existing SentencePiece "
                      ".model file; give the path of the model file (e.g. T5's spiece.model).")
  if config.data.source == "text" and not config.data.path:
    raise ConfigError("data.source='text' needs data.path (a file or a glob).")
  if config.data.source == "tfds" and not config.data.tfds_name:
    raise ConfigError("data.source='tfds' needs data.tfds_name, e.g. 'c4/en'.")
  if config.data.source not in TEXT_SOURCES:
    raise ConfigError(f"data.source {config.data.source!r} is unknown; valid: "
                      f"{', '.join(TEXT_SOURCES)}.")
  if config.data.tfds_reader not in ("auto", "data_source", "tf_data"):
    raise ConfigError(f"data.tfds_reader {config.data.tfds_reader!r} is unknown; valid: auto, "
                      "data_source (array_record), tf_data (needs TensorFlow).")
  return size.heads


def _validate_vision(config) -> int:
  """Checks the model, data and diffusion fields of an image config; returns 0 (no heads)."""
  models = VISION_MODELS[config.task]
  if config.model.name not in models:
    raise ConfigError(f"model.name {config.model.name!r} is not a {config.task} model; valid: "
                      f"{', '.join(models)}.")
  if config.data.source not in IMAGE_SOURCES:
    raise ConfigError(f"data.source {config.data.source!r} is not an image source; valid: "
                      f"{', '.join(IMAGE_SOURCES)} (digits needs no download).")
  if config.data.source == "tfds" and not config.data.tfds_name:
    raise ConfigError("data.source='tfds' needs data.tfds_name, e.g. 'cifar10' or 'imagenet2012'.")
  if config.data.classes not in ("", "imagenet100"):
    raise ConfigError(f"data.classes {config.data.classes!r} is unknown; valid: '' or "
                      "'imagenet100'.")
  if config.data.image_size < 0:
    raise ConfigError(f"data.image_size must be >= 0, got {config.data.image_size}.")
  if config.task == "classification":
    if config.model.stem not in ("", "imagenet", "small"):
      raise ConfigError("model.stem must be '', 'imagenet' or 'small'.")
    if config.grad_accum_steps != 1:
      raise ConfigError("grad_accum_steps > 1 would change BatchNorm statistics; use 1 for "
                        "ResNets.")
    return 0
  d = config.diffusion
  if d.schedule not in ("linear", "cosine"):
    raise ConfigError(f"diffusion.schedule {d.schedule!r} is unknown; valid: linear, cosine.")
  if d.sampler not in ("ddim", "ddpm"):
    raise ConfigError(f"diffusion.sampler {d.sampler!r} is unknown; valid: ddim, ddpm.")
  if d.timesteps < 2 or not 0 < d.sample_steps <= d.timesteps:
    raise ConfigError("diffusion.timesteps must be >= 2 and 0 < diffusion.sample_steps <= "
                      "timesteps.")
  if d.fid_inception_path and not os.path.isfile(d.fid_inception_path):
    raise ConfigError(f"diffusion.fid_inception_path {d.fid_inception_path!r} does not exist; "
                      "give the path of an Inception-v3 .npz checkpoint (the weights "
                      "lpjax.eval.load_inception reads; see lpjax/eval/_inception.py) or ''.")
  return 0


def seq_len_at(config, step: int) -> int:
  """The curriculum's sequence length at `step` (config.seq_len when there is no schedule).

  Examples:
    >>> c = llama_config("tiny")
    >>> c.steps, c.data.seq_len_schedule = 100, "32:0.25,64:0.5"
    >>> [seq_len_at(c, s) for s in (0, 25, 50, 99)]
    [32, 64, 128, 128]
  """
  for length, fraction in _parse_schedule(config.data.seq_len_schedule):
    if step < fraction * config.steps:
      return length
  return config.seq_len
