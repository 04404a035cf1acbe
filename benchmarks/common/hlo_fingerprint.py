"""A fingerprint of the compiled train step: does a change keep the program XLA runs, bit for bit?

    python benchmarks/common/hlo_fingerprint.py --recipes=bf16,mxfp4,nvfp4,quartet
    git worktree add /tmp/before <rev> && (cd /tmp/before && python benchmarks/common/hlo_fingerprint.py)

For each recipe, builds the trainer of a config (default LLaMA-tiny) on one CPU device, compiles
its train step ahead of time and prints the sha256 of the optimized HLO text with what does not
change the program removed: op metadata (source file, line, op name) and the stack-frame tables
that name source files. Two checkouts print the same fingerprint exactly when XLA compiled the
same program, so a refactor (moving modules, renaming functions) can show that it changed no bit
and no step time, and a new feature that is off (e.g. a monitor) that it leaves today's program.

Examples:
  >>> hlo = '''HloModule jit_step, entry_computation_layout={()->f32[]}
  ... FileNames
  ... 1 "/a/lpjax/quant/gemm/dot_general.py"
  ... StackFrames
  ... 1 {file_location_id=1 parent_frame_id=1}
  ... ENTRY %main () -> f32[] {
  ...   ROOT %c = f32[] constant(1), metadata={op_name="jit(step)" source_file="/a/x.py"}, stack_frame_id=3
  ... }'''
  >>> print(program_text(hlo))
  HloModule
  ENTRY %main () -> f32[] {
    ROOT %c = f32[] constant(1)
  }
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import tempfile


def program_text(hlo: str) -> str:
  """The HLO text without metadata, stack frames, source-file tables and the module's name."""
  text = re.sub(r",?\s*metadata=\{[^}]*\}", "", hlo)
  text = re.sub(r",?\s*stack_frame_id=\d+", "", text)
  text = re.sub(r"^\d+ .*\n", "", text, flags=re.M)  # FileNames / FunctionNames / frame rows
  text = re.sub(r"^(FileNames|FunctionNames|FileLocations|StackFrames)\s*\n", "", text, flags=re.M)
  return re.sub(r"^HloModule [^\n]*", "HloModule", text, flags=re.M)


def fingerprint(hlo: str) -> str:
  return hashlib.sha256(program_text(hlo).encode()).hexdigest()[:16]


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", default="configs/llama_tiny_mxfp4.py")
  p.add_argument("--recipes", default="bf16,mxfp4,nvfp4,quartet")
  p.add_argument("--batch_size", type=int, default=16)
  args = p.parse_args()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  sys.path.insert(0, root)
  import jax
  from lpjax.train import Trainer
  from lpjax.train.config import load_config_file

  print("| recipe | fingerprint | HLO lines |")
  print("|---|---|---|")
  for recipe in args.recipes.split(","):
    c = load_config_file(os.path.join(root, args.config))
    c.quant.recipe, c.batch_size, c.progress_bar, c.mesh.data = recipe, args.batch_size, False, 1
    with tempfile.TemporaryDirectory() as tmp:
      trainer = Trainer(c, tmp, devices=jax.devices()[:1])
      state = trainer.init_state()
      _, local = next(trainer.task.batches(0, 1, 0, 1))
      batch = jax.device_put(local, trainer.batch_sharding)
      step = trainer.train_step(trainer.precision.policy).lower(state, batch, jax.random.key(0))
      hlo = step.compile().as_text()
    print(f"| {recipe} | {fingerprint(hlo)} | {len(program_text(hlo).splitlines())} |", flush=True)


if __name__ == "__main__":
  main()
