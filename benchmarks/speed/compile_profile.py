"""Where a train step's compile goes, per recipe: trace, lower, XLA's HLO passes, the HLO's size.

    python benchmarks/speed/compile_profile.py                                  # LLaMA-tiny bf16, mxfp4
    python benchmarks/speed/compile_profile.py --config=configs/unet_tiny_digits_mxfp4.py \\
        --recipes=bf16,mxfp4_e4m3scale --top=12
    python benchmarks/speed/compile_profile.py --json=runs/compile_profile.json

Each recipe runs in a fresh child process (the trainer of --config with quant.recipe = RECIPE on
one CPU device, JAX's compilation cache off) that times `trace`, `lower` and XLA's compile of the
train step. XLA itself reports the rest, in that child:
- every HLO pass's time on the step's module (`TF_CPP_VMODULE=hlo_pass_pipeline=1`), summed per
  pass over the runs of the pipelines that repeat (the simplification pipeline runs a dozen
  times); the pipelines themselves are not counted again;
- the HLO after call inlining and before fusion (`--xla_dump_hlo_pass_re`): instructions in all,
  and per `jit(...)` scope of their op_name (which lpjax function made them: `_fake_quant_xla`
  is an operand quantizer, `_tail_tables` the NVFP4 exact tail table, `_fold_words` a key);
- the compiled module's kernels (fusions) and instructions.
Everything but the timings is deterministic: compare HLO sizes across commits without a quiet
machine. What the HLO passes do not take is code generation (MLIR emission and LLVM, per kernel).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

_PIPELINE = re.compile(r"Running HLO pass pipeline on module (\S+): (\S+)")
_PASS = re.compile(r"HLO pass: (\S+) time: ([\d.]+) (us|ms|s) ")
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%?[\w.-]+ = ")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def pass_seconds(log: str, module: str = "jit_step") -> dict[str, float]:
  """Seconds per HLO pass on `module`, from XLA's pass-pipeline log lines, summed over runs;
  entries that are pipelines (a nested pipeline is logged as a pass of its parent) left out.

  >>> log = '''I hlo_pass_pipeline.cc:303] Running HLO pass pipeline on module jit_step: simplification
  ... I hlo_pass_pipeline.cc:176] HLO pass: algsimp time: 250 us (250 us) (cumulative: 1 ms)
  ... I hlo_pass_pipeline.cc:176] HLO pass: algsimp time: 1.5 ms (1.5 ms) (cumulative: 2 ms)
  ... I hlo_pass_pipeline.cc:303] Running HLO pass pipeline on module jit_step: main
  ... I hlo_pass_pipeline.cc:176] HLO pass: simplification time: 2 ms (2 ms) (cumulative: 2 ms)
  ... I hlo_pass_pipeline.cc:303] Running HLO pass pipeline on module jit_init: main
  ... I hlo_pass_pipeline.cc:176] HLO pass: algsimp time: 9 s (9 s) (cumulative: 9 s)'''
  >>> pass_seconds(log)
  {'algsimp': 0.00175}
  """
  current, pipelines, seconds = None, set(), collections.Counter()
  for line in log.splitlines():
    m = _PIPELINE.search(line)
    if m:
      current = m.group(1)
      pipelines.add(m.group(2))
      continue
    m = _PASS.search(line)
    if m and current == module:
      seconds[m.group(1)] += float(m.group(2)) * _UNIT[m.group(3)]
  return {k: round(v, 9) for k, v in seconds.items() if k not in pipelines}


def instructions(hlo: str) -> int:
  """HLO instructions in a module's text (every computation, fused ones included).

  >>> instructions('ENTRY %m {\\n  %p = f32[2] parameter(0)\\n  ROOT %n = f32[2] negate(%p)\\n}')
  2
  """
  return sum(1 for line in hlo.splitlines() if _INSTRUCTION.match(line))


def scope_counts(hlo: str, depth: int = 2) -> collections.Counter:
  """Instructions per op_name scope: the first `depth` `jit(...)` names below the step's own
  (`-` for none, e.g. the model's own operations, which carry no inner jit).

  >>> hlo = '''  %a = f32[] add(%x, %y), metadata={op_name="jit(step)/jit(_fake)/jit(_where)/select_n"}
  ...   %b = f32[] add(%x, %y), metadata={op_name="jit(step)/dot_general"}'''
  >>> sorted(scope_counts(hlo, 1).items())
  [('-', 1), ('jit(_fake)', 1)]
  """
  counts = collections.Counter()
  for line in hlo.splitlines():
    if not _INSTRUCTION.match(line):
      continue
    m = _OP_NAME.search(line)
    jits = [p for p in (m.group(1).split("/") if m else ()) if p.startswith("jit(")][1:]
    counts["/".join(jits[:depth]) or "-"] += 1
  return counts


def _child(config: str, recipe: str, out: str) -> int:
  """In a fresh process: the trainer's step for `recipe`, its trace / lower / compile seconds and
  compiled size, to `out` (JSON)."""
  import time
  sys.path[:0] = [ROOT, HERE]
  import jax
  jax.config.update("jax_enable_compilation_cache", False)
  from lpjax.train import Trainer
  from lpjax.train.config import load_config_file
  c = load_config_file(os.path.join(ROOT, config))
  c.quant.recipe, c.progress_bar, c.mesh.data = recipe, False, 1
  with tempfile.TemporaryDirectory() as workdir:
    trainer = Trainer(c, workdir, devices=jax.devices()[:1])
    state = trainer.init_state()
    _, local = next(trainer.task.batches(0, 1, 0, 1))
    batch = jax.device_put(local, trainer.batch_sharding)
    step = trainer.train_step(trainer.precision.policy, None)
    t0 = time.perf_counter()
    traced = step.trace(state, batch, jax.random.key(0))
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    compiled = lowered.compile()
    t3 = time.perf_counter()
  text = compiled.as_text()
  figures = dict(trace_s=t1 - t0, lower_s=t2 - t1, compile_s=t3 - t2,
                 kernels=len(re.findall(r" fusion\(", text)), compiled_instructions=instructions(text))
  with open(out, "w") as f:
    json.dump(figures, f)
  return 0


def profile(config: str, recipe: str) -> dict:
  """One recipe's figures (a child process); see the module docstring."""
  with tempfile.TemporaryDirectory() as tmp:
    dump, out = os.path.join(tmp, "dump"), os.path.join(tmp, "figures.json")
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_COMPILATION_CACHE="false",
               TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="hlo_pass_pipeline=1",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), f"--xla_dump_to={dump}",
                                 "--xla_dump_hlo_module_re=.*jit_step.*",
                                 "--xla_dump_hlo_pass_re=call-inliner|fusion"])
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", config, recipe,
                           out], env=env, capture_output=True, text=True)
    if proc.returncode:
      raise RuntimeError(f"compile_profile child for {recipe!r} failed:\n{proc.stderr[-3000:]}")
    with open(out) as f:
      figures = json.load(f)
    inlined = glob.glob(os.path.join(dump, "*jit_step.*after_call-inliner*"))
    unfused = glob.glob(os.path.join(dump, "*jit_step.*.before_fusion.txt"))
    read = lambda paths: open(paths[0]).read() if paths else ""  # noqa: E731
    before_fusion = read(unfused)
    passes = pass_seconds(proc.stderr)
    figures.update(hlo_pass_s=sum(passes.values()), passes=passes,
                   after_inlining=instructions(read(inlined)),
                   before_fusion=instructions(before_fusion),
                   scopes=dict(scope_counts(before_fusion).most_common()))
  return figures


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", default="configs/llama_tiny_mxfp4.py",
                 help="a trainer config, relative to the repository root")
  p.add_argument("--recipes", default="bf16,mxfp4", help="comma-separated; the first is the base")
  p.add_argument("--top", type=int, default=8, help="passes and scopes listed per recipe")
  p.add_argument("--json", default="", help="also write the figures to this file")
  p.add_argument("--child", nargs=3, metavar=("CONFIG", "RECIPE", "OUT"), help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.child:
    return _child(*args.child)
  recipes = args.recipes.split(",")
  rows = {r: profile(args.config, r) for r in recipes}
  base = rows[recipes[0]]
  print(f"{args.config}; ratios to {recipes[0]}; HLO passes summed over their runs")
  print("| recipe | trace s | lower s | XLA compile s | HLO passes s | after inlining | "
        "before fusion | kernels | compiled instructions |")
  print("|---|---|---|---|---|---|---|---|---|")
  for r, f in rows.items():
    ratio = lambda k: f"{f[k]:.3g} ({f[k] / base[k]:.2f}x)" if base[k] else f"{f[k]:.3g}"  # noqa: E731
    print(f"| {r} | {ratio('trace_s')} | {ratio('lower_s')} | {ratio('compile_s')} | "
          f"{ratio('hlo_pass_s')} | {ratio('after_inlining')} | {ratio('before_fusion')} | "
          f"{ratio('kernels')} | {ratio('compiled_instructions')} |")
  for r, f in rows.items():
    top = sorted(f["passes"].items(), key=lambda kv: -kv[1])[:args.top]
    print(f"\n{r}: slowest HLO passes: " + ", ".join(
        f"{k} {v:.2f} s ({base['passes'].get(k, 0.0):.2f})" for k, v in top))
    print(f"{r}: instructions before fusion by jit scope: " + ", ".join(
        f"{k} {v} ({base['scopes'].get(k, 0)})" for k, v in list(f["scopes"].items())[:args.top]))
  print(f"\n(in parentheses: {recipes[0]}'s figure)")
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
