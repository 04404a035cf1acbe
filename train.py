"""Trains a model from a config file. Flags only; the program is lpjax.train.train_and_evaluate.

    python train.py --config=configs/llama_tiny_mxfp4.py --workdir=runs/tiny
    python train.py --config=configs/llama_60m_mxfp4.py --config.optimizer.lr=2e-3 --workdir=runs/60m
    python train.py --config=configs/llama_tiny_mxfp4.py --print_config   # every config key

Every key of a config (its value, default and meaning) is listed by --print_config; any of them is
set with --config.<key>=<value>, e.g. --config.steps=100 --config.quant.recipe=nvfp4.
"""

import os
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to a config file in configs/. Its keys are set with "
    "--config.<key>=<value>; --print_config lists them all with their meaning.", lock_config=True)
_PRINT_CONFIG = flags.DEFINE_bool(
    "print_config", False, "Print the resolved config (the file plus the --config.x=y overrides) "
    "with each key's default and meaning, and exit without training.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and results.")
_CACHE = flags.DEFINE_string(
    "compilation_cache", os.path.join("~", ".cache", "lpjax", "jax_compilation_cache"),
    "JAX's persistent compilation cache: a re-run, a resumed run or another seed of the same "
    "config loads the compiled train step instead of compiling it again. '' turns it off; "
    "JAX_COMPILATION_CACHE_DIR, when set, wins.")


_UNKNOWN_OVERRIDES = []  # (key, raw value) of --config.x=y whose key the config file lacks


def _user_error(kind: str, message, status: int = 2):
  """One message, no traceback (unless --verbosity=1 or LPJAX_TRACEBACK=1 asks for it)."""
  if flags.FLAGS.is_parsed() and flags.FLAGS.verbosity >= 1 or (
      os.environ.get("LPJAX_TRACEBACK") == "1"):
    raise message if isinstance(message, BaseException) else SystemExit(f"{kind}: {message}")
  print(f"{kind}: {message}\n(--verbosity=1 or LPJAX_TRACEBACK=1 shows the traceback.)",
        file=sys.stderr)
  sys.exit(status)


def _parse_flags(argv):
  """absl's parsing, with every flag problem as one message and exit status 2. Overrides of keys
  the config file lacks are kept out of ml_collections (which fails on them with a traceback)
  and added in main(), so that lpjax.train.validate names them with the fix."""
  from ml_collections.config_flags.config_flags import ConfigFileFlagParser

  from lpjax.train.cli import _cli

  path, config = _cli.config_path_of(argv), None
  if path is not None:
    problem = _cli.config_file_problem(path)  # a folder, or not a Python file
    if problem:
      _user_error("Config error", problem)
    if not os.path.isfile(path.split(":", 1)[0]):
      _user_error("Flag error", f"--config={path}: no such file; give the path of a config file, "
                  "e.g. --config=configs/llama_tiny_mxfp4.py.")
    try:
      config = ConfigFileFlagParser("config", lock_config=False).parse(path)
    except Exception as e:  # a syntax error or an exception in the file: the user's to fix
      _user_error("Config error", _cli.load_error_message(path, e))
    argv, _UNKNOWN_OVERRIDES[:] = _cli.split_overrides(argv, config)
    sys.argv[:] = argv  # ml_collections reads its overrides from sys.argv itself
  try:
    return flags.FLAGS(argv)
  except (flags.Error, KeyError, AttributeError) as e:
    _user_error("Flag error", _cli.flag_error_message(e, config))


def main(argv):
  if len(argv) > 1:
    _user_error("Flag error", f"unexpected arguments {argv[1:]}: flags take the form --name=value "
                "(--config.optimizer.lr=2e-3, --workdir=runs/x).")
  from lpjax.train import CheckpointWriteError, ConfigError
  from lpjax.train.cli import _cli

  if _PRINT_CONFIG.value:  # before JAX or logging start
    from lpjax.train.schema._validate import check_keys_and_types
    try:
      config = _cli.add_overrides(_CONFIG.value, _UNKNOWN_OVERRIDES)
      check_keys_and_types(config)
    except ConfigError as e:
      _user_error("Config error", e)
    print(_cli.format_config(config, source=flags.FLAGS["config"].config_filename), end="")
    return
  from lpjax.train import train_and_evaluate  # after flags: keeps --help fast
  from lpjax.train import setup_logging, use_compilation_cache

  setup_logging()
  use_compilation_cache(_CACHE.value)

  config = _CONFIG.value
  workdir = _WORKDIR.value or os.path.join("runs", os.path.splitext(os.path.basename(
      flags.FLAGS["config"].config_filename))[0])
  new_workdir = not os.path.lexists(workdir)
  try:
    config = _cli.add_overrides(config, _UNKNOWN_OVERRIDES)  # for validation to name them
    results = train_and_evaluate(config, workdir)
  except CheckpointWriteError as e:
    # Orbax's writer threads can keep a failed process alive at exit: report and leave at once.
    print(f"Checkpoint error: {e}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)
  except ConfigError as e:
    # A config, data or workdir problem is the user's to fix, not a crash: the message alone.
    kind = {"WorkdirInUse": "Workdir in use", "WorkdirError": "Workdir error",
            "DataError": "Data error", "EnvironmentProblem": "Environment error"}.get(
                type(e).__name__, "Config error")
    if new_workdir:  # a failed start leaves no empty workdir behind
      _cli.remove_if_empty(workdir)
    _user_error(kind, e)
  if results.get("stopped"):
    print(f"\nStopped at step {results['steps']}; the checkpoint in {os.path.abspath(workdir)} "
          "resumes it: run the same command again.")
    sys.exit(128 + results["signal"] if results.get("signal") else 0)
  from lpjax.train import tensorboard_command
  from lpjax.train.outputs._results import format_summary

  python = os.path.relpath(sys.executable)
  python = python if not python.startswith("..") else "python"
  overrides = [a for a in sys.argv[1:] if a.startswith("--config.")]
  commands = _cli.next_commands(flags.FLAGS["config"].config_filename, workdir,
                                str(results.get("recipe", "")), overrides, python)
  if os.path.isdir(os.path.join(workdir, "tensorboard")):
    commands.append((tensorboard_command(os.path.join(workdir, "tensorboard")),
                     "the curves in TensorBoard"))
  print("\n" + format_summary(results, os.path.abspath(workdir), commands), end="")


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main, flags_parser=_parse_flags)
