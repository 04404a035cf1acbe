"""A tiny U-Net (164k parameters) on the offline digits, bf16 GEMMs, Stable-SPAM: CPU, a few
minutes; DDIM sample grids in <workdir>/samples/.

    python train.py --config=configs/unet_tiny_digits_bf16.py \
        --workdir=runs/unet_tiny_digits_bf16
"""

from lpjax.train.config import base_config


def get_config():
  # Every diffusion key at its default; the optimizer section holds Stable-SPAM's paper b1, b2, eps,
  # gamma1-3 and reset interval (lpjax.train.config.optimizer_defaults("stable_spam")).
  c = base_config("diffusion", optimizer="stable_spam")

  c.model.name = "unet_tiny"
  c.model.compute_dtype = "float32"  # activations; weights in float32

  c.data.source = "digits"  # scikit-learn's 8x8 digits, offline
  c.data.image_size = 0  # the dataset's own size

  c.steps = 1500
  c.batch_size = 64  # images

  c.optimizer.lr = 2e-3  # peak learning rate
  c.optimizer.warmup_steps = 100  # linear warm-up from 0
  c.optimizer.min_lr_ratio = 0.1  # then cosine decay to 10% of lr
  c.optimizer.grad_clip = 1.0  # global-norm clipping

  c.quant.recipe = "bf16"  # bf16 GEMMs: the baseline

  c.eval_every = 500  # steps
  c.eval_steps = 0  # the whole eval split
  c.checkpoint_every = 500  # steps

  c.diffusion.schedule = "linear"  # DDPM noise schedule
  c.diffusion.timesteps = 1000
  c.diffusion.sampler = "ddim"
  c.diffusion.sample_steps = 50
  c.diffusion.num_samples = 16  # images in the grid saved at each eval
  return c
