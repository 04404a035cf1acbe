"""The config schema: every key of each task's configs, with its default and meaning.

`lpjax.train.config` is the public import path of everything here. The keys common to all tasks
(steps, batch, optimizer, quant, mesh, ...) are in every config; the `lm` keys (seq_len, the text
data and LLaMA model keys), the image keys (data.image_size, data.classes, ...) and the
`diffusion` section are only in the configs of the tasks they apply to.

Examples:
  >>> c = base_config("diffusion", optimizer="stable_spam")
  >>> c.diffusion.timesteps, c.optimizer.gamma1, "seq_len" in c, "diffusion" in base_config()
  (1000, 0.7, False, False)
  >>> sorted(task_keys("lm") - task_keys("classification"))[:3]
  ['data.encoding', 'data.encoding_errors', 'data.path']
"""

from __future__ import annotations

import functools

import ml_collections

OPTIMIZERS = ("adamw", "adam", "spam", "stable_spam")
TASKS = ("lm", "classification", "diffusion")
# Vision models by task (lpjax/models/resnet.py, unet.py) and the data sources of each kind.
VISION_MODELS = {
    "classification": ("resnet_tiny", "resnet18", "resnet50"),
    "diffusion": ("unet_tiny", "unet_cifar10"),
}
TEXT_SOURCES = ("embedded", "text", "tfds")
IMAGE_SOURCES = ("digits", "tfds")
STATE_DTYPES = ("float32", "bfloat16")
PARAM_ROUNDINGS = ("stochastic", "nearest")  # how bfloat16 master weights take their updates
GRAD_ACCUM_DTYPES = ("float32", "bfloat16")  # accumulators of the microbatch gradients
RESUME_CHOICES = ("auto", "restart", "params")

# The papers' hyperparameters per optimizer (docs/numerics.md §8-10). The learning rate, warm-up
# and schedule are not here: each config file sets them.
_OPTIMIZER_DEFAULTS = {
    "adamw": dict(b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0),
    "adam": dict(b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0),
    "spam": dict(b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0, reset_interval=500),
    "stable_spam": dict(b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, gamma1=0.7, gamma2=0.9,
                        gamma3=0.999, reset_interval=1000),
}


class ConfigError(ValueError):
  """A configuration that cannot run; the message says how to fix it."""


def optimizer_defaults(name: str) -> dict:
  """The paper hyperparameters of optimizer `name` (b1, b2, eps, weight decay, gammas, reset).

  Examples:
    >>> optimizer_defaults("spam")
    {'b1': 0.9, 'b2': 0.999, 'eps': 1e-06, 'weight_decay': 0.0, 'reset_interval': 500}
  """
  if name not in _OPTIMIZER_DEFAULTS:
    raise ConfigError(f"optimizer {name!r} is unknown; valid: {', '.join(OPTIMIZERS)}.")
  return dict(_OPTIMIZER_DEFAULTS[name])


