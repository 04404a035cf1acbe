"""Tasks the trainer runs: `make_task(config)` by `config.task`.

Examples:
  >>> TASKS
  ('lm', 'classification', 'diffusion')
"""

from __future__ import annotations

from lpjax.train.tasks.base import Task

TASKS = ("lm", "classification", "diffusion")


def make_task(config) -> Task:
  """The Task of a validated config."""
  if config.task == "lm":
    from lpjax.train.tasks.lm import LanguageModelTask
    return LanguageModelTask(config)
  if config.task == "classification":
    from lpjax.train.tasks.classification import ClassificationTask
    return ClassificationTask(config)
  if config.task == "diffusion":
    from lpjax.train.tasks.diffusion import DiffusionTask
    return DiffusionTask(config)
  raise ValueError(f"Unknown task {config.task!r}; valid: {', '.join(TASKS)}.")


__all__ = ["TASKS", "Task", "make_task"]
