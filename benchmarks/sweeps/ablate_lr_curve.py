"""The lr curves of the optim_lr and sspam_parts sweeps (issue 41): final eval loss against the lr
multiple, one line per optimizer, one panel per recipe, and a markdown table with each optimizer's
best lr.

    python benchmarks/sweeps/ablate_lr_curve.py --out runs/ablate_optim \\
        --png docs/results/cpu1000_optim_lr_curves.png [--earlier]
    python benchmarks/sweeps/ablate_lr_curve.py --out runs/ablate_optim --sweep sspam_parts \\
        --png docs/results/cpu1000_sspam_ref_lr_curves.png

Reads every finished run of DIR/runs/<sweep>/<row>/seed<k> (results.json or failed.json), so it
works while the sweep is still training. Rows with config overrides are left out, except
Stable-SPAM with the reference script's settings (total_T = the run, no global clipping), drawn as
its own line. --earlier adds, as hollow markers, the seed-0 points of the earlier 1000-step `lr` /
`recipes` sweeps quoted in docs/results.md that this sweep has not re-run (the optim_lr sweep's
configs and Intel Xeon machine type; not comparable with runs of another machine type).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", d)
                for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/

import ablate_sweeps as sweeps  # noqa: E402

PAPER_LR = 3e-3  # configs/llama_tiny_*.py
# a line of the plot: an optimizer, or Stable-SPAM with the reference script's settings
OPTIMIZERS = ("adam", "stable_spam", "stable_spam_ref", "spam")
NAMES = {"adam": "Adam(W)", "stable_spam": "Stable-SPAM",
         "stable_spam_ref": "Stable-SPAM, reference settings", "spam": "SPAM"}
COLORS = {"adam": "tab:blue", "stable_spam": "tab:red", "stable_spam_ref": "tab:purple",
          "spam": "tab:green"}
# docs/results.md, "Adam against Stable-SPAM across learning rates" and the 1000-step recipes
# table: seed 0, 1000 steps, Intel Xeon (AVX-512) 2 cores, jax 0.10.2 (recipe, optimizer, lr
# multiple) -> final eval loss.
EARLIER = {("mxfp4", "adam", 0.5): 1.8153, ("mxfp4", "adam", 1.0): 1.8388,
           ("mxfp4", "adam", 2.0): 2.0189, ("mxfp4", "stable_spam", 0.5): 1.8435,
           ("mxfp4", "stable_spam", 1.0): 1.8661, ("mxfp4", "stable_spam", 2.0): 1.8904,
           ("nvfp4", "adam", 1.0): 1.8195, ("bf16", "adam", 1.0): 1.7753,
           ("quartet", "adam", 1.0): 1.7506}


def _series(row) -> str | None:
  """The line a row belongs to: its optimizer (no overrides), stable_spam_ref, or None."""
  if row is None:
    return None
  if not row.overrides:
    return row.optimizer
  if row.optimizer == "stable_spam" and tuple(row.overrides) == sweeps.REFERENCE_SCRIPT:
    return "stable_spam_ref"
  return None


def load(out: str, sweep: str = "optim_lr") -> dict:
  """(recipe, line, lr multiple) -> {seed: final eval loss (nan: diverged / failed)}; the line is
  the optimizer, or "stable_spam_ref" for Stable-SPAM with the reference script's settings."""
  points: dict = {}
  rows = {r.label: r for r in sweeps.SWEEPS[sweep]}
  root = os.path.join(out, "runs", sweep)
  for label in sorted(os.listdir(root)) if os.path.isdir(root) else ():
    row = rows.get(label)
    series = _series(row)
    if series is None:
      continue
    for seed_dir in sorted(os.listdir(os.path.join(root, label))):
      path = os.path.join(root, label, seed_dir)
      if not seed_dir.startswith("seed") or "." in seed_dir:  # .other-machine copies
        continue
      loss = None
      if os.path.exists(os.path.join(path, "results.json")):
        with open(os.path.join(path, "results.json")) as f:
          loss = json.load(f).get("final_eval_loss", math.nan)
      elif os.path.exists(os.path.join(path, "failed.json")):
        loss = math.nan
      if loss is None:
        continue
      key = (row.recipe, series, row.lr_scale)
      points.setdefault(key, {})[int(seed_dir[4:])] = float(loss)
  return points


