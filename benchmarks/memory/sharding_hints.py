"""Train-step time under fsdp with and without the activation sharding hints (same process).

    python benchmarks/memory/sharding_hints.py                 # tiny LLaMA, mxfp4 + Stable-SPAM, fsdp 8
    python benchmarks/memory/sharding_hints.py --recipe=bf16 --batch_size=128

Without the hints (lpjax/nn/_sharding_hints.py) XLA replicated each microbatch under fsdp, so every
device computed the whole batch. This measures the step time of the trainer's jitted step both
ways on the same mesh and inputs, and prints the ratio. On CPU the devices are virtual
(--xla_force_host_platform_device_count) and share the host's cores. So the ratio shows the
redundant work the hints remove, not a GPU speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _parse():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--devices", type=int, default=8, help="virtual CPU devices = fsdp axis")
  p.add_argument("--recipe", default="mxfp4")
  p.add_argument("--optimizer", default="stable_spam")
  p.add_argument("--batch_size", type=int, default=64)
  p.add_argument("--seq_len", type=int, default=128)
  p.add_argument("--repeats", type=int, default=5)
  return p.parse_args()


sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", d)
                for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/
ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:  # before jax is imported
  from cpu_devices import use_virtual_cpu_devices
  use_virtual_cpu_devices(ARGS.devices)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from timing import median_seconds  # noqa: E402

from lpjax.train import llama_config  # noqa: E402
from lpjax.train.step import _sharding as shd  # noqa: E402
from lpjax.train import Trainer  # noqa: E402


def step_seconds(hints: bool, workdir: str) -> float:
  resolver = shd.activation_resolver
  if not hints:
    shd.activation_resolver = lambda mesh: None  # the trainer then traces without hints
  try:
    c = llama_config("tiny", recipe=ARGS.recipe, optimizer=ARGS.optimizer)
    c.batch_size, c.seq_len = ARGS.batch_size, ARGS.seq_len
    c.mesh.data, c.mesh.fsdp = 1, ARGS.devices
    c.progress_bar = False
    trainer = Trainer(c, workdir)
    state = trainer.init_state()
    step = trainer.train_step(None)
    tokens = np.random.default_rng(0).integers(0, 256, (c.batch_size, c.seq_len), dtype=np.int32)
    batch = {"inputs": jax.device_put(tokens, trainer.batch_sharding)}
    batch["targets"] = batch["inputs"]
    key = jax.random.key(0)

    def run():  # donates the state: thread the new one through
      nonlocal state
      state, metrics = step(state, batch, key)
      return metrics
    return median_seconds(run, repeats=ARGS.repeats)
  finally:
    shd.activation_resolver = resolver


def main():
  import tempfile

  with tempfile.TemporaryDirectory() as tmp:
    with_hints = step_seconds(True, os.path.join(tmp, "hints"))
    without = step_seconds(False, os.path.join(tmp, "none"))
  print(f"tiny LLaMA, {ARGS.recipe} + {ARGS.optimizer}, batch {ARGS.batch_size} x {ARGS.seq_len}, "
        f"fsdp {ARGS.devices} (virtual CPU devices), jax {jax.__version__}")
  print("| activation hints | median step ms |")
  print("|---|---|")
  print(f"| on | {with_hints * 1e3:.0f} |")
  print(f"| off | {without * 1e3:.0f} |")
  print(json.dumps({"step_s_with_hints": with_hints, "step_s_without_hints": without,
                    "speedup": without / with_hints}))


if __name__ == "__main__":
  main()
