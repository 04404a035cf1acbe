"""A tiny ResNet on scikit-learn's digits (offline, 8x8 grayscale, 10 classes), bf16, Adam: CPU, a
minute or two.

    python train.py --config=configs/resnet_tiny_digits_bf16.py --workdir=runs/resnet_tiny_digits_bf16
"""

from lpjax.train.vision_configs import vision_config


def get_config():
  return vision_config("resnet_tiny", recipe="bf16", optimizer="adam")
