"""A tiny ResNet on the offline digits with the recommended classification recipe (E8M0-scaled MXFP4
+ SR + Adam + loss scaling): CPU, a few minutes.

    python train.py --config=configs/resnet_tiny_digits_mxfp4.py --workdir=runs/resnet_tiny_digits_mxfp4
"""

from lpjax.train.vision_configs import vision_config


def get_config():
  return vision_config("resnet_tiny", recipe="mxfp4", optimizer="adam")
