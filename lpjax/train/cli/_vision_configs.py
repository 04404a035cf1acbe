"""`vision_config`: a ResNet / U-Net config with its task's recommended recipe and optimizer.

The ResNet and U-Net experiments are config files (configs/resnet*.py, configs/unet*.py) that
state their steps, batch, learning rate and data; this helper gives the starting point of a quick
experiment or a doctest: `base_config(task)` (the offline digits, a short run) with the model and
the recommended recipe.

Examples:
  >>> c = vision_config("unet_tiny")
  >>> c.task, c.model.name, c.quant.recipe, c.optimizer.name, c.data.source
  ('diffusion', 'unet_tiny', 'mxfp4_e4m3scale', 'stable_spam', 'digits')
  >>> c = vision_config("resnet_tiny")
  >>> c.quant.recipe, c.optimizer.name, c.quant.loss_scale, "diffusion" in c
  ('mxfp4', 'adam', True, False)
"""

from __future__ import annotations

from lpjax.train.config import VISION_MODELS, ConfigError, base_config

# The recommended recipe of each task: classification = E8M0-scaled MXFP4 + Adam + stochastic
# rounding + loss scaling; diffusion = E4M3-scaled FP4 + Stable-SPAM + clipping + full-precision
# validation.
RECOMMENDED = {
    "classification": dict(recipe="mxfp4", optimizer="adam", loss_scale=True),
    "diffusion": dict(recipe="mxfp4_e4m3scale", optimizer="stable_spam", loss_scale=False),
}


def vision_config(model: str, *, recipe: str | None = None, optimizer: str | None = None):
  """`base_config` of `model`'s task with `model` and the task's recommended recipe / optimizer.

  Loss scaling follows the task's recommendation, except for fp32 / bf16 GEMMs (never needed).
  """
  tasks = [t for t, models in VISION_MODELS.items() if model in models]
  if not tasks:
    valid = ", ".join(m for models in VISION_MODELS.values() for m in models)
    raise ConfigError(f"{model!r} is not a vision model; valid: {valid}.")
  task = tasks[0]
  recommended = RECOMMENDED[task]
  c = base_config(task, optimizer=optimizer or recommended["optimizer"])
  c.model.name = model
  c.quant.recipe = recipe or recommended["recipe"]
  c.quant.loss_scale = recommended["loss_scale"] and c.quant.recipe not in ("fp32", "bf16")
  return c
