"""The on-disk record of ablation runs: DIR/runs/<sweep>/<row>/seed<k>/run.json (the config key
and the machine of each run), which runs are finished, and which finished run a planned one may
reuse. Used by benchmarks/sweeps/ablate.py."""

from __future__ import annotations

import json
import os

import ablate_sweeps as sweeps
import run_machine


def is_done(workdir: str, retry_failed: bool) -> bool:
  if os.path.exists(os.path.join(workdir, "results.json")):
    return True
  return not retry_failed and os.path.exists(os.path.join(workdir, "failed.json"))


def recorded(workdir: str) -> dict:
  """The run.json of a workdir ({} if there is none)."""
  path = os.path.join(workdir, "run.json")
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def finished_index(out: str, retry_failed: bool, here: dict) -> dict:
  """run key -> workdir of every finished run under DIR/runs that ran on machine `here`."""
  index, root = {}, os.path.join(out, "runs")
  if not os.path.isdir(root):
    return index
  for dirpath, _, files in os.walk(root):
    if "run.json" in files and is_done(dirpath, retry_failed):
      record = recorded(dirpath)
      if run_machine.same_machine(record.get("machine"), here):
        index.setdefault(record["key"], dirpath)
  return index


def write_run_json(task, key: str, machine: dict | None, extra=None):
  """run.json of a task: its row, seed, config key and the machine it ran on (`machine`)."""
  os.makedirs(task.workdir, exist_ok=True)
  with open(os.path.join(task.workdir, "run.json"), "w") as f:
    json.dump({"sweep": task.sweep, "row": task.row.label, "recipe": task.row.recipe,
               "optimizer": task.row.optimizer, "seed": task.seed, "key": key,
               "machine": machine, **(extra or {})}, f, indent=1)


def set_aside(workdir: str) -> str:
  """Renames a finished run from another machine to <workdir>.other-machine[-N]; returns the name."""
  target, n = f"{workdir}.other-machine", 1
  while os.path.exists(target):
    n += 1
    target = f"{workdir}.other-machine-{n}"
  os.rename(workdir, target)
  return target


def same_run(recorded: str, key: str) -> bool:
  """Whether a run recorded under key `recorded` is the run `key` asks for: equal keys, or keys
  that differ only in config fields added to lpjax after the run, each at its default (the
  behaviour the run had before the field existed).

  Examples:
    >>> same_run('{"a": 1}', '{"a": 1, "grad_accum_dtype": "float32"}')
    True
    >>> same_run('{"a": 1}', '{"a": 1, "grad_accum_dtype": "bfloat16"}')
    False
    >>> same_run('{"a": 1}', '{"a": 2}')
    False
  """
  if recorded == key:
    return True
  from lpjax.train import config as cfg_lib
  old, new = json.loads(recorded), json.loads(key)
  if any(k not in new or new[k] != v for k, v in old.items()):
    return False
  defaults = sweeps.flat(cfg_lib.base_config(new.get("task", "lm")))
  return all(k in defaults and json.dumps(defaults[k], default=str) == json.dumps(new[k])
             for k in new.keys() - old.keys())
