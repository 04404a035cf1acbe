"""Does a workdir's checkpoint fit this config? Structures, config differences, archiving a run.

A checkpoint records its config (the `config` entry of its meta). Resuming compares the saved
state's structure (every array's path, shape and dtype) with the state this config builds: equal
structures resume (config changes such as the recipe or the schedule are logged); different ones
stop the run before anything in the workdir changes, unless `config.resume` says what to do.

Examples:
  >>> config_changes({"steps": 100, "quant.recipe": "mxfp4"}, {"steps": 200, "quant.recipe": "mxfp4"})
  ['steps 100 -> 200']
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time

import jax

from lpjax.train.state._checkpoint import Checkpointer
from lpjax.train.schema._config_schema import ConfigError
from lpjax.train.state._state_structure import StateMismatch  # noqa: F401 (the trainer catches it here)

log = logging.getLogger("lpjax.train")

# What a run leaves in its workdir; `archive_run` moves these aside together.
RUN_FILES = ("checkpoints", "metrics.jsonl", "results.json", "tensorboard", "config.json")


def flat_config(config) -> dict:
  """{dotted key: value} of a ConfigDict, JSON-ready (tuples as lists)."""
  flat = {}

  def walk(prefix, node):
    for k, v in node.items():
      if isinstance(v, dict):
        walk(f"{prefix}{k}.", v)
      else:
        flat[prefix + k] = v
  walk("", json.loads(config.to_json_best_effort()))
  return flat


def config_changes(old: dict, new: dict, *, ignore=("resume",)) -> list[str]:
  """"key old -> new" for each key whose value differs (keys in `ignore` skipped), sorted."""
  return [f"{k} {old.get(k, '(absent)')!r} -> {new.get(k, '(absent)')!r}".replace("'(absent)'",
                                                                                 "(absent)")
          for k in sorted(set(old) | set(new))
          if k not in ignore and old.get(k, "(absent)") != new.get(k, "(absent)")]


def mismatch_message(workdir: str, mismatch: StateMismatch, config: dict) -> str:
  """The one-line error for a checkpoint of another state structure: what differs, the ways on."""
  changes = (config_changes(mismatch.saved_config, config) if mismatch.saved_config is not None
             else [])
  named = ("config changes since: " + ", ".join(changes[:8]) + (", ..." if len(changes) > 8 else "")
           if changes else "the checkpoint does not record its config")
  diffs = mismatch.differences
  return (f"The checkpoint of step {mismatch.step} in {workdir} holds a train state of another "
          f"shape than this config builds ({named}; {len(diffs)} arrays differ, e.g. {diffs[0]}). "
          "Nothing was changed. Use a new --workdir, or --config.resume=restart (archive the old "
          "run under <workdir>/archive/ and start afresh) or --config.resume=params (archive it "
          "and start from its parameters with a fresh optimizer state).")


def archive_run(workdir: str) -> str:
  """Moves the run's files (RUN_FILES) to <workdir>/archive/<UTC time>/; returns that directory."""
  target = os.path.join(workdir, "archive", time.strftime("%Y%m%d-%H%M%S", time.gmtime()))
  base, n = target, 1
  while os.path.exists(target):
    target, n = f"{base}-{n}", n + 1
  os.makedirs(target)
  for name in RUN_FILES:
    source = os.path.join(workdir, name)
    if os.path.exists(source):
      os.replace(source, os.path.join(target, name))
  return target


def resolve_mismatch(trainer, state, mismatch: StateMismatch):
  """config.resume's answer to a checkpoint of another structure: a ConfigError (auto), or the
  old run archived and `state` (restart) or `state` holding its parameters (params) returned.

  `trainer`: the Trainer resuming (its config, workdir, checkpointer; the checkpointer is
  replaced by a fresh one once the old run is archived)."""
  choice = trainer.config.resume
  if choice == "auto":
    raise ConfigError(mismatch_message(trainer.workdir, mismatch, trainer.flat_config))
  kept = {"params": state.params}
  if state.model_state is not None:
    kept["model_state"] = state.model_state
  if choice == "params":
    differences = [d for d in mismatch.differences if d.split("/")[0] in kept]
    if differences:
      raise ConfigError(
          f"--config.resume=params needs the parameters of the checkpoint of step "
          f"{mismatch.step} in {trainer.workdir} to have this config's shapes, but "
          f"{len(differences)} differ (e.g. {differences[0]}). Nothing was changed. Use a new "
          "--workdir or --config.resume=restart.")
    kept = trainer.checkpointer.restore_subtrees(mismatch.step, kept)
  trainer.checkpointer.close()
  archived = archive_run(trainer.workdir) if trainer.is_main else None
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("lpjax archive_run")
  trainer.checkpointer = Checkpointer(os.path.join(trainer.workdir, "checkpoints"),
                                      keep=trainer.config.keep_checkpoints)
  log.warning("The checkpoint of step %d held another state structure (%s); resume=%s: the old "
              "run is archived in %s and this one starts at step 0%s.", mismatch.step,
              mismatch.differences[0], choice, archived,
              " from its parameters" if choice == "params" else "")
  if choice == "params":
    state = dataclasses.replace(state, params=kept["params"],
                                model_state=kept.get("model_state", state.model_state))
  return state
