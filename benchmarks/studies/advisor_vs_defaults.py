"""The precision advisor against the name-based defaults on LLaMA-tiny.

At the same high-precision FLOP budget as the default keep list, the final eval loss of:
- `default`: the default keep list (embeddings, LM head, attention score / value products in bf16;
  every other GEMM in the recipe): `quant.policy=default`, no rules;
- `advised`: `python -m lpjax.advise --budget=default` measured on `--batches` training batches of
  the run's fresh initialisation (same seed): every GEMM site is a candidate (quant.policy=pure),
  the most sensitive ones are kept in bf16 within the FLOP fraction that the default list keeps;
  the advised config lines are then trained;
- `advised_ckpt` (optional): the same, measured on the default arm's final checkpoint (a pilot run
  of the default policy; sensitivities of trained weights, not of the initialisation);
- `pure`: the advisor at budget 0, i.e. nothing kept: quant.policy=pure, every GEMM (LM head and
  attention products included) and the embedding table in the recipe.
Each arm trains configs/llama_tiny_mxfp4.py (its data, optimizer and schedule) with
`quant.recipe=<recipe>`, `seed=<seed>` and `steps=<steps>`, one train.py process per run, in
`<root>/<recipe>/<arm>/seed<seed>`. A run whose results.json reports `steps` steps is read, not
rerun; an interrupted run resumes from its checkpoint (train.py does that itself). The advice of
each (recipe, seed) is kept in `<root>/<recipe>/advice/seed<seed>.txt` (+ .md: the ranking).

    python benchmarks/studies/advisor_vs_defaults.py --steps=1000 --seeds=0,1,2 --recipes=mxfp4,quartet
    python benchmarks/studies/advisor_vs_defaults.py --arms=default,advised_ckpt   # advice from a pilot run
    python benchmarks/studies/advisor_vs_defaults.py --steps=300 --seeds=0,1,2 --recipes=mxfp4 \\
        --arms=default,advised          # a subset (the config's own 300 steps)
    python benchmarks/studies/advisor_vs_defaults.py --report_only   # the table of what has finished
    python benchmarks/studies/advisor_vs_defaults.py --steps=1000 --seeds=0,1,2 --recipes=mxfp4,quartet \\
        --arms=default,advised_ckpt --report_only --record   # + docs/results/records/ (below)

Prints a markdown table: per recipe and arm, the mean ± std over seeds of the final eval loss
(the run's own precision; `final_eval_loss` of results.json), the per-seed values, and the fraction
of GEMM FLOPs kept in high precision. `--record [NAME]` also writes each arm's mean, std and
per-seed losses to docs/results/records/<NAME>.json (default advisor_vs_defaults_<steps>), the record
the docs' advisor figures cite (benchmarks/common/records.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", d)
                for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/
from records import command_line, write_record  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "llama_tiny_mxfp4.py")
ARMS = ("default", "advised", "pure", "advised_ckpt")


def _run(cmd, log_path):
  print(f"$ {' '.join(cmd)}", flush=True)
  t0 = time.time()
  with open(log_path, "a") as log:
    proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                          env=dict(os.environ, PYTHONPATH=ROOT))
  print(f"  -> exit {proc.returncode} in {time.time() - t0:.0f} s (log: {log_path})", flush=True)
  if proc.returncode != 0:
    raise RuntimeError(f"{cmd[1:3]} failed (exit {proc.returncode}); see {log_path}")


def _common(recipe, seed, steps):
  return [f"--config={CONFIG}", f"--config.quant.recipe={recipe}", f"--config.seed={seed}",
          f"--config.steps={steps}"]


def advice_lines(args, recipe, seed, from_run: bool = False) -> list[str]:
  """The advised config lines of (recipe, seed), measured once and kept: on the fresh
  initialisation, or (`from_run`) on the default arm's final checkpoint (a pilot run)."""
  folder = os.path.join(args.root, recipe, "advice_ckpt" if from_run else "advice")
  os.makedirs(folder, exist_ok=True)
  out = os.path.join(folder, f"seed{seed}.txt")
  if not os.path.exists(out):
    md = os.path.join(folder, f"seed{seed}.md")
    pilot = []
    if from_run:
      if train(args, recipe, "default", seed) is None:
        raise RuntimeError(f"advised_ckpt needs the default arm of {recipe} seed {seed} first.")
      pilot = [f"--workdir={os.path.join(args.root, recipe, 'default', f'seed{seed}')}"]
    cmd = [sys.executable, "-m", "lpjax.advise", *_common(recipe, seed, args.steps), *pilot,
           "--budget=default", f"--batches={args.batches}", f"--out={out}"]
    print(f"$ {' '.join(cmd)}", flush=True)
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    with open(md, "w") as f:
      f.write(proc.stdout)
    if proc.returncode != 0:
      raise RuntimeError(f"lpjax.advise failed: {proc.stderr[-2000:]}")
    print(f"  -> advice in {time.time() - t0:.0f} s: {open(out).read().split()}", flush=True)
  with open(out) as f:
    return [line for line in f.read().splitlines() if line.strip()]


