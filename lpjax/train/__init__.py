"""lpjax.train: the training program (config, mesh and sharding, train step, checkpoints, metrics).

Examples:
  >>> from lpjax.train import config
  >>> config.llama_config("tiny").model.size
  'tiny'
"""

from lpjax.train.config import ConfigError, base_config, llama_config, validate


def train_and_evaluate(config, workdir):
  """Trains `config` in `workdir`; see lpjax.train.trainer."""
  from lpjax.train.trainer import train_and_evaluate as run

  return run(config, workdir)


__all__ = ["ConfigError", "base_config", "llama_config", "train_and_evaluate", "validate"]
