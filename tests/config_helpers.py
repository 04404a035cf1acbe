"""Small configs shared by the trainer tests: `small()` (tiny LLaMA, a few steps), `override`, and
`config_file` (a config of configs/ as train.py loads it)."""

import os

from lpjax.train import config as cfg_lib
from lpjax.train import llama_config

CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def config_file(name):
  """get_config() of configs/<name>.py."""
  return cfg_lib.load_config_file(os.path.join(CONFIGS_DIR, name + ".py"))


def override(c, **overrides):
  """Sets dotted keys ("optimizer.lr") of a ConfigDict; returns it."""
  for key, value in overrides.items():
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c


def as_task(c, task):
  """`c` moved to `task`: the keys both tasks have keep their values, the others are `task`'s
  defaults (an unknown task is only set, for `validate` to reject)."""
  if task not in cfg_lib.TASKS:
    c.task = task
    return c
  moved = cfg_lib.base_config(task, optimizer=c.optimizer.name)
  for key in cfg_lib.task_keys(task) & cfg_lib.flat_keys(c) - {"task"}:
    *parents, leaf = key.split(".")
    src, dst = c, moved
    for p in parents:
      src, dst = src[p], dst[p]
    dst[leaf] = src[leaf]
  return moved


def small(recipe="bf16", optimizer="adamw", steps=3, task="lm", **overrides):
  """Tiny LLaMA, batch 8 x 32 tokens, `steps` steps, evaluation and checkpoint only at the end.

  Another `task` keeps these settings where that task has the key (`as_task`).
  """
  c = llama_config("tiny", recipe=recipe, optimizer=optimizer)
  c.steps, c.batch_size, c.seq_len = steps, 8, 32
  c.eval_every, c.eval_steps, c.checkpoint_every, c.log_every = 0, 1, 0, 1
  c.optimizer.warmup_steps = 2
  c.progress_bar = False
  c.data.prefetch = 0
  if task != "lm":
    c = as_task(c, task)
  return override(c, **overrides)
