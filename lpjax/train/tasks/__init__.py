"""Tasks the trainer runs: `make_task(config)` by `config.task`.

What each task owns: its model, data, loss and evaluation. Stands on `config`, `state`, `step` and
`model`. Modules: `base` (`Task`, what every task provides), `lm` (the language model: LLaMA or a
user's model, the loss, init_from checkpoints), `classification` (ResNet or a user's classifier),
`diffusion` (the U-Net denoiser), `images` (the image data shared by the two vision tasks).

Examples:
  >>> TASKS
  ('lm', 'classification', 'diffusion')
"""

from __future__ import annotations

from lpjax.train.tasks.base import Task

from lpjax.train.config import TASKS


def make_task(config, policy=None, workdir: str | None = None) -> Task:
  """The Task of a validated config; `policy` is the run's QuantPolicy (None: built from the
  config by lpjax.train.step._precision.build_policy); `workdir`: the run's (the language model keeps
  its init_from checkpoint's config and tokenizer files there)."""
  if config.task == "lm":
    from lpjax.train.tasks.lm import LanguageModelTask
    return LanguageModelTask(config, policy, workdir)
  if config.task == "classification":
    from lpjax.train.tasks.classification import ClassificationTask
    return ClassificationTask(config, policy)
  if config.task == "diffusion":
    from lpjax.train.tasks.diffusion import DiffusionTask
    return DiffusionTask(config, policy)
  raise ValueError(f"Unknown task {config.task!r}; valid: {', '.join(TASKS)}.")


__all__ = ["TASKS", "Task", "make_task"]
