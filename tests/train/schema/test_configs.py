"""Every config file loads, names its own command, and validates on 8 devices."""

import ast
import glob
import importlib.util
import os

import pytest

from lpjax.train import ConfigError, validate
from lpjax.train import config as cfg_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
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
  if c.task == "lm" and c.data.tokenizer != "byte":  # paper configs: T5's file, given on the CLI
    c.data.tokenizer = "byte"
  validated = validate(c, device_count=8)
  assert validated.mesh.data * validated.mesh.fsdp * validated.mesh.tensor == 8


def test_stable_spam_lm_configs_run_it_as_its_reference_script_does():
  """total_T = the run and no global-norm clipping (docs/results.md, "Stable-SPAM vs Adam in
  FP4"); the AdamW configs keep clipping at 1.0, and the diffusion configs their clipping."""
  configs = by_name()
  for size in ("tiny", "60m", "130m", "350m", "1b"):
    for recipe in ("mxfp4", "nvfp4"):
      o = configs[f"llama_{size}_{recipe}"].optimizer
      assert (o.name, o.total_steps, o.grad_clip) == ("stable_spam", -1, 0.0), (size, recipe)
    o = configs[f"llama_{size}_bf16"].optimizer
    assert (o.name, o.total_steps, o.grad_clip) == ("adamw", 0, 1.0), size
  assert configs["unet_tiny_digits_mxfp4"].optimizer.grad_clip == 1.0


def test_1b_mxfp4_is_the_stable_spam_fsdp_recipe():
  c = load(os.path.join(ROOT, "configs", "llama_1b_mxfp4.py")).get_config()
  assert (c.optimizer.name, c.quant.recipe, c.mesh.fsdp, c.model.size) == ("stable_spam", "mxfp4", 8, "1b")
  assert (c.seq_len, c.batch_size) == (256, 512)


# The resolved values of representative configs, as they were when the values moved from
# positional run tables into the config files (only other tasks' keys were removed then).
EXPECTED = {
    "llama_1b_mxfp4": {
        "task": "lm", "model.size": "1b", "model.compute_dtype": "bfloat16", "model.remat": True,
        "data.source": "tfds", "data.tfds_name": "c4/en", "data.tokenizer": "spiece.model",
        "steps": 20_000, "batch_size": 512, "seq_len": 256, "grad_accum_steps": 8,
        "optimizer.name": "stable_spam", "optimizer.lr": 2e-4, "optimizer.warmup_steps": 2000,
        "optimizer.min_lr_ratio": 0.1, "optimizer.state_dtype": "bfloat16",
        "optimizer.gamma1": 0.7, "optimizer.gamma2": 0.9, "optimizer.gamma3": 0.999,
        "optimizer.reset_interval": 1000, "optimizer.eps": 1e-8, "quant.recipe": "mxfp4",
        "quant.residuals": "quantized", "eval_every": 1000, "eval_steps": 20,
        "checkpoint_every": 1000, "mesh.fsdp": 8, "mesh.data": 1,
    },
    "llama_350m_nvfp4": {
        "model.size": "350m", "steps": 20_000, "batch_size": 512, "seq_len": 256,
        "optimizer.name": "stable_spam", "optimizer.lr": 4e-4, "optimizer.warmup_steps": 2000,
        "optimizer.state_dtype": "bfloat16", "quant.recipe": "nvfp4", "mesh.fsdp": 1,
        "grad_accum_steps": 1, "model.remat": False,
    },
    "llama_60m_bf16": {
        "model.size": "60m", "steps": 10_000, "batch_size": 512, "seq_len": 256,
        "optimizer.name": "adamw", "optimizer.lr": 1e-3, "optimizer.warmup_steps": 1000,
        "optimizer.weight_decay": 0.0, "optimizer.state_dtype": "float32", "quant.recipe": "bf16",
        "model.compute_dtype": "bfloat16", "data.tfds_name": "c4/en",
    },
    "llama_tiny_mxfp4": {
        "model.size": "tiny", "model.compute_dtype": "float32", "data.source": "embedded",
        "data.tokenizer": "byte", "steps": 300, "batch_size": 16, "seq_len": 128,
        "optimizer.name": "stable_spam", "optimizer.lr": 3e-3, "optimizer.warmup_steps": 30,
        "optimizer.min_lr_ratio": 0.1, "quant.recipe": "mxfp4", "eval_every": 100,
        "eval_steps": 8, "checkpoint_every": 100,
    },
    "resnet50_imagenet100_mxfp4": {
        "task": "classification", "model.name": "resnet50", "model.compute_dtype": "bfloat16",
        "data.source": "tfds", "data.tfds_name": "imagenet2012", "data.classes": "imagenet100",
        "data.image_size": 224, "steps": 50_000, "batch_size": 256, "optimizer.name": "adam",
        "optimizer.lr": 1e-3, "optimizer.warmup_steps": 2500, "optimizer.min_lr_ratio": 0.1,
        "quant.recipe": "mxfp4", "quant.loss_scale": True, "eval_every": 2500, "eval_steps": 0,
        "checkpoint_every": 2500,
    },
    "resnet_tiny_digits_bf16": {
        "task": "classification", "model.name": "resnet_tiny", "data.source": "digits",
        "data.image_size": 0, "steps": 600, "batch_size": 64, "optimizer.name": "adam",
        "optimizer.lr": 3e-3, "optimizer.warmup_steps": 50, "quant.recipe": "bf16",
        "quant.loss_scale": False, "eval_every": 200, "checkpoint_every": 300,
    },
    "unet_tiny_digits_mxfp4": {
        "task": "diffusion", "model.name": "unet_tiny", "model.compute_dtype": "float32",
        "data.source": "digits", "data.image_size": 0, "steps": 1500, "batch_size": 64,
        "optimizer.name": "stable_spam", "optimizer.lr": 2e-3, "optimizer.warmup_steps": 100,
        "optimizer.min_lr_ratio": 0.1, "optimizer.grad_clip": 1.0,
        "quant.recipe": "mxfp4_e4m3scale", "quant.loss_scale": False, "eval_every": 500,
        "eval_steps": 0, "checkpoint_every": 500, "diffusion.timesteps": 1000,
        "diffusion.sampler": "ddim", "diffusion.sample_steps": 50, "diffusion.num_samples": 16,
    },
    "unet_cifar10_mxfp4": {
        "task": "diffusion", "model.name": "unet_cifar10", "model.compute_dtype": "bfloat16",
        "data.source": "tfds", "data.tfds_name": "cifar10", "steps": 200_000, "batch_size": 128,
        "optimizer.lr": 2e-4, "optimizer.warmup_steps": 5000, "quant.recipe": "mxfp4_e4m3scale",
        "eval_every": 10_000, "checkpoint_every": 10_000, "diffusion.num_samples": 64,
    },
}


