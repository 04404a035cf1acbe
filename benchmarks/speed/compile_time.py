"""Compile time and time to the first step of the trainer's train step, per recipe, against bf16.

    python benchmarks/speed/compile_time.py                              # every model, default recipes
    python benchmarks/speed/compile_time.py --models=llama --recipes=bf16,mxfp4,nvfp4
    python benchmarks/speed/compile_time.py --json=runs/compile_time.json

For each model (tiny LLaMA from configs/llama_tiny_*.py, tiny U-Net and tiny ResNet on the
offline digits) and each recipe, builds the trainer on one CPU device, then measures in this
process:
- `compile_s`: `train_step(policy).lower(state, batch, key).compile()` (what the trainer logs as
  "compiled in N s");
- `first_step_s`: the start of the trainer (task, model, optimizer), the initial state, the
  compile and one step, i.e. what a user waits for before the first loss appears;
- `step_s`: the steady step time on the same batch, the median over `--steps` rounds, each round
  one step of every recipe of the model in a rotating order (after all of them compiled), so that
  the machine's drifts hit every row alike.
Each figure is also given as a ratio to the same model's bf16 row, measured first in this
process. JAX's persistent compilation cache is off, so nothing is reused across rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

MODELS = {
    "llama": ("configs/llama_tiny_mxfp4.py", "bf16,mxfp4,mxfp4_naive,mxfp4_bwd,nvfp4"),
    "unet": ("configs/unet_tiny_digits_mxfp4.py", "bf16,mxfp4_naive,mxfp4,mxfp4_e4m3scale"),
    "resnet": ("configs/resnet_tiny_digits_mxfp4.py", "bf16,mxfp4_naive,mxfp4,nvfp4"),
}


def _parse():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--models", default="llama,unet,resnet", help="comma-separated of " + ",".join(MODELS))
  p.add_argument("--recipes", default="", help="comma-separated; default: each model's list")
  p.add_argument("--batch_size", type=int, default=16)
  p.add_argument("--steps", type=int, default=10,
                 help="rounds (one step of every recipe each) timed for the steady step time")
  p.add_argument("--json", default="", help="also write the rows to this file")
  return p.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:  # before jax is imported
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"

import jax  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from lpjax.train import Trainer  # noqa: E402
from lpjax.train.config import load_config_file  # noqa: E402
from timing import allocator, interleaved_medians  # noqa: E402  (benchmarks/speed/timing.py)


def load_config(path: str):
  """The config of `path`, relative to the repository root."""
  return load_config_file(os.path.join(ROOT, path))


def measure(config_path: str, recipe: str, workdir: str, batch_size: int | None = None,
            seq_len: int | None = None):
  """({compile_s, first_step_s}, one_step) for the trainer of `config_path` with quant.recipe =
  recipe (batch_size: default --batch_size, 0 the config's own; seq_len: the config's unless
  given); one_step() runs one further step on the same batch and returns its wall time."""
  c = load_config(config_path)
  c.quant.recipe = recipe
  batch_size = ARGS.batch_size if batch_size is None else batch_size
  if batch_size:
    c.batch_size = batch_size
  if seq_len:
    c.seq_len = seq_len
  c.progress_bar = False
  c.mesh.data = 1
  start = time.perf_counter()
  trainer = Trainer(c, workdir, devices=jax.devices()[:1])
  state = trainer.init_state()
  _, local = next(trainer.task.batches(0, 1, 0, 1))
  batch = jax.device_put(local, trainer.batch_sharding)
  key = jax.random.key(0)
  compile_start = time.perf_counter()
  step = trainer.compiled_train_step(trainer.precision.policy, state, batch, key)
  compile_s = time.perf_counter() - compile_start
  state, metrics = step(state, batch, key)
  jax.block_until_ready(metrics)
  first_step_s = time.perf_counter() - start
  held = {"state": state}

  def one_step() -> float:
    t0 = time.perf_counter()
    held["state"], metrics = step(held["state"], batch, key)
    jax.block_until_ready(metrics)
    return time.perf_counter() - t0

  return {"compile_s": compile_s, "first_step_s": first_step_s}, one_step


def main():
  rows = []
  print(f"jax {jax.__version__}, {jax.devices()[0].platform}, batch {ARGS.batch_size}, "
        f"{allocator()}; ratios to the same model's bf16 row (same process)")
  print("| model | recipe | compile s | x bf16 | first step s | x bf16 | step ms | x bf16 |")
  print("|---|---|---|---|---|---|---|---|")
  with tempfile.TemporaryDirectory() as tmp:
    for model in ARGS.models.split(","):
      path, default = MODELS[model]
      recipes = (ARGS.recipes or default).split(",")
      if recipes[0] != "bf16":
        recipes = ["bf16"] + [r for r in recipes if r != "bf16"]
      measured, one_steps = {}, {}
      for recipe in recipes:
        measured[recipe], one_steps[recipe] = measure(
            path, recipe, os.path.join(tmp, f"{model}_{recipe.replace(':', '_')}"))
        print(f"{model} {recipe}: compiled in {measured[recipe]['compile_s']:.1f} s", file=sys.stderr,
              flush=True)
      for one_step in one_steps.values():  # one untimed step each, then interleaved rounds
        one_step()
      steady = interleaved_medians(one_steps, ARGS.steps)
      base = dict(measured["bf16"], step_s=steady["bf16"])
      for recipe in recipes:
        r = dict(measured[recipe], step_s=steady[recipe])
        row = dict(model=model, recipe=recipe, **r,
                   compile_ratio=r["compile_s"] / base["compile_s"],
                   first_step_ratio=r["first_step_s"] / base["first_step_s"],
                   step_ratio=r["step_s"] / base["step_s"])
        rows.append(row)
        print(f"| {model} | {recipe} | {r['compile_s']:.1f} | {row['compile_ratio']:.2f} | "
              f"{r['first_step_s']:.1f} | {row['first_step_ratio']:.2f} | "
              f"{1e3 * r['step_s']:.1f} | {row['step_ratio']:.2f} |", flush=True)
  if ARGS.json:
    os.makedirs(os.path.dirname(os.path.abspath(ARGS.json)), exist_ok=True)
    with open(ARGS.json, "w") as f:
      json.dump(rows, f, indent=2)


if __name__ == "__main__":
  main()
