"""A tiny U-Net (164k parameters) on the offline digits, bf16 GEMMs, Stable-SPAM: CPU, a few
minutes; DDIM sample grids in <workdir>/samples/.

    python train.py --config=configs/unet_tiny_digits_bf16.py --workdir=runs/unet_tiny_digits_bf16
"""

from lpjax.train.vision_configs import vision_config


def get_config():
  return vision_config("unet_tiny", recipe="bf16", optimizer="stable_spam")