def _get(c, key):
  for part in key.split("."):
    c = c[part]
  return c


def by_name():
  return {os.path.basename(p)[:-3]: load(p).get_config() for p in CONFIGS}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_configs_resolve_to_their_paper_values(name):
  c = by_name()[name]
  got = {key: _get(c, key) for key in EXPECTED[name]}
  assert got == EXPECTED[name]
  for key, value in EXPECTED[name].items():
    assert type(got[key]) is type(value), key


def test_the_recipes_of_a_size_share_its_paper_run():
  configs = by_name()
  shared = ("steps", "batch_size", "seq_len", "optimizer.lr", "optimizer.warmup_steps",
            "optimizer.min_lr_ratio", "eval_every", "eval_steps", "checkpoint_every",
            "model.compute_dtype", "data.source", "data.tfds_name", "data.tokenizer")
  for size in ("tiny", "60m", "130m", "350m", "1b"):
    runs = {r: configs[f"llama_{size}_{r}"] for r in ("bf16", "mxfp4", "nvfp4")}
    for key in shared:
      assert len({_get(c, key) for c in runs.values()}) == 1, (size, key)
    assert [(c.quant.recipe, c.optimizer.name) for c in runs.values()] == [
        ("bf16", "adamw"), ("mxfp4", "stable_spam"), ("nvfp4", "stable_spam")]


def test_each_task_has_only_its_sections():
  configs = by_name()
  for name, c in configs.items():
    assert ("diffusion" in c) == (c.task == "diffusion"), name
    assert ("seq_len" in c) == (c.task == "lm"), name
    assert ("tokenizer" in c.data) == (c.task == "lm"), name
    assert ("image_size" in c.data) == (c.task != "lm"), name
    assert ("stem" in c.model) == (c.task == "classification"), name
  assert "diffusion" not in configs["llama_1b_mxfp4"]
  assert configs["unet_tiny_digits_bf16"].diffusion.timesteps == 1000
  assert cfg_lib.flat_keys(cfg_lib.base_config()) == cfg_lib.task_keys("lm")
  assert "size" in cfg_lib.base_config("lm").model
  assert "size" not in cfg_lib.base_config("diffusion").model
  with pytest.raises(ConfigError, match="task 'segmentation' is unknown"):
    cfg_lib.base_config("segmentation")


@pytest.mark.parametrize("task,key,value,owners", [
    ("lm", "diffusion.timesteps", 50, "task 'diffusion' only"),
    ("lm", "data.image_size", 32, "tasks 'classification' and 'diffusion' only"),
    ("diffusion", "seq_len", 64, "task 'lm' only"),
    ("diffusion", "model.stem", "small", "task 'classification' only"),
    ("classification", "diffusion.sampler", "ddpm", "task 'diffusion' only"),
])
def test_validate_names_the_task_of_another_tasks_key(task, key, value, owners):
  c = cfg_lib.base_config(task)
  node, (*parents, leaf) = c, key.split(".")
  with c.unlocked():
    for p in parents:
      if p not in node:
        node[p] = {}
      node = node[p]
    node[leaf] = value
  with pytest.raises(ConfigError, match=f"{key} applies to {owners}; this config's task is "
                                        f"'{task}'"):
    validate(c, device_count=8)


