"""ResNet-50 on ImageNet-100 (imagenet2012 restricted to the CMC 100-class list), bf16 baseline,
Adam.

Needs imagenet2012 prepared as array_record (manual download of the ImageNet tarballs, then
`tfds build imagenet2012 --file_format=array_record --manual_dir=...`). 8 GPUs:
    python train.py --config=configs/resnet50_imagenet100_bf16.py \
        --workdir=runs/resnet50_imagenet100_bf16
"""

from lpjax.train.config import base_config


def get_config():
  # Every classification key at its default; the optimizer section holds Adam's paper b1, b2 and eps
  # (lpjax.train.config.optimizer_defaults("adam")).
  c = base_config("classification", optimizer="adam")

  c.model.name = "resnet50"
  c.model.compute_dtype = "bfloat16"  # activations; weights in float32

  c.data.source = "tfds"
  c.data.tfds_name = "imagenet2012"
  c.data.classes = "imagenet100"  # the CMC 100-class list
  c.data.image_size = 224  # training crops of 224 x 224

  c.steps = 50_000
  c.batch_size = 256  # images

  c.optimizer.lr = 1e-3  # peak learning rate
  c.optimizer.warmup_steps = 2500  # linear warm-up from 0
  c.optimizer.min_lr_ratio = 0.1  # then cosine decay to 10% of lr
  c.optimizer.grad_clip = 1.0  # global-norm clipping

  c.quant.recipe = "bf16"  # bf16 GEMMs: the baseline
  c.quant.loss_scale = False  # dynamic loss scaling (not needed in bf16)

  c.eval_every = 2500  # steps
  c.eval_steps = 0  # the whole eval split
  c.checkpoint_every = 2500  # steps
  return c
