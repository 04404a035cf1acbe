"""The DDPM CIFAR-10 U-Net (35.7M parameters), bf16 GEMMs, Stable-SPAM, gradient clipping 1.0;
sample grids at each eval.

Needs cifar10 prepared once: `tfds build cifar10 --file_format=array_record`. On a GPU:
    python train.py --config=configs/unet_cifar10_bf16.py --workdir=runs/unet_cifar10_bf16
"""

from lpjax.train.vision_configs import vision_config


def get_config():
  return vision_config("unet_cifar10", recipe="bf16", optimizer="stable_spam")
