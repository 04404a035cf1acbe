"""A tiny ResNet on the offline digits with the recommended classification recipe (E8M0-scaled MXFP4
+ SR + Adam + loss scaling): CPU, a few minutes.

    python train.py --config=configs/resnet_tiny_digits_mxfp4.py \
        --workdir=runs/resnet_tiny_digits_mxfp4
"""

from lpjax.train.config import base_config


def get_config():
  # Every classification key at its default; the optimizer section holds Adam's paper b1, b2 and eps
  # (lpjax.train.config.optimizer_defaults("adam")).
  c = base_config("classification", optimizer="adam")

  c.model.name = "resnet_tiny"
  c.model.compute_dtype = "float32"  # activations; weights in float32

  c.data.source = "digits"  # scikit-learn's 8x8 digits, offline
  c.data.image_size = 0  # the dataset's own size

  c.steps = 600
  c.batch_size = 64  # images

  c.optimizer.lr = 3e-3  # peak learning rate
  c.optimizer.warmup_steps = 50  # linear warm-up from 0
  c.optimizer.min_lr_ratio = 0.1  # then cosine decay to 10% of lr
  c.optimizer.grad_clip = 1.0  # global-norm clipping

  c.quant.recipe = "mxfp4"  # MXFP4 GEMMs (E8M0 scales of 32; stochastic rounding in backward)
  c.quant.loss_scale = True  # dynamic loss scaling (FP4 gradients underflow without it)

  c.eval_every = 200  # steps
  c.eval_steps = 0  # the whole eval split
  c.checkpoint_every = 300  # steps
  return c
