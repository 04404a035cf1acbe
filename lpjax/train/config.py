"""The training configuration: defaults, model sizes, and validation before anything compiles.

Config files in configs/ call `llama_config(...)` and change a few fields; `train.py` overrides
fields from the command line (`--config.optimizer.lr=2e-3`). `validate` checks a config against
the machine and fails with a message that says how to fix it.

Examples:
  >>> c = llama_config("tiny", recipe="mxfp4", optimizer="stable_spam")
  >>> c.model.size, c.quant.recipe, c.optimizer.name, c.optimizer.gamma1
  ('tiny', 'mxfp4', 'stable_spam', 0.7)
  >>> validate(c, device_count=8, process_count=1).mesh.data
  8
  >>> paper_config("1b", recipe="mxfp4", optimizer="stable_spam").optimizer.lr
  0.0002
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections

OPTIMIZERS = ("adamw", "adam", "spam", "stable_spam")
TASKS = ("lm", "classification", "diffusion")
# Vision models by task (lpjax/models/resnet.py, unet.py) and the image data sources.
VISION_MODELS = {
    "classification": ("resnet_tiny", "resnet18", "resnet50"),
    "diffusion": ("unet_tiny", "unet_cifar10"),
}
IMAGE_SOURCES = ("digits", "tfds")
STATE_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class LlamaSize:
  hidden: int  # model width
  intermediate: int  # SwiGLU hidden width
  heads: int  # attention heads (head_dim = hidden / heads)
  layers: int  # transformer blocks


# NUMERICS.md §10 (60m-1b, as in the GaLore / SPAM / Stable-SPAM papers) and smaller CPU sizes.
LLAMA_SIZES = {
    "tiny": LlamaSize(128, 352, 4, 4),
    "9m": LlamaSize(128, 352, 4, 4),
    "20m": LlamaSize(256, 688, 4, 4),
    "35m": LlamaSize(384, 1024, 8, 6),
    "60m": LlamaSize(512, 1376, 8, 8),
    "130m": LlamaSize(768, 2048, 12, 12),
    "350m": LlamaSize(1024, 2736, 16, 24),
    "1b": LlamaSize(2048, 5461, 32, 24),
}

# Paper hyperparameters per optimizer (NUMERICS.md §8-10).
_OPTIMIZER_DEFAULTS = {
    "adamw": dict(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0),
    "adam": dict(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0),
    "spam": dict(lr=1e-3, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0, reset_interval=500),
    "stable_spam": dict(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, gamma1=0.7,
                        gamma2=0.9, gamma3=0.999, reset_interval=1000),
}


def base_config() -> ml_collections.ConfigDict:
  """Every key a training config may have, with its default (one comment per field)."""
  c = ml_collections.ConfigDict()
  c.task = "lm"  # lm (LLaMA) | classification (ResNet) | diffusion (U-Net)
  c.seed = 0  # seeds parameters, data order and stochastic rounding
  c.steps = 1000  # optimizer steps
  c.batch_size = 32  # global batch, in sequences
  c.grad_accum_steps = 1  # microbatches per step (same update, ~1/k of the activation memory)
  c.seq_len = 128  # tokens per sequence
  c.eval_every = 250  # steps between evaluations (0: only at the end)
  c.eval_steps = 8  # batches per evaluation (image tasks: 0 = the whole eval split)
  c.checkpoint_every = 500  # steps between checkpoints (0: only at the end)
  c.keep_checkpoints = 3  # checkpoints kept in the workdir
  c.log_every = 10  # steps between metric lines
  c.progress_bar = True  # tqdm bar with loss, tokens/s and ETA
  c.max_consecutive_skips = 20  # stop (or roll back) after this many non-finite steps in a row
  c.rollback_on_skips = False  # then restart from the last checkpoint in quant.high_precision_recipe
  c.max_rollbacks = 2  # rollbacks allowed before stopping with an error

  c.model = ml_collections.ConfigDict()
  c.model.name = "llama"  # llama | a key of VISION_MODELS (resnet18, resnet50, unet_tiny, ...)
  c.model.size = "tiny"  # llama: a key of LLAMA_SIZES
  c.model.num_classes = 0  # classification: 0 = the dataset's number of classes
  c.model.stem = ""  # resnet: "imagenet" (7x7/2 + max-pool) | "small" (3x3/1); "" = by image size
  c.model.remat = False  # recompute each block's activations in the backward pass
  c.model.scan_layers = True  # scan one block over the layers (fast compiles); off: unrolled
  c.model.vocab_size = 0  # 0: the tokenizer's vocabulary size
  c.model.max_seq_len = 0  # RoPE table length; 0: seq_len
  c.model.param_dtype = "float32"  # master weights
  c.model.compute_dtype = "float32"  # activations (bfloat16 on GPUs)

  c.data = ml_collections.ConfigDict()
  c.data.source = "embedded"  # text: embedded (offline stdlib corpus) | text | tfds; images: digits | tfds
  c.data.path = ""  # text: a file or glob
  c.data.tfds_name = ""  # tfds: e.g. "c4/en" (array_record; tfrecord too with TensorFlow)
  c.data.tfds_data_dir = ""  # tfds: data_dir ("" = TFDS default)
  c.data.text_key = "text"  # tfds: the feature holding the text
  c.data.tfds_reader = "auto"  # tfds text: auto | data_source (array_record) | tf_data (TensorFlow)
  c.data.tokenizer = "byte"  # "byte" or the path of a SentencePiece .model file
  c.data.cache_dir = ""  # tokenized-corpus cache ("" = $LPJAX_CACHE_DIR or ~/.cache/lpjax)
  c.data.prefetch = 4  # batches computed ahead by grain threads
  c.data.image_size = 0  # images: side of the (square) training images; 0 = the dataset's
  c.data.classes = ""  # images: "imagenet100" restricts imagenet2012 to its 100-class list
  c.data.augment = True  # images: the dataset's standard training augmentation
  c.data.seq_len_schedule = ""  # curriculum "64:0.2,128:0.5": seq_len 64 for the first 20% ...

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = "adamw"  # adamw | adam | spam | stable_spam
  c.optimizer.lr = 1e-3  # peak learning rate
  c.optimizer.warmup_steps = 100  # linear warm-up from 0
  c.optimizer.min_lr_ratio = 0.1  # cosine decay to this fraction of lr
  c.optimizer.weight_decay = 0.0  # decoupled weight decay
  c.optimizer.grad_clip = 1.0  # global-norm clipping (0: off)
  c.optimizer.b1 = 0.9
  c.optimizer.b2 = 0.999
  c.optimizer.eps = 1e-8
  c.optimizer.gamma1 = 0.7  # stable_spam AdaGN momentum (BF16 runs: 0.85)
  c.optimizer.gamma2 = 0.9  # stable_spam AdaGN second moment (BF16 runs: 0.99999)
  c.optimizer.gamma3 = 0.999  # stable_spam AdaClip momentum
  c.optimizer.reset_interval = 1000  # stable_spam / spam momentum reset interval
  c.optimizer.state_dtype = "float32"  # optimizer moments: float32 | bfloat16 (stochastic rounding)

  c.quant = ml_collections.ConfigDict()
  c.quant.recipe = "bf16"  # a name of lpjax.quant.recipes.NAMES, or a "<name>:key=value" variant
  c.quant.policy = "default"  # default | pure (quantize embeddings and head too)
  c.quant.keep_first = 0  # first N blocks stay high precision
  c.quant.keep_last = 0  # last N blocks stay high precision
  c.quant.warmup_fraction = 0.0  # high precision for the first fraction of steps
  c.quant.finish_fraction = 0.0  # high precision for the last fraction of steps
  c.quant.fallback_factor = 0.0  # loss > factor x running median: fallback recipe (0: off)
  c.quant.fallback_steps = 100  # steps the fallback lasts
  c.quant.high_precision_recipe = "bf16"  # the recipe of warm-up, finish and fallback
  c.quant.loss_scale = False  # dynamic loss scaling (2^15, x2 / x0.5)
  c.quant.residuals = ""  # "" = the recipe's; "quantized": save FP4-packed operands for backward

  c.diffusion = ml_collections.ConfigDict()
  c.diffusion.schedule = "linear"  # noise schedule: linear (DDPM) | cosine (Nichol & Dhariwal)
  c.diffusion.timesteps = 1000  # diffusion steps T
  c.diffusion.sampler = "ddim"  # samples at each eval: ddim | ddpm
  c.diffusion.sample_steps = 50  # ddim steps (ddpm always uses T)
  c.diffusion.num_samples = 16  # images in the sample grid saved at each eval (0: none)
  c.diffusion.fid_inception_path = ""  # an Inception-v3 .npz checkpoint: FID at each eval
  c.diffusion.fid_num_samples = 1000  # generated images per FID estimate

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1  # data-parallel axis (-1: all devices not used by fsdp / tensor)
  c.mesh.fsdp = 1  # parameter-sharding axis
  c.mesh.tensor = 1  # tensor-parallel axis

  c.distributed = ml_collections.ConfigDict()
  c.distributed.initialize = False  # call jax.distributed.initialize (multi-host)
  c.distributed.coordinator_address = ""  # "" = auto-detect (SLURM, TPU, ...)
  c.distributed.num_processes = 0  # 0 = auto-detect
  c.distributed.process_id = -1  # -1 = auto-detect

  c.debug = ml_collections.ConfigDict()
  c.debug.nan_at_step = -1  # inject a NaN loss at this step (tests of the non-finite path)
  c.debug.nan_only_quantized = False  # ... only while the quantized recipe runs (not in fallback)
  return c


def llama_config(size: str = "tiny", *, recipe: str = "bf16", optimizer: str = "adamw"):
  """A LLaMA config with the paper settings of `optimizer`."""
  c = base_config()
  c.model.size = size
  c.quant.recipe = recipe
  c.optimizer.name = optimizer
  for k, v in _OPTIMIZER_DEFAULTS.get(optimizer, {}).items():
    c.optimizer[k] = v
  return c


# Run settings per model size: the papers' (NUMERICS.md §10; 4-bit runs: 20k steps of 512 x 256
# tokens, warm-up 2000, lr 1e-3 / 4e-4 / 2e-4 for 130M / 350M / 1B) and a CPU-sized tiny run.
@dataclasses.dataclass(frozen=True)
class RunSettings:
  steps: int  # optimizer steps
  batch_size: int  # global batch (sequences)
  seq_len: int  # tokens per sequence
  warmup_steps: int  # linear warm-up
  lr: float  # peak learning rate
  eval_every: int  # steps between evaluations
  eval_steps: int  # batches per evaluation
  checkpoint_every: int  # steps between checkpoints


PAPER_RUNS = {
    "tiny": RunSettings(300, 16, 128, 30, 3e-3, 100, 8, 100),
    "60m": RunSettings(10_000, 512, 256, 1000, 1e-3, 1000, 20, 1000),
    "130m": RunSettings(20_000, 512, 256, 2000, 1e-3, 1000, 20, 1000),
    "350m": RunSettings(20_000, 512, 256, 2000, 4e-4, 1000, 20, 1000),
    "1b": RunSettings(20_000, 512, 256, 2000, 2e-4, 1000, 20, 1000),
}


def paper_config(size: str, *, recipe: str, optimizer: str):
  """`llama_config` with the run settings of PAPER_RUNS; sizes above tiny train on C4 (T5 tokens)."""
  c = llama_config(size, recipe=recipe, optimizer=optimizer)
  run = PAPER_RUNS[size]
  c.steps, c.batch_size, c.seq_len = run.steps, run.batch_size, run.seq_len
  c.optimizer.warmup_steps, c.optimizer.lr = run.warmup_steps, run.lr
  c.eval_every, c.eval_steps, c.checkpoint_every = run.eval_every, run.eval_steps, run.checkpoint_every
  if size != "tiny":
    c.data.source, c.data.tfds_name = "tfds", "c4/en"
    c.data.tokenizer = "spiece.model"  # T5's SentencePiece model: pass its real path
    c.model.compute_dtype = "bfloat16"
  return c


def _flat_keys(c, prefix=""):
  keys = set()
  for k, v in c.items():
    name = f"{prefix}{k}"
    if isinstance(v, ml_collections.ConfigDict):
      keys |= _flat_keys(v, name + ".")
    else:
      keys.add(name)
  return keys


class ConfigError(ValueError):
  """A configuration that cannot run; the message says how to fix it."""


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


def validate(config, device_count: int, process_count: int = 1):
  """Checks `config` and fills derived fields (mesh.data); raises ConfigError with the fix."""
  from lpjax.quant import recipes

  known = _flat_keys(base_config())
  unknown = sorted(_flat_keys(config) - known)
  if unknown:
    raise ConfigError(f"Unknown config key(s): {', '.join(unknown)}. Valid keys are listed in "
                      "lpjax/train/config.py base_config(); check the spelling.")
  _check_types(config)
  if config.task not in TASKS:
    raise ConfigError(f"task {config.task!r} is unknown; valid: {', '.join(TASKS)}.")
  if config.optimizer.name not in OPTIMIZERS:
    raise ConfigError(f"optimizer.name {config.optimizer.name!r} is unknown; valid: {', '.join(OPTIMIZERS)}.")
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
  for name in ("steps", "batch_size", "seq_len", "log_every", "max_consecutive_skips"):
    if config[name] <= 0:
      raise ConfigError(f"{name} must be positive, got {config[name]}.")
  for name in ("eval_every", "eval_steps", "checkpoint_every", "keep_checkpoints", "max_rollbacks"):
    if config[name] < 0:
      raise ConfigError(f"{name} must be >= 0, got {config[name]}.")
  if config.keep_checkpoints < 1:
    raise ConfigError("keep_checkpoints must be >= 1 (the last checkpoint is what a crash resumes from).")
  heads = _validate_task(config)

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
                      f"{data * fsdp * tensor}, but there are {device_count} devices. Set mesh.data=-1 "
                      "to use all remaining devices.")
  if config.batch_size % (data * fsdp) or config.batch_size % process_count:
    raise ConfigError(f"batch_size {config.batch_size} is not divisible by the {data * fsdp} "
                      f"batch shards (mesh.data x mesh.fsdp) and {process_count} processes; use a "
                      "multiple of both.")
  if config.grad_accum_steps < 1 or config.batch_size % (config.grad_accum_steps * data * fsdp):
    raise ConfigError(f"batch_size {config.batch_size} is not divisible by grad_accum_steps "
                      f"{config.grad_accum_steps} x the {data * fsdp} batch shards; every microbatch "
                      "needs the same number of rows on each shard.")
  if tensor > 1 and heads and heads % tensor:
    raise ConfigError(f"mesh.tensor {tensor} must divide the {heads} attention heads.")
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.mesh.data = data
  return config


def _check_types(config, reference=None, prefix=""):
  """Each field has its default's type (an int where a float is expected is fine)."""
  reference = reference if reference is not None else base_config()
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
      raise ConfigError(f"{name} must be a {expected.__name__} (like its default {default!r}), got "
                        f"{value!r} of type {type(value).__name__}.")


