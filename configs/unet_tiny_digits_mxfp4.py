"""A tiny U-Net on the offline digits with the recommended diffusion recipe (E4M3-scaled FP4 +
Stable-SPAM + clipping + full-precision validation). On a 2-core CPU, XLA takes about 10 minutes to
compile the step (35 quantized layers, each with six exact two-level-scale quantizers); training
then runs at ~4 steps/s. `--config.quant.recipe=mxfp4_naive` compiles in about a minute.

    python train.py --config=configs/unet_tiny_digits_mxfp4.py --workdir=runs/unet_tiny_digits_mxfp4
"""

from lpjax.train.vision_configs import vision_config


def get_config():
  return vision_config("unet_tiny", recipe="mxfp4_e4m3scale", optimizer="stable_spam")
