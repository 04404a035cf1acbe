"""lpjax.train: the training program (config, mesh and sharding, train step, precision schedule,
checkpoints, metrics) behind `train.py`, importable from a notebook.

The public API is `__all__`; the modules whose names start with "_" are implementation.
`lpjax.train.config` is public too: config files build on it. The trainer and its dependencies
load on first use, so `import lpjax.train.config` stays light.

Examples:
  >>> from lpjax.train import config
  >>> config.llama_config("tiny").model.size
  'tiny'
  >>> from lpjax.train import PrecisionSchedule
  >>> PrecisionSchedule(total_steps=10, warmup_fraction=0.2).warmup_steps
  2
"""

import importlib

from lpjax.train.config import TASKS, ConfigError, base_config, llama_config, validate

# name -> private module that defines it (imported on first access)
_LAZY = {
    "Trainer": "loop._trainer", "TrainingError": "loop._trainer", "setup_logging": "loop._process",
    "use_compilation_cache": "loop._process",
    "PrecisionController": "step._precision", "PrecisionSchedule": "step._precision",
    "ScheduleState": "step._precision", "build_policy": "step._precision",
    "make_optimizer": "step._optimizers", "learning_rate_schedule": "step._optimizers",
    "decay_mask": "step._optimizers", "make_task": "tasks", "Task": "tasks",
    "CheckpointWriteError": "state._checkpoint", "WorkdirInUse": "state._workdir_lock",
    "tensorboard_command": "outputs._metrics",
}

__all__ = ["CheckpointWriteError", "ConfigError", "PrecisionController", "PrecisionSchedule",
           "ScheduleState", "TASKS", "Task", "Trainer", "TrainingError", "WorkdirInUse",
           "base_config", "build_policy", "decay_mask", "learning_rate_schedule", "llama_config",
           "make_optimizer", "make_task", "setup_logging", "tensorboard_command",
           "train_and_evaluate", "use_compilation_cache", "validate"]


def train_and_evaluate(config, workdir):
  """Trains `config` in `workdir` (resuming from its checkpoints); returns the results dict."""
  from lpjax.train.loop._trainer import train_and_evaluate as run

  return run(config, workdir)


def __getattr__(name):
  if name in _LAZY:
    return getattr(importlib.import_module(f"lpjax.train.{_LAZY[name]}"), name)
  raise AttributeError(f"module 'lpjax.train' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + list(_LAZY))