def _validate_task(config) -> int:
  """Checks the model and data fields of config.task; returns the attention heads (0: none)."""
  if config.task != "lm":
    return _validate_vision(config)
  if config.model.name != "llama":
    raise ConfigError(f"task 'lm' trains model.name 'llama', got {config.model.name!r}; set "
                      "task='classification' or 'diffusion' for the vision models.")
  if config.model.size not in LLAMA_SIZES:
    raise ConfigError(f"model.size {config.model.size!r} is unknown; valid: {', '.join(LLAMA_SIZES)}.")
  size = LLAMA_SIZES[config.model.size]
  if size.hidden % size.heads:
    raise ConfigError("model hidden size must be divisible by the number of heads.")
  if config.model.max_seq_len and config.seq_len > config.model.max_seq_len:
    raise ConfigError(f"seq_len {config.seq_len} exceeds model.max_seq_len {config.model.max_seq_len}; "
                      "lower seq_len or raise model.max_seq_len.")
  for length, _ in _parse_schedule(config.data.seq_len_schedule):
    if not 0 < length <= config.seq_len:
      raise ConfigError(f"data.seq_len_schedule length {length} must be in (0, seq_len={config.seq_len}].")
  tok = config.data.tokenizer
  if tok not in ("byte", "bytes") and not os.path.isfile(tok):
    raise ConfigError(f"data.tokenizer {tok!r} is neither 'byte' nor an existing SentencePiece "
                      ".model file; give the path of the model file (e.g. T5's spiece.model).")
  if config.data.source == "text" and not config.data.path:
    raise ConfigError("data.source='text' needs data.path (a file or a glob).")
  if config.data.source == "tfds" and not config.data.tfds_name:
    raise ConfigError("data.source='tfds' needs data.tfds_name, e.g. 'c4/en'.")
  if config.data.source not in ("embedded", "text", "tfds"):
    raise ConfigError(f"data.source {config.data.source!r} is unknown; valid: embedded, text, tfds.")
  if config.data.tfds_reader not in ("auto", "data_source", "tf_data"):
    raise ConfigError(f"data.tfds_reader {config.data.tfds_reader!r} is unknown; valid: auto, "
                      "data_source (array_record), tf_data (needs TensorFlow).")
  return size.heads


