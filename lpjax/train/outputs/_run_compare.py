"""Which config keys make two runs comparable, and how two runs' configs differ in them.

A recipe comparison (an FP4 run against its bf16 baseline) holds when the runs differ in the
recipe alone: the same steps, batch, sequence length, data, seed, optimizer and schedule, model
and evaluation. The keys that only say how a run is carried out or watched (checkpoints, logging,
the progress bar, the monitor, sharding, debugging, the data pipeline's prefetch and cache) and
the recipe's own keys (the `quant` section) are not compared. train.py's suggested baseline
command carries the compared overrides only (`lpjax.train.cli._cli.next_commands`), and
`python -m lpjax.plot` warns when runs differ in them. Imports no JAX.

Examples:
  >>> compared("optimizer.lr"), compared("monitor.every"), compared("quant.recipe")
  (True, False, False)
  >>> a = flatten({"steps": 160, "quant": {"recipe": "mxfp4"}, "monitor": {"every": 20}})
  >>> differences(a, {"steps": 300, "quant.recipe": "bf16"})
  [('steps', 160, 300)]
"""

from __future__ import annotations

import json
import os

# Sections whose keys never make runs incomparable: the recipe's, and watching or placing a run.
NOT_COMPARED_SECTIONS = ("quant", "monitor", "debug", "mesh", "distributed")
# Keys that change how a run is carried out, not what it computes (or only by rounding order).
NOT_COMPARED_KEYS = frozenset({
    "checkpoint_every", "keep_checkpoints", "resume", "log_every", "progress_bar",
    "max_consecutive_skips", "rollback_on_skips", "max_rollbacks", "grad_accum_steps",
    "data.prefetch", "data.cache_dir", "data.tfds_data_dir", "data.tfds_reader",
    "model.remat", "model.scan_layers", "model.vocab_chunks"})


def compared(key: str) -> bool:
  """Whether dotted config `key` must agree for two runs' losses to be compared."""
  return key.split(".")[0] not in NOT_COMPARED_SECTIONS and key not in NOT_COMPARED_KEYS


def flatten(nested: dict, prefix: str = "") -> dict:
  """{dotted key: value} of a nested dict (a config.json); already flat keys stay as they are."""
  flat = {}
  for k, v in nested.items():
    if isinstance(v, dict):
      flat.update(flatten(v, f"{prefix}{k}."))
    else:
      flat[prefix + k] = v
  return flat


def read_config(workdir: str) -> dict:
  """The flat config of the run in `workdir` (its config.json); {} when it has none."""
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      config = json.load(f)
  except (OSError, ValueError):
    return {}
  return flatten(config) if isinstance(config, dict) else {}


def differences(a: dict, b: dict, *, skip=()) -> list[tuple[str, object, object]]:
  """(key, a's value, b's value) of each compared key (not in `skip`) whose values differ,
  sorted; a key one config lacks differs when the other has it (None stands for absent)."""
  return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
          if compared(k) and k not in skip and a.get(k) != b.get(k)]
