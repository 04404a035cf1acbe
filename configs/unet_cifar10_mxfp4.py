"""The DDPM CIFAR-10 U-Net with the recommended diffusion recipe: E4M3-scaled FP4 (e2m1 elements,
ue4m3 block scales of 32, fp32 tensor scale) + Stable-SPAM + clipping + full-precision validation
(eval/loss_fp).

Needs cifar10 prepared once: `tfds build cifar10 --file_format=array_record`. On a GPU:
    python train.py --config=configs/unet_cifar10_mxfp4.py \
        --workdir=runs/unet_cifar10_mxfp4
"""

from lpjax.train.config import base_config


def get_config():
  # Every diffusion key at its default; the optimizer section holds Stable-SPAM's paper b1, b2, eps,
  # gamma1-3 and reset interval (lpjax.train.config.optimizer_defaults("stable_spam")).
  c = base_config("diffusion", optimizer="stable_spam")

  c.model.name = "unet_cifar10"
  c.model.compute_dtype = "bfloat16"  # activations; weights in float32

  c.data.source = "tfds"
  c.data.tfds_name = "cifar10"
  c.data.image_size = 0  # the dataset's own size

  c.steps = 200_000
  c.batch_size = 128  # images

  c.optimizer.lr = 2e-4  # peak learning rate
  c.optimizer.warmup_steps = 5000  # linear warm-up from 0
  c.optimizer.min_lr_ratio = 0.1  # then cosine decay to 10% of lr
  c.optimizer.grad_clip = 1.0  # global-norm clipping

  c.quant.recipe = "mxfp4_e4m3scale"  # FP4 GEMMs, E4M3 block scales of 32 + an fp32 tensor scale

  c.eval_every = 10_000  # steps
  c.eval_steps = 0  # the whole eval split
  c.checkpoint_every = 10_000  # steps

  c.diffusion.schedule = "linear"  # DDPM noise schedule
  c.diffusion.timesteps = 1000
  c.diffusion.sampler = "ddim"
  c.diffusion.sample_steps = 50
  c.diffusion.num_samples = 64  # images in the grid saved at each eval
  return c