def _validate_vision(config) -> int:
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
    raise ConfigError(f"data.classes {config.data.classes!r} is unknown; valid: '' or 'imagenet100'.")
  if config.data.image_size < 0:
    raise ConfigError(f"data.image_size must be >= 0, got {config.data.image_size}.")
  if config.model.stem not in ("", "imagenet", "small"):
    raise ConfigError("model.stem must be '', 'imagenet' or 'small'.")
  if config.grad_accum_steps != 1 and config.model.name.startswith("resnet"):
    raise ConfigError("grad_accum_steps > 1 would change BatchNorm statistics; use 1 for ResNets.")
  d = config.diffusion
  if d.schedule not in ("linear", "cosine"):
    raise ConfigError(f"diffusion.schedule {d.schedule!r} is unknown; valid: linear, cosine.")
  if d.sampler not in ("ddim", "ddpm"):
    raise ConfigError(f"diffusion.sampler {d.sampler!r} is unknown; valid: ddim, ddpm.")
  if d.timesteps < 2 or not 0 < d.sample_steps <= d.timesteps:
    raise ConfigError("diffusion.timesteps must be >= 2 and 0 < diffusion.sample_steps <= timesteps.")
  if d.fid_inception_path and not os.path.isfile(d.fid_inception_path):
    raise ConfigError(f"diffusion.fid_inception_path {d.fid_inception_path!r} does not exist; give "
                      "the path of an Inception-v3 .npz checkpoint (see lpjax/models/fid.py) or ''.")
  return 0


def seq_len_at(config, step: int) -> int:
  """The curriculum's sequence length at `step` (config.seq_len when there is no schedule)."""
  for length, fraction in _parse_schedule(config.data.seq_len_schedule):
    if step < fraction * config.steps:
      return length
  return config.seq_len
