"""train.py's command line: `--config.x=y` overrides that the config does not have, and flag errors.

ml_collections parses an override only when the config file has its key, and fails with a raw
traceback otherwise (a misspelt key, another task's key, a missing section). `split_overrides`
takes those out of argv before the flags are parsed; `add_overrides` puts them into the loaded
config, where `lpjax.train.validate` names each one with its owner task or the closest valid keys.
`flag_error_message` turns absl's flag errors into one line with the fix; `config_file_problem`
names a --config that is a folder or not a Python file; `format_config` is `--print_config`'s
listing (every key, its value, its default when it differs, and its meaning). Imports no JAX.

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
import functools
import importlib.util
import inspect
import json
import os
import re
import shlex

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
  from lpjax.train.schema._config_schema import ConfigError

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


def config_file_problem(path: str) -> str | None:
  """Why `path` (a --config value, maybe 'file.py:arg') cannot be a config file; None if it can."""
  file = path.split(":", 1)[0]
  example = "e.g. --config=configs/llama_tiny_mxfp4.py"
  if os.path.isdir(file):
    names = sorted(n for n in os.listdir(file) if n.endswith(".py") and not n.startswith("_"))
    some = (f" ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})" if names else "")
    return (f"--config={path} is a folder; give one config file in it{some}, "
            f"{example}.")
  if os.path.isfile(file) and not file.endswith(".py"):
    return (f"--config={path} is not a Python config file; give a .py file whose get_config() "
            f"returns the config, as the files in configs/ do, {example}.")
  return None


def load_error_message(path: str, error: BaseException) -> str:
  """One line for a config file that fails to load (a syntax error, an exception in it)."""
  where = ""
  if isinstance(error, SyntaxError) and error.lineno:
    where = f" (line {error.lineno})"
    error_text = error.msg
  else:
    error_text = str(error).strip().splitlines()[0] if str(error).strip() else ""
  return (f"--config={path} could not be loaded{where}: {type(error).__name__}"
          f"{': ' + error_text if error_text else ''}. A config file is Python with a "
          "get_config() returning the config, like configs/llama_tiny_mxfp4.py.")


_ASSIGN = re.compile(r"^\s*c\.([A-Za-z0-9_.]+)\s*=\s*(.*?)\s*(?:#\s*(.*))?$")


@functools.lru_cache(maxsize=None)
def config_comments() -> dict:
  """{dotted key: its comment in base_config}: the trailing comment of its line, or the comment
  lines just above it.

  Examples:
    >>> config_comments()["optimizer.lr"]
    'peak learning rate'
  """
  from lpjax.train.schema._config_schema import base_config

  comments, pending = {}, []
  for line in inspect.getsource(base_config).splitlines():
    stripped = line.strip()
    if stripped.startswith("#"):
      pending.append(stripped.lstrip("#").strip())
      continue
    m = _ASSIGN.match(line)
    if m and "ConfigDict()" not in m.group(2):
      text = m.group(3) or " ".join(pending)
      if text and m.group(1) not in comments:
        comments[m.group(1)] = text
    pending = []
  return comments


def format_config(config, *, source: str = "") -> str:
  """The config as `key = value  # meaning` lines in schema order (`[default x]` where it differs
  from base_config's), for `train.py --print_config`.

  Examples:
    >>> from lpjax.train.config import llama_config
    >>> c = llama_config("tiny", recipe="nvfp4")
    >>> print(next(l for l in format_config(c).splitlines() if l.startswith("optimizer.lr")))
    optimizer.lr = 0.001  # peak learning rate
    >>> c.steps = 50
    >>> print(next(l for l in format_config(c).splitlines() if l.startswith("steps")))
    steps = 50  # optimizer steps [default 1000]
  """
  from lpjax.train.schema._config_schema import TASKS, base_config

  comments = config_comments()
  task = config.get("task", "lm")
  reference = base_config(task if task in TASKS else "lm",
                          optimizer=config.get("optimizer", {}).get("name", "adamw"))

  def lines(node, ref, prefix):
    items = sorted(node.items(), key=lambda kv: isinstance(kv[1], ml_collections.ConfigDict))
    for key, value in items:  # a section's plain keys first, then its sub-sections
      name = prefix + key
      if isinstance(value, ml_collections.ConfigDict):
        yield ""
        yield f"# {name}"
        yield from lines(value, ref.get(key, {}) if isinstance(ref, ml_collections.ConfigDict)
                         else {}, name + ".")
        continue
      default = ref.get(key, "(none)") if isinstance(ref, ml_collections.ConfigDict) else "(none)"
      note = f" [default {default!r}]" if default != value else ""
      comment = comments.get(name, "")
      yield f"{name} = {value!r}" + (f"  # {comment}" if comment or note else "") + note

  head = [f"# The config{' of ' + source if source else ''}, task {task!r}: every key, its value, "
          "and what it means.", "# Override any key with --config.<key>=<value>."]
  return "\n".join(head + list(lines(config, reference, ""))) + "\n"


def remove_if_empty(workdir: str, ignore=(".lock",)) -> bool:
  """Removes `workdir` when it holds no file but `ignore`d ones (a start that failed before
  writing anything); True if it did. A workdir with any other file is left as it is.

  Examples:
    >>> import tempfile
    >>> d = os.path.join(tempfile.mkdtemp(), "run")
    >>> os.makedirs(os.path.join(d, "checkpoints"))
    >>> remove_if_empty(d), os.path.exists(d)
    (True, False)
  """
  if not os.path.isdir(workdir):
    return False
  for _, _, files in os.walk(workdir):
    if any(f not in ignore for f in files):
      return False
  import shutil
  shutil.rmtree(workdir, ignore_errors=True)
  return not os.path.exists(workdir)


_FULL_PRECISION = ("bf16", "fp32")
PLOT_REQUIREMENTS = "requirements-plot.txt"  # matplotlib, pinned (make plot installs it)


def _shell_quoted(flag: str) -> str:
  """"--name=value" with the value quoted for a shell when it needs it (a data.path with a space
  or a glob): "--config.data.path='my corpus/*.txt'"."""
  name, eq, value = flag.partition("=")
  return f"{name}={shlex.quote(value)}" if eq else flag


def _flag_key(flag: str) -> str:
  """"optimizer.lr" of "--config.optimizer.lr=2e-3"."""
  return flag.partition("=")[0].split("config.", 1)[-1]


def _name_part(flags) -> str:
  """The differences the baseline's flags make, for its workdir name: "steps160_lr0.002" (a short
  hash when that would be long)."""
  import hashlib

  parts = []
  for flag in flags:
    value = re.sub(r"[^A-Za-z0-9.+-]+", "-", flag.partition("=")[2]).strip("-")
    parts.append(_flag_key(flag).split(".")[-1] + value)
  name = "_".join(parts)
  if len(name) > 48:
    name = "cfg" + hashlib.sha1(" ".join(flags).encode()).hexdigest()[:8]
  return name


def _baseline_config(config_file: str, flags, recipe: str) -> dict:
  """The flat config `train.py --config=config_file *flags --config.quant.recipe=recipe` trains
  with; {} when it cannot be worked out (then no existing workdir counts as the same run)."""
  from lpjax.train.outputs._run_compare import flatten

  try:
    from lpjax.train.config import load_config_file

    config = load_config_file(config_file)
    with config.unlocked():
      for flag in flags:
        node, parts = config, _flag_key(flag).split(".")
        for part in parts[:-1]:
          node = node[part]
        node[parts[-1]] = _literal(flag.partition("=")[2]) if "=" in flag else True
      config.quant.recipe = recipe
    return flatten(json.loads(config.to_json_best_effort()))
  except Exception:  # noqa: BLE001 -- a suggestion only: an unknown baseline is a fresh workdir
    return {}


def _fresh_workdir(target: str, expected: dict, own: str) -> tuple[str, bool]:
  """(workdir, whether it already holds the run `expected` describes): `target`, or `target`-2,
  -3, ... past the existing workdirs of other runs. Never `own` (the run's own workdir)."""
  from lpjax.train.outputs._run_compare import differences, read_config

  candidate, n = target, 2
  while os.path.lexists(candidate):
    existing = read_config(candidate)
    if (expected and existing and os.path.abspath(candidate) != os.path.abspath(own)
        and not differences(expected, existing)
        and existing.get("quant.recipe") == expected.get("quant.recipe")):
      return candidate, True
    candidate, n = f"{target}-{n}", n + 1
  return candidate, False


def next_commands(config_path: str, workdir: str, recipe: str, overrides=(),
                  python: str = "python", *,
                  have_matplotlib: bool | None = None) -> list[tuple[str, str]]:
  """(command, what it does) pairs that train.py's summary suggests after a run: plot it, train
  its baseline in the other precision (the sibling config file, e.g. *_bf16.py for *_mxfp4.py,
  or the same file with --config.quant.recipe), and plot both together. Without matplotlib
  (`have_matplotlib`; None: look for it; `make train` installs only what training needs) the
  first command installs the plot requirements.

  `overrides`: the run's --config.x=y flags. The baseline keeps only those that make the two
  runs comparable (steps, batch, sequence length, data, seed, optimizer and schedule, model,
  evaluation: `lpjax.train.outputs._run_compare.compared`), not the monitor, logging, checkpoint or
  recipe ones. Its workdir names those differences (runs/exp_bf16_steps50) and is never an
  existing workdir of another run (a -2, -3, ... is added); an existing workdir that holds the
  same baseline (its config.json) is suggested as it is, and the command says already complete.

  Examples:
    >>> for c, what in next_commands("/nonexistent/exp_mxfp4.py", "runs/exp", "mxfp4",
    ...                              ["--config.steps=50", "--config.monitor.every=10"],
    ...                              have_matplotlib=True):
    ...   print(c, "#", what)
    python -m lpjax.plot runs/exp # its loss curves as a PNG
    python train.py --config=/nonexistent/exp_mxfp4.py --config.steps=50 --config.quant.recipe=bf16 --workdir=runs/exp_bf16_steps50 # the same run in bf16, the baseline
    python -m lpjax.plot runs/exp runs/exp_bf16_steps50 # both runs in one picture, with the gap

  With a sibling config file (configs/llama_tiny_bf16.py beside configs/llama_tiny_mxfp4.py) the
  baseline is that file, in the workdir train.py gives it by default (runs/llama_tiny_bf16) when
  the run has no compared overrides.
  """
  from lpjax.train.outputs._run_compare import compared, read_config

  if have_matplotlib is None:
    have_matplotlib = importlib.util.find_spec("matplotlib") is not None
  commands = []
  if not have_matplotlib:
    commands.append((f"{python} -m pip install -r {PLOT_REQUIREMENTS}",
                     "matplotlib, for the plots (what `make plot` installs)"))
  commands.append((f"{python} -m lpjax.plot {workdir}", "its loss curves as a PNG"))
  low = recipe.split(":")[0] not in _FULL_PRECISION
  other = "bf16" if low else "mxfp4"
  folder, name = os.path.split(config_path)
  stem, ext = os.path.splitext(name)
  tokens = stem.split("_")
  swap = [i for i, t in enumerate(tokens) if t.lower() in (recipe.split(":")[0].lower(),
                                                            *_FULL_PRECISION, "mxfp4", "nvfp4")]
  kept = [o for o in overrides if o.startswith("--config.") and compared(_flag_key(o))]
  flags = [_shell_quoted(o) for o in kept]
  sibling = None
  if swap:
    tokens[swap[-1]] = other
    sibling = os.path.join(folder, "_".join(tokens) + ext)
  parent = os.path.dirname(workdir.rstrip("/"))
  suffix = "_" + _name_part(kept) if kept else ""
  if sibling and os.path.isfile(sibling):
    target = os.path.join(parent, os.path.splitext(os.path.basename(sibling))[0])
    if target == workdir:
      target += "_" + other
    expected = _baseline_config(sibling, kept, other) if os.path.lexists(target + suffix) else {}
    target, done = _fresh_workdir(target + suffix, expected, workdir)
    args = [f"--config={sibling}", *flags, f"--workdir={target}"]
  else:
    expected = read_config(workdir)
    expected = dict(expected, **{"quant.recipe": other}) if expected else {}
    target, done = _fresh_workdir(workdir.rstrip("/") + "_" + other + suffix, expected, workdir)
    args = [f"--config={config_path}", *flags, f"--config.quant.recipe={other}",
            f"--workdir={target}"]
  what = "the same run in bf16, the baseline" if low else "the same run in MXFP4, to compare"
  if done:
    what += f" ({target} holds it already: the command resumes it or says already complete)"
  commands.append((f"{python} train.py " + " ".join(args), what))
  commands.append((f"{python} -m lpjax.plot {workdir} {target}",
                   "both runs in one picture, with the gap"))
  return commands
