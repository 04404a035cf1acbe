"""`validate(config, device_count)`: every problem of a training config, found before anything compiles.

Keys and types are checked first (a wrong key or type stops there, with every such problem
named). Then every value: ranges of each numeric hyperparameter, names, the model and data
against each other and against the machine. All problems found are reported in one ConfigError,
one line each, with the fix.

Examples:
  >>> from lpjax.train.config import llama_config
  >>> c = llama_config("tiny")
  >>> c.optimizer.lr, c.optimizer.b2, c.eval_steps = float("nan"), 1.5, 0
  >>> try:
  ...   validate(c, device_count=1)
  ... except ConfigError as e:
  ...   print(e)
  3 problems in the config:
    - eval_steps must be >= 1 (batches per evaluation), got 0.
    - optimizer.lr must be a finite number >= 0, got nan.
    - optimizer.b2 must be in [0, 1), got 1.5.
"""

from __future__ import annotations

import difflib
import math
import re

import ml_collections

from lpjax.train.schema._config_schema import (GRAD_ACCUM_DTYPES, OPTIMIZERS, PARAM_ROUNDINGS,
                                        RESUME_CHOICES, STATE_DTYPES, TASKS, ConfigError,
                                        base_config, flat_keys, task_keys, tasks_of)
from lpjax.train.schema._quant_rules import format_rules, rule_problems
# the model and data checks, and parse_schedule (re-exported: lpjax.train.config imports it here)
from lpjax.train.schema._validate_model_data import (check_data_keys, parse_schedule, validate_lm,
                                              validate_vision)

__all__ = ["ConfigError", "canonical_recipe", "check_keys_and_types", "parse_schedule",
           "validate"]


class _Problems(list):
  """The messages of one validation; `raise_if_any` raises them as one ConfigError."""

  def raise_if_any(self):
    if len(self) == 1:
      raise ConfigError(self[0])
    if self:
      raise ConfigError(f"{len(self)} problems in the config:\n" +
                        "\n".join(f"  - {p}" for p in self))




def _owners(key: str) -> str:
  tasks = tasks_of(key)
  names = " and ".join(repr(t) for t in tasks)
  return f"task{'s' if len(tasks) > 1 else ''} {names}"


def _did_you_mean(key: str) -> str:
  """`key`, with the closest key of any task's schema ("optimizer.lrr (did you mean
  optimizer.lr?)")."""
  known = sorted(set().union(*(task_keys(t) for t in TASKS)))
  close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
  if not close:  # a misspelt section: compare the leaf names within the sections
    leaf = key.rsplit(".", 1)[-1]
    close = [k for k in known if k.rsplit(".", 1)[-1] == leaf][:1]
  return f"{key} (did you mean {close[0]}?)" if close else key


# Names a user may reach for that are another object's spelling of a config key.
KEY_ALIASES = {
    "quant.keep_first_blocks": "quant.keep_first",  # QuantPolicy(keep_first_blocks=...)
    "quant.keep_last_blocks": "quant.keep_last",  # QuantPolicy(keep_last_blocks=...)
}
KEY_LIST_HINT = ("python train.py --config=<file> --print_config lists every key with its "
                 "default and meaning")


def _unknown_key(key: str) -> str:
  if key in KEY_ALIASES:
    return (f"{key} (QuantPolicy's argument name; the config key is {KEY_ALIASES[key]}, "
            f"--config.{KEY_ALIASES[key]}=N)")
  return _did_you_mean(key)


def _check_keys(config):
  """Every key belongs to the schema of config.task; unknown and other tasks' keys are named."""
  keys = flat_keys(config)
  unknown = sorted(k for k in keys if not tasks_of(k))
  if unknown:
    raise ConfigError(f"Unknown config key(s): {', '.join(_unknown_key(k) for k in unknown)}. "
                      f"Check the spelling; {KEY_LIST_HINT}.")
  task = config.get("task")
  if task not in TASKS:
    raise ConfigError(f"task {task!r} is unknown; valid: {', '.join(TASKS)}.")
  foreign = sorted(keys - task_keys(task))
  if foreign:
    owned = "; ".join(f"{k} applies to {_owners(k)} only" for k in foreign)
    raise ConfigError(f"{owned}; this config's task is {task!r}. Start from "
                      f"base_config({task!r}) (lpjax/train/config.py), or remove the key(s).")
  missing = sorted(task_keys(task) - keys)
  if missing:
    raise ConfigError(f"Config key(s) of task {task!r} missing: {', '.join(missing)}. Start from "
                      f"base_config({task!r}) (lpjax/train/config.py), which has every key.")