def base_config(task: str = "lm", optimizer: str = "adamw") -> ml_collections.ConfigDict:
  """Every key of a `task` config, with its default (one comment per field).

  The optimizer section holds `optimizer`'s paper hyperparameters (`optimizer_defaults`); an
  unknown optimizer name is kept for `validate` to reject.

  Examples:
    >>> c = base_config("classification", optimizer="adam")
    >>> c.task, c.model.name, c.data.source, c.optimizer.name, "seq_len" in c, "diffusion" in c
    ('classification', 'resnet_tiny', 'digits', 'adam', False, False)
  """
  if task not in TASKS:
    raise ConfigError(f"task {task!r} is unknown; valid: {', '.join(TASKS)}.")
  lm, images = task == "lm", task != "lm"
  c = ml_collections.ConfigDict()
  c.task = task  # lm (LLaMA) | classification (ResNet) | diffusion (U-Net)
  c.seed = 0  # seeds parameters, data order and stochastic rounding
  c.steps = 1000  # optimizer steps
  c.batch_size = 32  # global batch, in sequences (lm) or images
  c.grad_accum_steps = 1  # microbatches per step (same update, ~1/k of the activation memory)
  c.grad_accum_dtype = "float32"  # their gradients' sum: float32 | bfloat16 (stochastic rounding)
  if lm:
    c.seq_len = 128  # tokens per sequence
  c.eval_every = 250  # steps between evaluations (0: only at the end)
  c.eval_steps = 8 if lm else 0  # batches per evaluation (0: the whole eval split; images only)
  c.checkpoint_every = 500  # steps between checkpoints (0: only at the end)
  c.keep_checkpoints = 3  # checkpoints kept in the workdir
  # When the workdir's checkpoints have other state shapes than this config (another model size
  # or optimizer): auto = stop with an error naming the differing keys; restart = archive the old
  # run under <workdir>/archive/ and start afresh; params = archive it and start from its parameters
  # with a fresh optimizer. Matching checkpoints always resume.
  c.resume = "auto"
  c.log_every = 10  # steps between metric lines
  c.progress_bar = True  # tqdm bar with loss, throughput and ETA
  c.max_consecutive_skips = 20  # stop (or roll back) after this many non-finite steps in a row
  c.rollback_on_skips = False  # then resume from the last checkpoint in quant.high_precision_recipe
  c.max_rollbacks = 2  # rollbacks allowed before stopping with an error

  c.model = ml_collections.ConfigDict()
  # lm: llama; classification / diffusion: a model of VISION_MODELS[task]
  c.model.name = "llama" if lm else VISION_MODELS[task][0]
  if lm:
    c.model.size = "tiny"  # a key of LLAMA_SIZES (lpjax/models/llama_sizes.py)
    c.model.vocab_size = 0  # 0: the tokenizer's vocabulary size
    c.model.max_seq_len = 0  # RoPE table length; 0: seq_len
    c.model.num_kv_heads = 0  # k / v heads (grouped-query attention; divides the heads); 0: heads
    c.model.tie_embeddings = False  # the LM head is the embedding table (no lm_head weight)
    c.model.scan_layers = True  # scan one block over the layers (fast compiles); off: unrolled
    c.model.remat = False  # recompute each block's activations in the backward pass
    c.model.vocab_chunks = 0  # LM head + loss over this many vocabulary slices (0/1: all at once)
    # "hf:PATH": start from a Hugging Face LLaMA checkpoint directory (config.json + safetensors;
    # its sizes replace model.size); with model.factory, model.init_converter maps its tensors
    c.model.init_from = ""
    # "package.module:function(tensors, params) -> params": a model.factory model's params from
    # the init_from checkpoint's {name: numpy array} (lpjax's LLaMA needs none)
    c.model.init_converter = ""
  if task == "classification":
    c.model.num_classes = 0  # 0: the dataset's number of classes
    c.model.stem = ""  # "imagenet" (7x7/2 + max-pool) | "small" (3x3/1); "": by image size
  if task in ("lm", "classification"):
    # "package.module:function" returning your own Flax (NNX or linen) model, used instead of
    # model.name; its GEMMs are quantized by interception (lpjax/train/model/_user_model.py)
    c.model.factory = ""
  c.model.param_dtype = "float32"  # master weights
  c.model.compute_dtype = "float32"  # activations (bfloat16 on GPUs)

  c.data = ml_collections.ConfigDict()
  # lm: embedded (offline stdlib corpus) | text | tfds; images: digits (offline) | tfds
  c.data.source = "embedded" if lm else "digits"
  if lm:
    c.data.path = ""  # source=text: a file or glob
    c.data.encoding = "utf-8"  # source=text: the files' encoding (a byte it cannot decode: error)
    c.data.encoding_errors = "strict"  # source=text: strict | replace | ignore (bytes.decode's)
  c.data.tfds_name = ""  # source=tfds: e.g. "c4/en", "cifar10", "imagenet2012"
  c.data.tfds_data_dir = ""  # source=tfds: data_dir ("" = TFDS default)
  if lm:
    c.data.text_key = "text"  # source=tfds: the feature holding the text
    c.data.tfds_reader = "auto"  # auto | data_source (array_record) | tf_data (TensorFlow)
    c.data.tokenizer = "byte"  # "byte" or the path of a SentencePiece .model file
    c.data.seq_len_schedule = ""  # curriculum "64:0.2,128:0.5": seq_len 64 for the first 20% ...
  if images:
    c.data.image_size = 0  # side of the (square) training images; 0 = the dataset's
    c.data.classes = ""  # "imagenet100" restricts imagenet2012 to its 100-class list
    c.data.augment = True  # the dataset's standard training augmentation
  c.data.cache_dir = ""  # prepared-data cache ("" = $LPJAX_CACHE_DIR or ~/.cache/lpjax)
  c.data.prefetch = 4  # batches computed ahead by grain threads

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = optimizer  # adamw | adam | spam | stable_spam
  c.optimizer.lr = 1e-3  # peak learning rate
  c.optimizer.warmup_steps = 100  # linear warm-up from 0
  c.optimizer.min_lr_ratio = 0.1  # then cosine decay to this fraction of lr
  c.optimizer.weight_decay = 0.0  # decoupled weight decay, of matrices only (every optimizer)
  c.optimizer.grad_clip = 1.0  # global-norm clipping (0: off)
  c.optimizer.b1 = 0.9  # first-moment decay
  c.optimizer.b2 = 0.999  # second-moment decay
  c.optimizer.eps = 1e-8  # added to the root of the second moment
  c.optimizer.gamma1 = 0.7  # stable_spam AdaGN momentum (BF16 runs: 0.85)
  c.optimizer.gamma2 = 0.9  # stable_spam AdaGN second moment (BF16 runs: 0.99999)
  c.optimizer.gamma3 = 0.999  # stable_spam AdaClip momentum
  c.optimizer.reset_interval = 1000  # stable_spam / spam momentum reset interval
  c.optimizer.total_steps = 0  # stable_spam total_T, b1/gamma1 cosine (0: off; -1: the run's steps)
  c.optimizer.eta_min = 0.5  # stable_spam: the smallest factor of that cosine (total_steps != 0)
  c.optimizer.state_dtype = "float32"  # optimizer moments: float32 | bfloat16 (stochastic rounding)
  c.optimizer.param_rounding = "stochastic"  # updates of bfloat16 params (model.param_dtype)
  c.optimizer.update(_OPTIMIZER_DEFAULTS.get(optimizer, {}))

  c.quant = ml_collections.ConfigDict()
  c.quant.recipe = "bf16"  # a name of lpjax.quant.recipes.NAMES, or a "<name>:key=value" variant
  c.quant.policy = "default"  # default | pure (quantize embeddings and head too)
  c.quant.keep_first = 0  # first N blocks stay high precision
  c.quant.keep_last = 0  # last N blocks stay high precision
  c.quant.keep_last_fraction = 0.0  # or the last fraction of blocks (NVIDIA NVFP4 recipe: 0.15)
  c.quant.rules = ""  # per-path recipes "REGEX->RECIPE;...", first match wins, after the keeps
  c.quant.warmup_fraction = 0.0  # high precision for the first fraction of steps
  c.quant.finish_fraction = 0.0  # high precision for the last fraction of steps
  c.quant.qaf_fraction = 0.0  # before the finish: FP4 forward, high-precision backward ("QAF")
  c.quant.fallback_factor = 0.0  # loss > factor x running median: fallback recipe (0: off)
  c.quant.fallback_steps = 100  # steps the fallback lasts
  c.quant.high_precision_recipe = "bf16"  # the recipe of warm-up, finish and fallback
  c.quant.loss_scale = False  # dynamic loss scaling (2^15, x2 / x0.5)
  c.quant.residuals = ""  # "" = the recipe's; "quantized": save FP4-packed operands for backward
  c.quant.gather_quantized_weights = True  # FSDP gathers weights as FP4 codes + scales (same bits)

  # Per-site FP4 numerics while training (docs/numerics_monitor.md, "In training"): every
  # `every` steps one extra jitted forward and backward pass on that step's batch measures each
  # quantized GEMM site; the train step itself is unchanged. Thresholds: an alert (and, with
  # fallback, a strike) when a site's statistic crosses one.
  c.monitor = ml_collections.ConfigDict()
  c.monitor.every = 0  # steps between measurements (0: off); writes <workdir>/monitor.jsonl
  # wgrad ||dW|| / ||dW_q - dW|| below this: the FP4 gradient is mostly noise (sqrt(3), "FP4 All
  # the Way", Chmiel et al. 2025, arXiv 2505.19115)
  c.monitor.min_grad_noise_ratio = 1.732
  # a pass's product SNR below this (dB): FP4 gives 12-16; 6 dB: an error of half the amplitude
  c.monitor.min_out_snr_db = 6.0
  # fraction of an operand clipped at the format's max above this (OCP floor scales clip ~1-3%)
  c.monitor.max_saturated = 0.1
  # fraction of an operand's non-zeros flushed to zero above this (FP4 on Gaussian data: ~10%)
  c.monitor.max_flushed = 0.5
  # fraction of an operand's blocks whose scale was clamped above this (should be 0)
  c.monitor.max_clamped_scales = 0.01
  c.monitor.fallback = False  # a site failing fallback_after measurements in a row falls back
  c.monitor.fallback_recipe = "bf16"  # the recipe of a fallen-back pass (mxfp8: still fast)
  c.monitor.fallback_after = 3  # consecutive failing measurements before a pass falls back
  c.monitor.max_fallback_sites = 8  # at most this many (site, pass) switches: bounded recompiles

  if task == "diffusion":
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
  # a regex of policy paths whose forward the monitor reports as failing (tests of monitor.fallback)
  c.debug.monitor_fail_path = ""
  return c


