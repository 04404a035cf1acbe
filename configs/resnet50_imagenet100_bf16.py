"""ResNet-50 on ImageNet-100 (imagenet2012 restricted to the CMC 100-class list), bf16 baseline,
Adam.

Needs imagenet2012 prepared as array_record (manual download of the ImageNet tarballs, then
`tfds build imagenet2012 --file_format=array_record --manual_dir=...`). 8 GPUs:
    python train.py --config=configs/resnet50_imagenet100_bf16.py --workdir=runs/resnet50_imagenet100_bf16
"""

from lpjax.train.vision_configs import vision_config


def get_config():
  return vision_config("resnet50", recipe="bf16", optimizer="adam")