def check_keys_and_types(config):
  """The key and type checks of `validate` alone (no values, no machine): what
  `train.py --print_config` needs before it prints a config."""
  _check_keys(config)
  problems = _Problems()
  _check_types(config, base_config(config.task), problems)
  problems.raise_if_any()


def canonical_recipe(value):
  """`value` as lpjax.quant.recipes knows it: the preset name in any case ('NVFP4' ->
  'nvfp4', 'MXFP4:block_size=16' -> 'mxfp4:block_size=16'); None when it is no recipe.

  Examples:
    >>> canonical_recipe("NVFP4"), canonical_recipe("MXFP4:block_size=16"), canonical_recipe("x")
    ('nvfp4', 'mxfp4:block_size=16', None)
  """
  from lpjax.quant import recipes

  candidates = [value]
  if isinstance(value, str):
    preset, sep, rest = value.strip().partition(":")
    candidates.append(preset.lower() + sep + rest)
  for candidate in candidates:
    try:
      recipes.get(candidate)
      return candidate
    except (ValueError, TypeError):
      continue
  return None


def _recipe_hint(value) -> str:
  """' (did you mean 'mxfp4' or 'mxfp8'?)' for a recipe name close to known ones, else ''."""
  from lpjax.quant import recipes

  if not isinstance(value, str):
    return ""
  close = difflib.get_close_matches(value.strip().lower(), recipes.NAMES, n=3, cutoff=0.6)
  return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def _check_types(config, reference, problems, prefix=""):
  """Each field has its default's type (an int where a float is expected is fine)."""
  for key, default in reference.items():
    value, name = config[key], prefix + key
    if isinstance(default, ml_collections.ConfigDict):
      if not isinstance(value, ml_collections.ConfigDict):
        problems.append(f"{name} must be a section (ConfigDict), got {type(value).__name__}.")
      else:
        _check_types(value, default, problems, name + ".")
      continue
    expected = type(default)
    ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
    ok = ok or (expected is float and isinstance(value, int) and not isinstance(value, bool))
    if not ok:
      problems.append(f"{name} must be a {expected.__name__} (like its default {default!r}), "
                      f"got {value!r} of type {type(value).__name__}.")


def _at_least(problems, name, value, low, what=""):
  if not (math.isfinite(value) and value >= low):
    problems.append(f"{name} must be a finite number >= {low:g}{what}, got {value!r}.")


def _in_unit(problems, name, value, closed_top=False):
  ok = math.isfinite(value) and 0 <= value and (value <= 1 if closed_top else value < 1)
  if not ok:
    problems.append(f"{name} must be in [0, 1{']' if closed_top else ')'}, got {value!r}.")


def _check_numbers(config, problems):
  """Ranges of the loop's counts and of every optimizer hyperparameter."""
  for name in ("steps", "batch_size", "log_every", "max_consecutive_skips"):
    if config[name] <= 0:
      problems.append(f"{name} must be positive, got {config[name]}.")
  for name in ("eval_every", "checkpoint_every", "max_rollbacks"):
    if config[name] < 0:
      problems.append(f"{name} must be >= 0, got {config[name]}.")
  if config.task == "lm" and config.eval_steps < 1:  # the image tasks read 0 as the whole split
    problems.append(f"eval_steps must be >= 1 (batches per evaluation), got {config.eval_steps}.")
  elif config.eval_steps < 0:
    problems.append(f"eval_steps must be >= 0 (0: the whole eval split), got {config.eval_steps}.")
  if config.keep_checkpoints < 1:
    problems.append(f"keep_checkpoints must be >= 1 (the last checkpoint is what a crash resumes "
                    f"from), got {config.keep_checkpoints}.")
  o = config.optimizer
  _at_least(problems, "optimizer.lr", o.lr, 0)
  if o.warmup_steps < 0:
    problems.append(f"optimizer.warmup_steps must be >= 0, got {o.warmup_steps}.")
  _in_unit(problems, "optimizer.min_lr_ratio", o.min_lr_ratio, closed_top=True)
  _at_least(problems, "optimizer.weight_decay", o.weight_decay, 0)
  _at_least(problems, "optimizer.grad_clip", o.grad_clip, 0, " (0: off)")
  for name in ("b1", "b2", "gamma1", "gamma2", "gamma3"):
    _in_unit(problems, f"optimizer.{name}", o[name])
  if not (math.isfinite(o.eps) and o.eps > 0):
    problems.append(f"optimizer.eps must be a finite number > 0, got {o.eps!r}.")
  if o.reset_interval < 0:
    problems.append(f"optimizer.reset_interval must be >= 0, got {o.reset_interval}.")
  if "total_steps" in o and o.total_steps < -1:
    problems.append(f"optimizer.total_steps must be >= 0 (0: off) or -1 (the run's steps), got "
                    f"{o.total_steps}.")
  if "eta_min" in o:
    _in_unit(problems, "optimizer.eta_min", o.eta_min, closed_top=True)


