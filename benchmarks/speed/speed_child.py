"""The fresh processes of the speed report (benchmarks/speed/speed_rows.py runs them; JAX's persistent
compilation cache off in their environment):

    python benchmarks/speed/speed_child.py first_step CONFIG RECIPE [--batch_size=N] [--seq_len=N]
        start, the trainer of CONFIG with quant.recipe=RECIPE, its compile and one step; prints
        {"compile_s", "first_step_s"} (benchmarks/speed/compile_time.py's `measure`) and exits.
    python benchmarks/speed/speed_child.py advise COUNTS_JSON ADVISE_FLAGS...
        `python -m lpjax.advise ADVISE_FLAGS`, counting XLA's backend compiles (a jax.monitoring
        listener): writes {"all", "over_1s", "seconds"} to COUNTS_JSON.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile


def first_step(argv):
  import argparse
  p = argparse.ArgumentParser()
  p.add_argument("config")
  p.add_argument("recipe")
  p.add_argument("--batch_size", type=int, default=0)  # 0: the config's own
  p.add_argument("--seq_len", type=int, default=0)
  args = p.parse_args(argv)
  import compile_time  # benchmarks/speed/compile_time.py
  with tempfile.TemporaryDirectory() as tmp:
    figures, _ = compile_time.measure(args.config, args.recipe, tmp, args.batch_size,
                                      args.seq_len or None)
  print(json.dumps(figures))
  return 0


def advise(argv):
  counts, flags = argv[0], argv[1:]
  from jax import monitoring
  seconds = []

  def on_duration(event, duration, **_):
    if event == "/jax/core/compile/backend_compile_duration":
      seconds.append(duration)

  monitoring.register_event_duration_secs_listener(on_duration)
  from lpjax import advise as advise_cli
  rc = advise_cli.main(flags)
  with open(counts, "w") as f:
    json.dump({"all": len(seconds), "over_1s": sum(s > 1 for s in seconds),
               "seconds": sorted(seconds, reverse=True)[:20]}, f)
  return rc


if __name__ == "__main__":
  sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", d)
                  for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/
  mode, rest = sys.argv[1], sys.argv[2:]
  sys.exit({"first_step": first_step, "advise": advise}[mode](rest))
