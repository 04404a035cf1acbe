"""Run settings of the ResNet and U-Net configs and `vision_config`, the builder configs/ use.

Examples:
  >>> c = vision_config("unet_tiny")
  >>> c.task, c.model.name, c.quant.recipe, c.optimizer.name, c.data.source
  ('diffusion', 'unet_tiny', 'mxfp4_e4m3scale', 'stable_spam', 'digits')
"""

from __future__ import annotations

import dataclasses

from lpjax.train.config import llama_config


@dataclasses.dataclass(frozen=True)
class VisionRun:
  task: str  # classification | diffusion
  source: str  # data.source
  tfds_name: str  # data.tfds_name
  classes: str  # data.classes
  image_size: int  # data.image_size (0: native)
  steps: int  # optimizer steps
  batch_size: int  # global batch (images)
  lr: float  # peak learning rate
  warmup_steps: int  # linear warm-up
  eval_every: int  # steps between evaluations
  checkpoint_every: int  # steps between checkpoints
  compute_dtype: str  # activations


# Recommended recipes (issue: classification = E8M0-scaled MXFP4 + Adam + stochastic rounding +
# loss scaling; diffusion = E4M3-scaled FP4 + Stable-SPAM + clipping + full-precision validation).
VISION_DEFAULTS = {
    "classification": dict(recipe="mxfp4", optimizer="adam", loss_scale=True),
    "diffusion": dict(recipe="mxfp4_e4m3scale", optimizer="stable_spam", loss_scale=False),
}
VISION_RUNS = {
    "resnet_tiny": VisionRun("classification", "digits", "", "", 0, 600, 64, 3e-3, 50, 200, 300,
                             "float32"),
    # ImageNet-100: ~126k training images, 100 epochs at batch 256.
    "resnet50": VisionRun("classification", "tfds", "imagenet2012", "imagenet100", 224, 50_000, 256,
                          1e-3, 2500, 2500, 2500, "bfloat16"),
    "resnet18": VisionRun("classification", "tfds", "imagenet2012", "imagenet100", 224, 50_000, 256,
                          1e-3, 2500, 2500, 2500, "bfloat16"),
    "unet_tiny": VisionRun("diffusion", "digits", "", "", 0, 1500, 64, 2e-3, 100, 500, 500, "float32"),
    # DDPM CIFAR-10 (Ho et al. 2020: batch 128, lr 2e-4, warm-up 5000, clipping 1.0; 800k steps).
    "unet_cifar10": VisionRun("diffusion", "tfds", "cifar10", "", 0, 200_000, 128, 2e-4, 5000, 10_000,
                              10_000, "bfloat16"),
}


def vision_config(model: str, *, recipe: str | None = None, optimizer: str | None = None):
  """A ResNet / U-Net config (VISION_RUNS) with its task's recommended recipe and optimizer."""
  run = VISION_RUNS[model]
  defaults = VISION_DEFAULTS[run.task]
  c = llama_config(recipe=recipe or defaults["recipe"], optimizer=optimizer or defaults["optimizer"])
  c.task, c.model.name = run.task, model
  c.data.source, c.data.tfds_name, c.data.classes = run.source, run.tfds_name, run.classes
  c.data.image_size = run.image_size
  c.steps, c.batch_size, c.seq_len = run.steps, run.batch_size, 1
  c.optimizer.lr, c.optimizer.warmup_steps = run.lr, run.warmup_steps
  c.eval_every, c.eval_steps, c.checkpoint_every = run.eval_every, 0, run.checkpoint_every
  c.model.compute_dtype = run.compute_dtype
  c.quant.loss_scale = defaults["loss_scale"] and c.quant.recipe not in ("fp32", "bf16")
  if run.task == "diffusion":
    c.diffusion.num_samples = 16 if run.source == "digits" else 64
    if run.source == "digits":
      c.diffusion.sample_steps = 50
  return c
