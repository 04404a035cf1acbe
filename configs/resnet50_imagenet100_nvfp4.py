"""ResNet-50 on ImageNet-100 with NVIDIA's NVFP4 recipe (E4M3 block scales of 16 + fp32 tensor
scale) + Adam + dynamic loss scaling.

Needs imagenet2012 prepared as array_record (manual download of the ImageNet tarballs, then
`tfds build imagenet2012 --file_format=array_record --manual_dir=...`). 8 GPUs:
    python train.py --config=configs/resnet50_imagenet100_nvfp4.py --workdir=runs/resnet50_imagenet100_nvfp4
"""

from lpjax.train.vision_configs import vision_config


def get_config():
  return vision_config("resnet50", recipe="nvfp4", optimizer="adam")