def _check_names(config, problems):
  from lpjax.quant import recipes

  if config.optimizer.name not in OPTIMIZERS:
    problems.append(f"optimizer.name {config.optimizer.name!r} is unknown; valid: "
                    f"{', '.join(OPTIMIZERS)}.")
  if config.optimizer.state_dtype not in STATE_DTYPES:
    problems.append(f"optimizer.state_dtype must be one of {', '.join(STATE_DTYPES)}.")
  if config.optimizer.param_rounding not in PARAM_ROUNDINGS:
    valid = " or ".join(map(repr, PARAM_ROUNDINGS))
    problems.append(f"optimizer.param_rounding must be {valid} (how bfloat16 parameters take "
                    f"their updates), got {config.optimizer.param_rounding!r}.")
  if config.grad_accum_dtype not in GRAD_ACCUM_DTYPES:
    valid = " or ".join(map(repr, GRAD_ACCUM_DTYPES))
    problems.append(f"grad_accum_dtype must be {valid} (the sum of the microbatch gradients), got "
                    f"{config.grad_accum_dtype!r}.")
  if config.model.get("param_dtype", "float32") not in ("float32", "bfloat16"):
    problems.append(f"model.param_dtype must be 'float32' or 'bfloat16' (master weights), got "
                    f"{config.model.param_dtype!r}.")
  if config.resume not in RESUME_CHOICES:
    problems.append(f"resume {config.resume!r} is unknown; valid: {', '.join(RESUME_CHOICES)}.")
  for field in ("recipe", "high_precision_recipe"):
    value = config.quant[field]
    if canonical_recipe(value) is not None:
      continue
    preset, sep, rest = value.strip().partition(":") if isinstance(value, str) else (value, "", "")
    if sep and canonical_recipe(preset) is not None:
      # a variant of a known preset: the spec parser names the problem
      try:
        recipes.get(canonical_recipe(preset) + sep + rest)
      except (ValueError, TypeError) as e:
        problems.append(f"quant.{field}: {e} (grammar '<preset>:key=value,...'; docs/gemm.md, "
                        "\"Recipe variants\").")
    else:
      also = " or 'auto' (each kept GEMM as given, in the model's own dtype)," if (
          field == "high_precision_recipe") else ""
      problems.append(f"quant.{field} {value!r} is unknown{_recipe_hint(preset)}; valid: "
                      f"{', '.join(recipes.NAMES)} (in any case),{also} or a variant "
                      "'<preset>:key=value,...' such as 'mxfp4:block_size=16' (docs/gemm.md, "
                      "\"Recipe variants\").")
  problems.extend(rule_problems(config.quant.rules, canonical_recipe)[0])
  if config.quant.residuals not in ("", "high_precision", "quantized"):
    problems.append("quant.residuals must be '', 'high_precision' or 'quantized'.")
  if config.quant.policy not in ("default", "pure"):
    problems.append("quant.policy must be 'default' or 'pure'.")
  for name in ("keep_first", "keep_last"):
    if config.quant[name] < 0:
      problems.append(f"quant.{name} must be >= 0 (blocks kept in high precision), got "
                      f"{config.quant[name]}.")
  if not 0.0 <= config.quant.keep_last_fraction < 1.0:
    problems.append(f"quant.keep_last_fraction must be in [0, 1) (the NVIDIA recipe keeps 0.15), "
                    f"got {config.quant.keep_last_fraction}.")
  fractions = {k: config.quant[k] for k in ("warmup_fraction", "qaf_fraction", "finish_fraction")}
  bad = [f"quant.{k}={v}" for k, v in fractions.items() if not 0.0 <= v <= 1.0]
  if bad:
    problems.append(f"{', '.join(bad)}: each phase fraction must be in [0, 1].")
  elif sum(fractions.values()) > 1.0:
    problems.append("quant.warmup_fraction + quant.qaf_fraction + quant.finish_fraction must be "
                    f"<= 1, got {sum(fractions.values()):g}.")


