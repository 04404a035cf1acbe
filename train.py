"""Trains a model from a config file. Flags only; the program is lpjax.train.train_and_evaluate.

    python train.py --config=configs/llama_tiny_mxfp4.py --workdir=runs/tiny
    python train.py --config=configs/llama_60m_mxfp4.py --config.optimizer.lr=2e-3 --workdir=runs/60m
"""

import os
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file in configs/.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and results.")
_CACHE = flags.DEFINE_string(
    "compilation_cache", os.path.join("~", ".cache", "lpjax", "jax_compilation_cache"),
    "JAX's persistent compilation cache: a re-run, a resumed run or another seed of the same "
    "config loads the compiled train step instead of compiling it again. '' turns it off; "
    "JAX_COMPILATION_CACHE_DIR, when set, wins.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from lpjax.train import train_and_evaluate  # after flags: keeps --help fast
  from lpjax.train import setup_logging, use_compilation_cache

  setup_logging()
  use_compilation_cache(_CACHE.value)

  config = _CONFIG.value
  workdir = _WORKDIR.value or os.path.join("runs", os.path.splitext(os.path.basename(
      flags.FLAGS["config"].config_filename))[0])
  from lpjax.train import CheckpointWriteError, ConfigError

  try:
    results = train_and_evaluate(config, workdir)
  except CheckpointWriteError as e:
    # Orbax's writer threads can keep a failed process alive at exit: report and leave at once.
    print(f"Checkpoint error: {e}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)
  except ConfigError as e:
    # A config problem is the user's to fix, not a crash: the message alone, unless asked for
    # the traceback (--verbosity=1 or LPJAX_TRACEBACK=1).
    if flags.FLAGS.verbosity >= 1 or os.environ.get("LPJAX_TRACEBACK") == "1":
      raise
    kind = "Workdir in use" if type(e).__name__ == "WorkdirInUse" else "Config error"
    print(f"{kind}: {e}\n(--verbosity=1 or LPJAX_TRACEBACK=1 shows the traceback.)",
          file=sys.stderr)
    sys.exit(2)
  if results.get("stopped"):
    print(f"\nStopped at step {results['steps']}; the checkpoint in {os.path.abspath(workdir)} "
          "resumes it: run the same command again.")
    sys.exit(128 + results["signal"] if results.get("signal") else 0)
  print(f"\nResults: {os.path.join(os.path.abspath(workdir), 'results.json')}")
  print(f"Metrics: {os.path.join(os.path.abspath(workdir), 'metrics.jsonl')}")
  from lpjax.train import tensorboard_command
  print(f"TensorBoard: {tensorboard_command(os.path.join(workdir, 'tensorboard'))}")
  print({k: v for k, v in results.items() if k.startswith("final_") or k in ("steps", "wall_time_s")})


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main)
