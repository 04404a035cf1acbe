"""ResNet-50 on ImageNet-100, the recommended classification recipe: E8M0-scaled MXFP4 (RTN forward,
stochastic rounding in backward) + Adam + dynamic loss scaling; stem and classifier in bf16.

Needs imagenet2012 prepared as array_record (manual download of the ImageNet tarballs, then
`tfds build imagenet2012 --file_format=array_record --manual_dir=...`). 8 GPUs:
    python train.py --config=configs/resnet50_imagenet100_mxfp4.py --workdir=runs/resnet50_imagenet100_mxfp4
"""

from lpjax.train.vision_configs import vision_config


def get_config():
  return vision_config("resnet50", recipe="mxfp4", optimizer="adam")