# The data.* keys each source reads (lpjax.data.make_dataset / make_image_dataset); a key another
# source reads, set to other than its default, is a config error (it would be ignored).
DATA_KEYS_BY_SOURCE = {
    "lm": {
        "embedded": ("tokenizer", "seq_len_schedule", "cache_dir", "prefetch"),
        "text": ("path", "encoding", "encoding_errors", "tokenizer", "seq_len_schedule",
                 "cache_dir", "prefetch"),
        "tfds": ("tfds_name", "tfds_data_dir", "text_key", "tfds_reader", "tokenizer",
                 "seq_len_schedule", "prefetch"),
    },
    "images": {
        "digits": ("image_size", "augment", "prefetch"),
        "tfds": ("tfds_name", "tfds_data_dir", "image_size", "classes", "augment", "cache_dir",
                 "prefetch"),
    },
}


def flat_keys(c, prefix: str = "") -> set[str]:
  """The dotted names of the leaves of a ConfigDict ("optimizer.lr", ...)."""
  keys = set()
  for k, v in c.items():
    name = f"{prefix}{k}"
    if isinstance(v, ml_collections.ConfigDict):
      keys |= flat_keys(v, name + ".")
    else:
      keys.add(name)
  return keys


@functools.lru_cache(maxsize=None)
def task_keys(task: str) -> frozenset[str]:
  """The dotted keys of a `task` config."""
  return frozenset(flat_keys(base_config(task)))


def tasks_of(key: str) -> tuple[str, ...]:
  """The tasks whose configs have `key` (empty for an unknown key).

  Examples:
    >>> tasks_of("data.image_size"), tasks_of("seq_len"), tasks_of("optimizer.lrr")
    (('classification', 'diffusion'), ('lm',), ())
  """
  return tuple(t for t in TASKS if key in task_keys(t))