def test_validate_names_unknown_and_missing_keys():
  c = cfg_lib.base_config("classification")
  with c.unlocked():
    c.model.depth = 50
  with pytest.raises(ConfigError, match="Unknown config key.*model.depth"):
    validate(c, device_count=8)
  c = cfg_lib.base_config("diffusion")
  del c.diffusion
  with pytest.raises(ConfigError, match="of task 'diffusion' missing: diffusion.fid_"):
    validate(c, device_count=8)
  c = cfg_lib.base_config("diffusion")
  c.diffusion.fid_inception_path = "/no/inception.npz"
  with pytest.raises(ConfigError, match=r"lpjax/eval/_inception\.py"):
    validate(c, device_count=8)


def test_classification_grad_accumulation_error_names_the_model_and_the_fix():
  c = cfg_lib.base_config("classification")
  c.grad_accum_steps = 2
  with pytest.raises(ConfigError, match=r"grad_accum_steps=2: the classification task \(model.name "
                                        r"'resnet_tiny'\).*set grad_accum_steps=1"):
    validate(c, device_count=8)
  c.model.factory = "examples.own_model:make_classifier"
  with pytest.raises(ConfigError, match=r"\(model.factory 'examples.own_model:make_classifier'\)"):
    validate(c, device_count=8)


def test_tasks_are_defined_once():
  from lpjax.train import tasks as tasks
  assert tasks.TASKS is cfg_lib.TASKS


def _assignments(tree):
  """{"c.optimizer.lr": value node} of the attribute assignments in get_config()."""
  (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_config"]
  out = {}
  for node in ast.walk(fn):
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
      target = node.targets[0]
      if isinstance(target, ast.Attribute):
        out[ast.unparse(target)] = node.value
  return out


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_config_files_state_their_values(path):
  source = open(path).read()
  tree = ast.parse(source)
  assigned = _assignments(tree)
  c = load(path).get_config()
  required = ["c.steps", "c.batch_size", "c.optimizer.lr", "c.optimizer.warmup_steps",
              "c.optimizer.min_lr_ratio", "c.quant.recipe", "c.eval_every", "c.eval_steps",
              "c.checkpoint_every", "c.data.source"]
  required += ["c.seq_len", "c.model.size"] if c.task == "lm" else ["c.model.name"]
  for target in required:
    assert target in assigned, f"{os.path.basename(path)} does not assign {target}"
    value = assigned[target]
    assert isinstance(value, ast.Constant), f"{target} is not a literal: {ast.unparse(value)}"
    assert _get(c, target[2:]) == value.value
  # The only call that builds the config is the shared base, with the task and optimizer named.
  (base,) = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
  assert ast.unparse(base.func) == "base_config"
  assert [ast.literal_eval(a) for a in base.args] == [c.task]
  assert [(k.arg, ast.literal_eval(k.value)) for k in base.keywords] == [
      ("optimizer", c.optimizer.name)]
  assert "NUMERICS" + ".md" not in source  # the team's reference is not part of lpjax


def test_load_config_file_gives_the_files_config_and_names_a_bad_path(tmp_path):
  path = os.path.join(ROOT, "configs", "llama_tiny_mxfp4.py")
  assert cfg_lib.load_config_file(path).to_dict() == load(path).get_config().to_dict()
  with pytest.raises(cfg_lib.ConfigError, match="does not exist.*configs/llama_tiny_mxfp4.py"):
    cfg_lib.load_config_file(str(tmp_path / "nope.py"))
  empty = tmp_path / "empty.py"
  empty.write_text("X = 1\n")
  with pytest.raises(cfg_lib.ConfigError, match="defines no get_config"):
    cfg_lib.load_config_file(str(empty))


def test_high_precision_recipe_takes_auto_and_its_error_says_so():
  c = cfg_lib.base_config()
  c.quant.high_precision_recipe = "auto"
  assert validate(c, device_count=8).quant.high_precision_recipe == "auto"
  c.quant.high_precision_recipe = "autoo"
  with pytest.raises(ConfigError, match=r"or 'auto' \(each kept GEMM as given"):
    validate(c, device_count=8)
  c = cfg_lib.base_config()
  c.quant.recipe = "autoo"  # 'auto' is for kept layers only: the recipe's message lists presets
  with pytest.raises(ConfigError, match="quant.recipe 'autoo' is unknown") as e:
    validate(c, device_count=8)
  assert "'auto'" not in str(e.value)