def _cell(losses: dict) -> str:
  values = [v for v in losses.values() if math.isfinite(v)]
  if not values:
    return "diverged"
  if len(values) == 1:
    return f"{values[0]:.4f} (1)"
  return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f} ({len(values)})"


def markdown(points: dict, earlier: bool) -> str:
  """A table per recipe: optimizer x lr multiple, mean ± std (seeds); best lr in bold."""
  lines = []
  recipes = [r for r in ("mxfp4", "nvfp4", "bf16", "quartet") if any(k[0] == r for k in points)]
  for recipe in recipes:
    scales = sorted({k[2] for k in points if k[0] == recipe}
                    | ({k[2] for k in EARLIER if k[0] == recipe} if earlier else set()))
    lines += [f"**{recipe}**", "",
              "| optimizer | " + " | ".join(f"{s:g}x ({s * PAPER_LR:.3g})" for s in scales) + " |",
              "|---" * (len(scales) + 1) + "|"]
    for opt in OPTIMIZERS:
      cells, means = [], {}
      for s in scales:
        losses = points.get((recipe, opt, s))
        if losses:
          cells.append(_cell(losses))
          finite = [v for v in losses.values() if math.isfinite(v)]
          if finite:
            means[s] = statistics.mean(finite)
        elif earlier and (recipe, opt, s) in EARLIER:
          cells.append(f"{EARLIER[(recipe, opt, s)]:.4f} (1, earlier)")
          means[s] = EARLIER[(recipe, opt, s)]
        else:
          cells.append("")
      if not means:
        continue
      best = min(means, key=means.get)
      cells = [f"**{c}**" if s == best and c else c for s, c in zip(scales, cells)]
      lines.append(f"| {NAMES[opt]} | " + " | ".join(cells) + " |")
    lines.append("")
  return "\n".join(lines)


def plot(points: dict, png: str, earlier: bool, title: str = "LLaMA-tiny, 1000 steps"):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  recipes = [r for r in ("mxfp4", "nvfp4", "bf16", "quartet") if any(k[0] == r for k in points)]
  fig, axes = plt.subplots(1, len(recipes), figsize=(5 * len(recipes), 4), squeeze=False)
  for ax, recipe in zip(axes[0], recipes):
    for opt in OPTIMIZERS:
      xs, ys, es = [], [], []
      for (r, o, s), losses in sorted(points.items()):
        finite = [v for v in losses.values() if math.isfinite(v)]
        if (r, o) == (recipe, opt) and finite:
          xs.append(s)
          ys.append(statistics.mean(finite))
          es.append(statistics.stdev(finite) if len(finite) > 1 else 0.0)
      old = sorted((s, v) for (r, o, s), v in EARLIER.items()
                   if earlier and (r, o) == (recipe, opt) and (r, o, s) not in points)
      if not xs and not old:
        continue
      line = sorted(list(zip(xs, ys)) + old)
      ax.plot([p[0] for p in line], [p[1] for p in line], "-", color=COLORS[opt], alpha=0.6)
      if xs:
        ax.errorbar(xs, ys, yerr=es, fmt="o", color=COLORS[opt], capsize=3,
                    label=f"{NAMES[opt]} (this sweep)")
      if old:
        ax.plot([p[0] for p in old], [p[1] for p in old], "o", mfc="none", color=COLORS[opt],
                label=f"{NAMES[opt]} (earlier seed-0 runs)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"lr multiple of {PAPER_LR:g}")
    ax.set_ylabel("final eval loss")
    ax.set_title(f"{recipe}, {title}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  os.makedirs(os.path.dirname(png) or ".", exist_ok=True)
  fig.savefig(png, dpi=110)
  plt.close(fig)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True, help="the ablate.py output directory")
  p.add_argument("--png", default="", help="where to write the lr-curve plot")
  p.add_argument("--sweep", default="optim_lr", choices=("optim_lr", "sspam_parts"),
                 help="the sweep whose runs to read")
  p.add_argument("--title", default="LLaMA-tiny, 1000 steps", help="each panel's title after the "
                 "recipe (the runs' model and steps)")
  p.add_argument("--earlier", action="store_true", help="add the earlier seed-0 points")
  args = p.parse_args(argv)
  points = load(args.out, args.sweep)
  print(markdown(points, args.earlier))
  if args.png:
    plot(points, args.png, args.earlier, args.title)
    print(f"wrote {args.png}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