def arm_flags(args, recipe, arm, seed) -> list[str]:
  if arm == "default":
    return []
  if arm == "pure":
    return ["--config.quant.policy=pure"]
  return advice_lines(args, recipe, seed, from_run=arm == "advised_ckpt")


def results_of(workdir, steps):
  path = os.path.join(workdir, "results.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    r = json.load(f)
  return r if r.get("steps") == steps and r.get("final_eval_loss") is not None else None


def keeps_the_default_list(args, recipe, arm, seed) -> bool:
  """Whether the advice of an advised arm keeps exactly the sites the default keep list keeps
  (its printout's `kept` and `kept_by_default` columns agree on every ranked site): then the arm
  trains the default arm's policy (`quant.policy=pure` with rules naming the same sites; the
  embedding lookup is no GEMM) and is the default run itself. Measured once: mxfp4 seed 0 at 1000
  steps, both arms trained, final eval loss 1.8320 and 1.8320."""
  if not arm.startswith("advised"):
    return False
  md = os.path.join(args.root, recipe, "advice_ckpt" if arm == "advised_ckpt" else "advice",
                    f"seed{seed}.md")
  if not os.path.exists(md):
    return False
  header, rows = None, []
  for line in open(md).read().splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if "kept_by_default" in cells:
      header = cells
    elif header and len(cells) == len(header) and cells[0].isdigit():
      rows.append(dict(zip(header, cells)))
  return bool(rows) and all((r["kept"] == "yes") == (r["kept_by_default"] == "yes")
                            for r in rows)


def train(args, recipe, arm, seed):
  workdir = os.path.join(args.root, recipe, arm, f"seed{seed}")
  if arm.startswith("advised") and not args.retrain_same and not os.path.exists(workdir):
    if not args.report_only:
      advice_lines(args, recipe, seed, from_run=arm == "advised_ckpt")  # measured once
    if keeps_the_default_list(args, recipe, arm, seed):
      print(f"{recipe} {arm} seed {seed}: the advice keeps the default keep list's sites; the "
            "default arm's run stands for it (--retrain_same trains it anyway)", flush=True)
      return train(args, recipe, "default", seed)
  done = results_of(workdir, args.steps)
  if done is not None or args.report_only:
    return done
  os.makedirs(os.path.dirname(workdir), exist_ok=True)
  cmd = [sys.executable, "train.py", *_common(recipe, seed, args.steps),
         *arm_flags(args, recipe, arm, seed), f"--workdir={workdir}",
         "--config.progress_bar=False"]
  _run(cmd, workdir + ".log")
  return results_of(workdir, args.steps)


def kept_fraction(args, recipe, arm, seed):
  """The fraction of GEMM FLOPs in high precision, from the advice's printout."""
  folders = (["advice", "advice_ckpt"] if arm == "default"  # either advice prints the budget
             else ["advice_ckpt" if arm == "advised_ckpt" else "advice"])
  mds = [os.path.join(args.root, recipe, f, f"seed{seed}.md") for f in folders]
  mds = [md for md in mds if os.path.exists(md)]
  if not mds:
    return None
  text = open(mds[0]).read()
  if arm == "pure":
    return 0.0
  key = "budget " if arm == "default" else "Kept in high precision: "  # (advice printout)
  for line in text.splitlines():
    if line.startswith("Measured") and arm == "default":
      return float(line.split(key)[1].split()[0])
    if line.startswith(key) and arm.startswith("advised"):
      return float(line.rsplit("(", 1)[1].split()[0])
  return None


def table(args, results) -> str:
  lines = ["| recipe | arm | steps | eval loss (mean ± std) | per seed | HP FLOP fraction | kept |",
           "|---|---|---|---|---|---|---|"]
  for recipe in args.recipes:
    for arm in args.arms:
      losses = {s: results.get((recipe, arm, s)) for s in args.seeds}
      got = [v for v in losses.values() if v is not None]
      mean = (f"{statistics.mean(got):.4f} ± {statistics.stdev(got):.4f}" if len(got) > 1
              else f"{got[0]:.4f}" if got else "not run")
      per = ", ".join(f"s{s}: {v:.4f}" if v is not None else f"s{s}: -"
                      for s, v in losses.items())
      fracs = [kept_fraction(args, recipe, arm, s) for s in args.seeds]
      fracs = [f for f in fracs if f is not None]
      frac = f"{statistics.mean(fracs):.3f}" if fracs else "-"
      kept = "embed, lm_head, attn products" if arm == "default" else "nothing" if arm == "pure" \
          else _kept_sites(args, recipe, arm)
      lines.append(f"| {recipe} | {arm} | {args.steps} | {mean} | {per} | {frac} | {kept} |")
  return "\n".join(lines)


def figures_of(args, results) -> dict:
  """The record's figures: `<recipe>_<arm>_mean` / `_std` (over the finished seeds, std with two
  or more) and `<recipe>_<arm>_seed<s>` of each finished run."""
  figures = {}
  for recipe in args.recipes:
    for arm in args.arms:
      got = {s: results.get((recipe, arm, s)) for s in args.seeds}
      got = {s: v for s, v in got.items() if v is not None}
      for s, v in got.items():
        figures[f"{recipe}_{arm}_seed{s}"] = v
      if got:
        figures[f"{recipe}_{arm}_mean"] = statistics.mean(got.values())
      if len(got) > 1:
        figures[f"{recipe}_{arm}_std"] = statistics.stdev(got.values())
  return figures


def _kept_sites(args, recipe, arm):
  out = []
  folder = "advice_ckpt" if arm == "advised_ckpt" else "advice"
  for s in args.seeds:
    path = os.path.join(args.root, recipe, folder, f"seed{s}.txt")
    if os.path.exists(path):
      rules = open(path).read().split("--config.quant.rules=")[-1].strip()
      out.append(f"s{s}: {rules.replace('->bf16', '').replace('|', '/') or 'nothing'}")
  return "; ".join(out) or "-"


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--steps", type=int, default=1000)
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--recipes", default="mxfp4,quartet")
  p.add_argument("--arms", default="default,advised,pure")
  p.add_argument("--batches", type=int, default=2, help="batches the advisor measures on")
  p.add_argument("--root", default=os.path.join(ROOT, "runs", "advisor_vs_defaults"))
  p.add_argument("--report_only", action="store_true", help="print the table of finished runs")
  p.add_argument("--retrain_same", action="store_true",
                 help="train an advised arm whose advice keeps the default list's sites too")
  p.add_argument("--record", nargs="?", const="", default=None, metavar="NAME",
                 help="write the finished runs' losses to docs/results/records/<NAME>.json "
                      "(default NAME: advisor_vs_defaults_<steps>)")
  args = p.parse_args(argv)
  args.seeds = [int(s) for s in args.seeds.split(",")]
  args.recipes = args.recipes.split(",")
  args.arms = args.arms.split(",")
  bad = [a for a in args.arms if a not in ARMS]
  if bad:
    p.error(f"--arms: unknown {bad}; valid: {', '.join(ARMS)}")
  args.root = os.path.abspath(args.root)
  results = {}
  # seed-major order: every arm of seed 0 first, so a partial grid still compares arms
  for recipe in args.recipes:
    for seed in args.seeds:
      for arm in args.arms:
        r = train(args, recipe, arm, seed)
        results[(recipe, arm, seed)] = None if r is None else r["final_eval_loss"]
        if r is not None:
          print(f"{recipe} {arm} seed {seed}: final eval loss {r['final_eval_loss']:.4f}",
                flush=True)
  print(table(args, results))
  if args.record is not None:
    figures = figures_of(args, results)
    if not figures:
      p.error("--record: no run has finished; nothing to record")
    name = args.record or f"advisor_vs_defaults_{args.steps}"
    command = command_line([os.path.abspath(__file__), *(sys.argv[1:] if argv is None else argv)])
    path = write_record(name, figures, command, notes=f"final eval loss, {args.steps} steps")
    print(f"record: {path}")


if __name__ == "__main__":
  main()
