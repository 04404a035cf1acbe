"""A tiny U-Net on the offline digits with the recommended diffusion recipe (E4M3-scaled FP4 +
Stable-SPAM + clipping + full-precision validation). On a 2-core CPU, XLA takes about 2 minutes
(AVX-512) to compile the step (35 quantized layers, each with six exact two-level-scale
quantizers; 4.9x the bf16 step's compile on one core, docs/gemm.md "Cost on CPU"; older CPUs are
slower), once: train.py keeps the compiled step in JAX's persistent cache, so a resumed or repeated
run loads it. `--config.quant.recipe=mxfp4_naive` compiles in well under a minute.

    python train.py --config=configs/unet_tiny_digits_mxfp4.py \
        --workdir=runs/unet_tiny_digits_mxfp4
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

  c.quant.recipe = "mxfp4_e4m3scale"  # FP4 GEMMs, E4M3 block scales of 32 + an fp32 tensor scale

  c.eval_every = 500  # steps
  c.eval_steps = 0  # the whole eval split
  c.checkpoint_every = 500  # steps

  c.diffusion.schedule = "linear"  # DDPM noise schedule
  c.diffusion.timesteps = 1000
  c.diffusion.sampler = "ddim"
  c.diffusion.sample_steps = 50
  c.diffusion.num_samples = 16  # images in the grid saved at each eval
  return c
