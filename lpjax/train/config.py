"""The training configuration: the schema, model sizes, and validation before anything compiles.

A config file in configs/ starts from `base_config(task, optimizer=...)` (every key of `task`
with its default; the optimizer section holds that optimizer's paper hyperparameters) and then
assigns its run's values by name: steps, batch, sequence length, learning rate, warm-up,
schedule, recipe, data. `train.py` overrides fields from the command line
(`--config.optimizer.lr=2e-3`). `validate` checks a config against its task's keys and against
the machine, and fails with a message that says how to fix it.

Examples:
  >>> c = llama_config("tiny", recipe="mxfp4", optimizer="stable_spam")
  >>> c.model.size, c.quant.recipe, c.optimizer.name, c.optimizer.gamma1
  ('tiny', 'mxfp4', 'stable_spam', 0.7)
  >>> validate(c, device_count=8, process_count=1).mesh.data
  8
  >>> with c.unlocked():
  ...   c.diffusion = {"timesteps": 50}
  >>> try:
  ...   validate(c, device_count=8)
  ... except ConfigError as e:
  ...   print(str(e).split(";")[0])
  diffusion.timesteps applies to task 'diffusion' only
"""

from __future__ import annotations

import importlib.util
import os

import ml_collections

from lpjax.models.llama_sizes import LLAMA_SIZES
from lpjax.train.schema._config_schema import (IMAGE_SOURCES, OPTIMIZERS, RESUME_CHOICES, STATE_DTYPES,
                                        TASKS, TEXT_SOURCES, VISION_MODELS, ConfigError, base_config,
                                        flat_keys, optimizer_defaults, task_keys, tasks_of)
from lpjax.train.schema._validate import parse_schedule, validate

__all__ = ["IMAGE_SOURCES", "LLAMA_SIZES", "OPTIMIZERS", "RESUME_CHOICES", "STATE_DTYPES", "TASKS",
           "TEXT_SOURCES", "VISION_MODELS", "ConfigError", "base_config", "flat_keys", "llama_config",
           "load_config_file", "optimizer_defaults", "seq_len_at", "task_keys", "validate"]


def llama_config(size: str = "tiny", *, recipe: str = "bf16", optimizer: str = "adamw"):
  """An lm config of LLaMA `size` with GEMM recipe `recipe` and `optimizer`'s paper settings.

  The other keys keep their `base_config("lm")` defaults (a short CPU run on the offline corpus).

  Examples:
    >>> c = llama_config("60m", recipe="nvfp4", optimizer="spam")
    >>> c.task, c.model.size, c.quant.recipe, c.optimizer.name, c.optimizer.reset_interval
    ('lm', '60m', 'nvfp4', 'spam', 500)
  """
  c = base_config("lm", optimizer=optimizer)
  c.model.size = size
  c.quant.recipe = recipe
  return c


def load_config_file(path: str) -> ml_collections.ConfigDict:
  """The config of a config file (its `get_config()`), as `train.py --config=path` starts from.

  Examples:
    >>> import lpjax
    >>> repo = os.path.dirname(lpjax.__path__[0])  # a checkout: configs/ sits beside lpjax/
    >>> c = load_config_file(os.path.join(repo, "configs", "llama_tiny_mxfp4.py"))
    >>> c.model.size, c.quant.recipe
    ('tiny', 'mxfp4')
  """
  if not os.path.isfile(path):
    raise ConfigError(f"config file {path!r} does not exist; pass a path to a file in configs/, "
                      "e.g. configs/llama_tiny_mxfp4.py")
  spec = importlib.util.spec_from_file_location("lpjax_config_file", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not callable(getattr(module, "get_config", None)):
    raise ConfigError(f"config file {path!r} defines no get_config(); a config file returns its "
                      "ConfigDict from get_config(), as the files in configs/ do")
  return module.get_config()


def seq_len_at(config, step: int) -> int:
  """The curriculum's sequence length at `step` (config.seq_len when there is no schedule).

  Examples:
    >>> c = llama_config("tiny")
    >>> c.steps, c.data.seq_len_schedule = 100, "32:0.25,64:0.5"
    >>> [seq_len_at(c, s) for s in (0, 25, 50, 99)]
    [32, 64, 128, 128]
  """
  for length, fraction in parse_schedule(config.data.seq_len_schedule):
    if step < fraction * config.steps:
      return length
  return config.seq_len
