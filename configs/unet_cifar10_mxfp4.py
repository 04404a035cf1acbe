"""The DDPM CIFAR-10 U-Net with the recommended diffusion recipe: E4M3-scaled FP4 (e2m1 elements,
ue4m3 block scales of 32, fp32 tensor scale) + Stable-SPAM + clipping + full-precision validation
(eval/loss_fp).

Needs cifar10 prepared once: `tfds build cifar10 --file_format=array_record`. On a GPU:
    python train.py --config=configs/unet_cifar10_mxfp4.py --workdir=runs/unet_cifar10_mxfp4
"""

from lpjax.train.vision_configs import vision_config


def get_config():
  return vision_config("unet_cifar10", recipe="mxfp4_e4m3scale", optimizer="stable_spam")
