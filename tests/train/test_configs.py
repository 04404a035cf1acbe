"""Every config file loads, names its own command, and validates on 8 devices."""

import glob
import importlib.util
import os

import pytest

from lpjax.train import validate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = sorted(p for p in glob.glob(os.path.join(ROOT, "configs", "*.py"))
                 if not p.endswith("__init__.py"))
VISION = ["resnet50_imagenet100_bf16", "resnet50_imagenet100_mxfp4", "resnet50_imagenet100_nvfp4",
          "resnet_tiny_digits_bf16", "resnet_tiny_digits_mxfp4", "unet_cifar10_bf16",
          "unet_cifar10_mxfp4", "unet_tiny_digits_bf16", "unet_tiny_digits_mxfp4"]


def load(path):
  spec = importlib.util.spec_from_file_location("cfg", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_issue_configs_exist():
  names = {os.path.basename(p)[:-3] for p in CONFIGS}
  for size in ("tiny", "60m", "130m", "350m", "1b"):
    for recipe in ("bf16", "mxfp4", "nvfp4"):
      assert f"llama_{size}_{recipe}" in names
  assert set(VISION) <= names


def test_vision_configs_use_the_recommended_recipes():
  by_name = {os.path.basename(p)[:-3]: load(p).get_config() for p in CONFIGS}
  c = by_name["resnet50_imagenet100_mxfp4"]
  assert (c.task, c.model.name, c.data.tfds_name, c.data.classes) == (
      "classification", "resnet50", "imagenet2012", "imagenet100")
  assert (c.quant.recipe, c.optimizer.name, c.quant.loss_scale) == ("mxfp4", "adam", True)
  d = by_name["unet_cifar10_mxfp4"]
  assert (d.task, d.quant.recipe, d.optimizer.name) == ("diffusion", "mxfp4_e4m3scale", "stable_spam")
  assert d.optimizer.grad_clip > 0
  assert by_name["resnet_tiny_digits_bf16"].data.source == "digits"


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_config_validates_and_documents_its_command(path):
  module = load(path)
  name = os.path.basename(path)
  assert f"python train.py --config=configs/{name}" in module.__doc__
  c = module.get_config()
  if c.data.tokenizer != "byte":  # paper configs name T5's model file, passed on the command line
    c.data.tokenizer = "byte"
  validated = validate(c, device_count=8)
  assert validated.mesh.data * validated.mesh.fsdp * validated.mesh.tensor == 8


def test_1b_mxfp4_is_the_stable_spam_fsdp_recipe():
  c = load(os.path.join(ROOT, "configs", "llama_1b_mxfp4.py")).get_config()
  assert (c.optimizer.name, c.quant.recipe, c.mesh.fsdp, c.model.size) == ("stable_spam", "mxfp4", 8, "1b")
  assert (c.seq_len, c.batch_size) == (256, 512)
