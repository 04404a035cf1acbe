"""train.py's command line: `--config.x=y` overrides that the config does not have, and flag errors.

ml_collections parses an override only when the config file has its key, and fails with a raw
traceback otherwise (a misspelt key, another task's key, a missing section). `split_overrides`
takes those out of argv before the flags are parsed; `add_overrides` puts them into the loaded
config, where `lpjax.train.validate` names each one with its owner task or the closest valid keys.
`flag_error_message` turns absl's flag errors into one line with the fix. Imports no JAX.

Examples:
  >>> import ml_collections
  >>> c = ml_collections.ConfigDict({"steps": 10, "optimizer": {"lr": 1e-3}})
  >>> argv = ["train.py", "--config.optimizer.lrr=2e-3", "--config.steps=5", "--workdir=w"]
  >>> kept, unknown = split_overrides(argv, c)
  >>> kept, unknown
  (['train.py', '--config.steps=5', '--workdir=w'], [('optimizer.lrr', '2e-3')])
  >>> add_overrides(c, unknown).optimizer.lrr
  0.002
"""

from __future__ import annotations

import ast
import re

import ml_collections

_OVERRIDE = re.compile(r"^--?(no)?config\.([A-Za-z0-9_.]+)(=(.*))?$", re.DOTALL)


def config_path_of(argv) -> str | None:
  """The value of --config in argv (the last one, as absl takes it; None if absent)."""
  path = None
  for i, arg in enumerate(argv):
    m = re.match(r"^--?config(=(.*))?$", arg)
    if m:
      path = m.group(2) if m.group(1) is not None else (argv[i + 1] if i + 1 < len(argv) else None)
  return path


def has_key(config, path: str) -> bool:
  node = config
  for part in path.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      return False
    node = node[part]
  return True


def split_overrides(argv, config):
  """(argv without the overrides of keys `config` lacks, [(dotted key, raw value)] of those)."""
  kept, unknown, skip = [], [], False
  for i, arg in enumerate(argv):
    if skip:
      skip = False
      continue
    m = _OVERRIDE.match(arg)
    if not m or has_key(config, m.group(2)):
      kept.append(arg)
      continue
    if m.group(3) is not None:
      value = m.group(4)
    elif m.group(1):  # --noconfig.x
      value = "False"
    elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
      value, skip = argv[i + 1], True
    else:  # --config.x alone: a boolean switch
      value = "True"
    unknown.append((m.group(2), value))
  return kept, unknown


def _literal(raw: str):
  try:
    return ast.literal_eval(raw)
  except (ValueError, SyntaxError):
    return raw


def add_overrides(config, overrides):
  """`config` with each (key, raw value) set (sections created), for validation to report."""
  from lpjax.train._config_schema import ConfigError

  with config.unlocked():
    for path, raw in overrides:
      node, parts = config, path.split(".")
      for depth, part in enumerate(parts[:-1]):
        if part not in node:
          node[part] = ml_collections.ConfigDict()
        node = node[part]
        if not isinstance(node, ml_collections.ConfigDict):
          prefix = ".".join(parts[:depth + 1])
          raise ConfigError(f"--config.{path}: {prefix} is a value, not a section; set it with "
                            f"--config.{prefix}=<value>.")
      node[parts[-1]] = _literal(raw)
  return config


def flag_error_message(error, config=None) -> str:
  """One line for an absl flag error: the flag, the problem and the fix."""
  text = str(error).strip()
  m = re.match(r"^flag --config\.([A-Za-z0-9_.]+)=(.*?): (.*)$", text, re.DOTALL)
  if m and config is not None and has_key(config, m.group(1)):
    default = config
    for part in m.group(1).split("."):
      default = default[part]
    if isinstance(default, ml_collections.ConfigDict):
      return (f"--config.{m.group(1)} is a section; set its keys, e.g. "
              f"--config.{m.group(1)}.{next(iter(default.keys()), 'key')}=<value>.")
    kind = type(default).__name__
    return (f"--config.{m.group(1)} must be {'an' if kind[0] in 'aeiou' else 'a'} {kind} (like "
            f"its default "
            f"{default!r}), got {m.group(2)!r}: {m.group(3)}.")
  if "--config=None" in text or "Flag --config must have a value" in text:
    return ("--config is required: the path of a config file, e.g. "
            "--config=configs/llama_tiny_mxfp4.py.")
  return f"{text.rstrip('.')}. See python train.py --helpshort."
