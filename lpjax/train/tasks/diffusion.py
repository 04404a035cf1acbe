"""Diffusion (DDPM / DDIM) with a U-Net: epsilon-prediction loss; at each eval a sample grid PNG
and, when an Inception checkpoint is configured, FID against the eval split.

Examples:
  >>> from lpjax.train.cli._vision_configs import vision_config
  >>> c = vision_config("unet_tiny", recipe="bf16")
  >>> c.batch_size, c.data.prefetch = 4, 0
  >>> task = DiffusionTask(c)
  >>> step, batch = next(task.batches(0, 1, 0, 1))
  >>> batch["image"].shape, task.model_config.image_size, task.schedule.num_steps
  ((4, 8, 8, 1), 8, 1000)
"""

from __future__ import annotations

import functools
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.models import diffusion, unet
from lpjax.train.tasks.base import own_model_report
from lpjax.train.tasks.images import ImageTask

log = logging.getLogger("lpjax.train")
PRESETS = {"unet_tiny": unet.unet_tiny, "unet_cifar10": unet.unet_cifar10}
EVAL_KEY = 1234  # the timesteps and noise of the eval loss are the same at every evaluation


class DiffusionTask(ImageTask):
  name = "diffusion"
  partition_rules = unet.PARTITION_RULES

  def __init__(self, config, policy=None):
    super().__init__(config, policy)
    m, dc = config.model, config.diffusion
    height, _, channels = self.dataset.image_shape
    self.model_config = PRESETS[m.name](
        image_size=height, channels=channels, compute_dtype=m.compute_dtype,
        param_dtype=m.param_dtype)
    self.graphdef, _ = unet.abstract_model(self.model_config, self.policy)
    self._apply = functools.partial(unet.apply, self.graphdef, self.model_config)
    make_schedule = diffusion.linear_schedule if dc.schedule == "linear" else diffusion.cosine_schedule
    self.schedule = make_schedule(dc.timesteps)
    self._sampler = None
    self._fid_features = None

  def init_variables(self, key):
    return unet.init_params(self.model_config, key), None

  def loss(self, params, model_state, batch, key, policy):
    k_model, k_noise = jax.random.split(key)
    eps_fn = lambda x_t, t: self._apply(params, x_t, t, policy, k_model, train=True)
    return diffusion.diffusion_loss(eps_fn, self.schedule, batch["image"], k_noise), (model_state, {})

  def eval_sums(self, params, model_state, batch, policy):
    x0, mask = batch["image"], batch["mask"]
    k_t, k_noise, k_model = jax.random.split(jax.random.key(EVAL_KEY), 3)
    t = jax.random.randint(k_t, (x0.shape[0],), 0, self.schedule.num_steps)
    noise = jax.random.normal(k_noise, x0.shape, jnp.float32)
    eps = self._apply(params, diffusion.q_sample(self.schedule, x0, t, noise), t, policy, k_model)
    per_example = jnp.mean(jnp.square(eps - noise), axis=tuple(range(1, x0.ndim)))
    return {"loss_sum": jnp.sum(per_example * mask), "count": jnp.sum(mask)}

  def eval_summary(self, sums):
    return {"loss": sums["loss_sum"] / max(sums["count"], 1.0)}

  # --- samples and FID ------------------------------------------------------------------------

  def sample(self, params, num: int, key, policy=None):
    """`num` images (num, H, W, C) in [-1, 1] from the configured sampler, jitted once."""
    if self._sampler is None:
      dc = self.config.diffusion

      @functools.partial(jax.jit, static_argnums=(1, 3))
      def sampler(params, num, key, policy):
        k_model, k_sample = jax.random.split(key)
        eps_fn = lambda x_t, t: self._apply(params, x_t, t, policy, k_model)
        shape = (num,) + tuple(self.dataset.image_shape)
        if dc.sampler == "ddim":
          return diffusion.ddim_sample(eps_fn, self.schedule, shape, k_sample, steps=dc.sample_steps)
        return diffusion.ddpm_sample(eps_fn, self.schedule, shape, k_sample)
      self._sampler = sampler
    return self._sampler(params, num, key, policy)

  def after_eval(self, params, model_state, step, workdir, is_main):
    dc, metrics = self.config.diffusion, {}
    key = jax.random.key(self.config.seed + 7)  # the same noise at every eval: comparable grids
    if dc.num_samples and is_main:
      from lpjax.data import image_grid, save_png
      images = np.asarray(self.sample(params, dc.num_samples, key))
      rows = max(1, int(np.sqrt(dc.num_samples)))
      path = os.path.join(workdir, "samples", f"step_{step:07d}.png")
      os.makedirs(os.path.dirname(path), exist_ok=True)
      save_png(path, image_grid(images, rows))
      log.info("step %d: samples in %s", step, path)
    if dc.fid_inception_path:
      metrics["fid"] = self._fid(params, key)
    return metrics

  def _fid(self, params, key) -> float:
    from lpjax import eval as lpeval
    if self._fid_features is None:
      feature_fn = lpeval.inception_feature_fn(self.config.diffusion.fid_inception_path)
      reference = (b["image"][b["mask"] > 0] for b in self.eval_batches(0, 1))
      self._fid_features = (feature_fn, lpeval.statistics_of(reference, feature_fn))
    feature_fn, (mu_ref, sigma_ref) = self._fid_features
    n, batch = self.config.diffusion.fid_num_samples, max(self.config.batch_size, 1)
    generated = (np.asarray(self.sample(params, min(batch, n - i), jax.random.fold_in(key, i)))
                 for i in range(0, n, batch))
    mu, sigma = lpeval.statistics_of(generated, feature_fn)
    return lpeval.frechet_distance(mu, sigma, mu_ref, sigma_ref)

  def quant_report(self, policy):
    return own_model_report(*unet.abstract_model(self.model_config, policy))