def _check_monitor(config, problems):
  """The monitor section: counts, thresholds and the fallback recipe."""
  m = config.monitor
  if m.every < 0:
    problems.append(f"monitor.every must be >= 0 (steps between measurements; 0: off), got "
                    f"{m.every}.")
  for name in ("min_grad_noise_ratio", "max_flushed", "max_saturated", "max_clamped_scales"):
    _at_least(problems, f"monitor.{name}", m[name], 0)
  if not math.isfinite(m.min_out_snr_db):
    problems.append(f"monitor.min_out_snr_db must be a finite number (dB), got "
                    f"{m.min_out_snr_db!r}.")
  if m.fallback_after < 1:
    problems.append(f"monitor.fallback_after must be >= 1 (failing measurements in a row before a "
                    f"pass falls back), got {m.fallback_after}.")
  if m.max_fallback_sites < 0:
    problems.append(f"monitor.max_fallback_sites must be >= 0, got {m.max_fallback_sites}.")
  if m.fallback and not m.every:
    problems.append("monitor.fallback=True needs the monitor: set monitor.every > 0 (e.g. 100).")
  try:
    re.compile(config.debug.monitor_fail_path)
  except re.error as e:
    problems.append(f"debug.monitor_fail_path {config.debug.monitor_fail_path!r} is no regex "
                    f"({e}).")
  if canonical_recipe(m.fallback_recipe) is None:
    from lpjax.quant import recipes
    problems.append(f"monitor.fallback_recipe {m.fallback_recipe!r} is unknown; valid: "
                    f"{', '.join(recipes.NAMES)} (bf16 or mxfp8 are the useful ones).")


def validate(config, device_count: int, process_count: int = 1):
  """Checks `config` and fills derived fields (mesh.data); raises ConfigError with every problem."""
  _check_keys(config)
  problems = _Problems()
  _check_types(config, base_config(config.task), problems)
  problems.raise_if_any()  # the value checks below rely on the types
  _check_names(config, problems)
  _check_numbers(config, problems)
  _check_monitor(config, problems)
  heads = validate_lm(config, problems) if config.task == "lm" else validate_vision(config, problems)
  check_data_keys(config, problems)
  data = _check_mesh(config, device_count, process_count, heads, problems)
  problems.raise_if_any()
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.mesh.data = data
    for field in ("recipe", "high_precision_recipe"):  # 'NVFP4' runs as 'nvfp4'
      config.quant[field] = canonical_recipe(config.quant[field])
    config.monitor.fallback_recipe = canonical_recipe(config.monitor.fallback_recipe)
    config.quant.rules = format_rules(rule_problems(config.quant.rules, canonical_recipe)[1])
  return config


def _check_mesh(config, device_count, process_count, heads, problems) -> int:
  """The resolved mesh.data; problems with the mesh and the batch are appended."""
  fsdp, tensor, data = config.mesh.fsdp, config.mesh.tensor, config.mesh.data
  if fsdp < 1 or tensor < 1:
    problems.append("mesh.fsdp and mesh.tensor must be >= 1.")
    return data
  if data == -1:
    if device_count % (fsdp * tensor):
      problems.append(f"mesh.fsdp * mesh.tensor = {fsdp * tensor} does not divide the "
                      f"{device_count} devices.")
      return data
    data = device_count // (fsdp * tensor)
  if data * fsdp * tensor != device_count:
    problems.append(f"Impossible mesh: data {data} x fsdp {fsdp} x tensor {tensor} = "
                    f"{data * fsdp * tensor}, but there are {device_count} devices. Set "
                    "mesh.data=-1 to use all remaining devices.")
    return data
  if config.batch_size % (data * fsdp) or config.batch_size % process_count:
    problems.append(f"batch_size {config.batch_size} is not divisible by the {data * fsdp} batch "
                    f"shards (mesh.data x mesh.fsdp) and {process_count} processes; use a "
                    "multiple of both.")
  elif config.grad_accum_steps < 1 or config.batch_size % (config.grad_accum_steps * data * fsdp):
    problems.append(f"batch_size {config.batch_size} is not divisible by grad_accum_steps "
                    f"{config.grad_accum_steps} x the {data * fsdp} batch shards; every "
                    "microbatch needs the same number of rows on each shard.")
  if tensor > 1 and heads and heads % tensor:
    problems.append(f"mesh.tensor {tensor} must divide the {heads} attention heads.")
  return data
