"""Loss curves of one or several training runs in one PNG, with the FP4 gap: `python -m lpjax.plot`.

    python -m lpjax.plot runs/llama_tiny_mxfp4                       # one run
    python -m lpjax.plot runs/llama_tiny_mxfp4 runs/llama_tiny_bf16  # an FP4 run beside bf16
    make plot RUNS="runs/llama_tiny_mxfp4 runs/llama_tiny_bf16"

Each WORKDIR is a train.py workdir (its metrics.jsonl; config.json and results.json name the
run). The left panel has each run's training loss (a moving average over `--smooth` logged steps,
the raw values faint) and its evaluations: filled markers with the run's quantization, hollow
ones for the same weights in full precision. The right panel is the FP4 gap in percent: with a
bf16 or fp32 run among the WORKDIRs, each other run's evaluation loss relative to that baseline's
at the steps both evaluated ("eval loss gap vs <baseline>, % at equal steps"; no common step: no
gap, and the panel says so); without one, each run's evaluation loss with its quantization
relative to the same weights in full precision. A table of the last numbers is printed too.

Runs that differ in more than the recipe (steps, optimizer and schedule, data, batch, seed, model,
evaluation: the keys of their config.json that `lpjax.train.outputs._run_compare.compared` names) are
compared all the same, with a warning that names each differing key and its values, printed and
written on the figure.

matplotlib is needed only to draw (`make plot` installs it, or `pip install matplotlib`); reading
runs and the table work without it.

Examples:
  >>> import json, os, tempfile
  >>> d = tempfile.mkdtemp()
  >>> with open(os.path.join(d, "metrics.jsonl"), "w") as f:
  ...   for step in range(1, 5):
  ...     _ = f.write(json.dumps({"step": step, "train/loss": 5.0 - step}) + "\\n")
  ...   _ = f.write(json.dumps({"step": 4, "eval/loss": 1.5, "eval/loss_fp": 1.2}) + "\\n")
  >>> run = read_run(d)
  >>> run.train_steps, run.train_loss, run.eval_loss, run.eval_loss_fp
  ([1, 2, 3, 4], [4.0, 3.0, 2.0, 1.0], [1.5], [1.2])
  >>> smooth([4.0, 3.0, 2.0, 1.0], 2)
  [4.0, 3.5, 2.5, 1.5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys

from lpjax.train.outputs._run_compare import differences, flatten, read_config

FULL_PRECISION = ("bf16", "fp32")
NO_COMMON_STEPS = ("no step at which both a run and the baseline evaluated:\nno gap to draw "
                   "(train both with the same eval_every and steps)")
MATPLOTLIB_MISSING = ("python -m lpjax.plot needs matplotlib to draw: `make plot` installs it "
                      "(requirements-plot.txt), or `pip install matplotlib`.")


@dataclasses.dataclass
class Run:
  """The curves of one workdir."""
  workdir: str
  label: str  # "<folder name> (<recipe>, <optimizer>)"
  recipe: str
  train_steps: list = dataclasses.field(default_factory=list)
  train_loss: list = dataclasses.field(default_factory=list)
  eval_steps: list = dataclasses.field(default_factory=list)
  eval_loss: list = dataclasses.field(default_factory=list)
  eval_loss_fp: list = dataclasses.field(default_factory=list)
  config: dict = dataclasses.field(default_factory=dict)  # flat config.json ({} if none)

  @property
  def full_precision(self) -> bool:
    return self.recipe.split(":")[0] in FULL_PRECISION


class PlotError(ValueError):
  """A workdir without metrics; the message names it and what to run."""


def _json(path):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def read_run(workdir: str) -> Run:
  """The training and evaluation losses of `workdir`'s metrics.jsonl (torn lines skipped)."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.isfile(path):
    raise PlotError(f"{workdir} has no metrics.jsonl: give the --workdir of a train.py run "
                    "(e.g. runs/llama_tiny_mxfp4 after `make train`).")
  config, results = _json(os.path.join(workdir, "config.json")), _json(
      os.path.join(workdir, "results.json"))
  recipe = str(results.get("recipe") or config.get("quant", {}).get("recipe", "?"))
  optimizer = str(results.get("optimizer") or config.get("optimizer", {}).get("name", "?"))
  name = os.path.basename(os.path.normpath(workdir))
  flat = read_config(workdir) or {k: v for k, v in flatten(
      {"steps": results.get("steps"), "optimizer.name": results.get("optimizer")}).items()
      if v is not None}  # a workdir without config.json: what results.json says
  run = Run(workdir, f"{name} ({recipe}, {optimizer})", recipe, config=flat)
  with open(path) as f:
    for line in f:
      try:
        record = json.loads(line)
      except ValueError:
        continue
      loss = record.get("train/loss")
      if isinstance(loss, (int, float)):
        run.train_steps.append(record["step"])
        run.train_loss.append(float(loss))
      if isinstance(record.get("eval/loss"), (int, float)):
        run.eval_steps.append(record["step"])
        run.eval_loss.append(float(record["eval/loss"]))
        fp = record.get("eval/loss_fp")
        run.eval_loss_fp.append(float(fp) if isinstance(fp, (int, float)) else math.nan)
  if not run.train_steps and not run.eval_steps:
    raise PlotError(f"{path} holds no loss yet: the run logs its first one after "
                    "config.log_every steps.")
  return run


def smooth(values, window: int) -> list:
  """Trailing moving average over `window` values (non-finite values skipped)."""
  out = []
  for i in range(len(values)):
    recent = [v for v in values[max(0, i - window + 1):i + 1] if math.isfinite(v)]
    out.append(sum(recent) / len(recent) if recent else math.nan)
  return out


def gap_to_baseline(run: Run, baseline: Run):
  """(steps, % of `run`'s eval loss above `baseline`'s) at the steps both evaluated: the same
  weights' step and the same evaluation batches, not the noisy loss of each one's own batch."""
  base = dict(zip(baseline.eval_steps, baseline.eval_loss))
  mine = dict(zip(run.eval_steps, run.eval_loss))
  steps = sorted(s for s in mine if s in base and base[s] and math.isfinite(base[s])
                 and math.isfinite(mine[s]))
  return steps, [100 * (mine[s] - base[s]) / base[s] for s in steps]


# Keys a difference in which does not make the runs' losses incomparable to the plot: evaluating at
# other steps only leaves fewer equal steps to compare.
NOT_WARNED = ("eval_every",)


def config_warnings(runs) -> list[str]:
  """One line per compared config key in which the runs differ ("steps: a 160, b 300"), against
  the full-precision baseline (or the first run); [] when they differ in the recipe alone."""
  reference = next((r for r in runs if r.full_precision), runs[0]) if len(runs) > 1 else None
  if reference is None:
    return []
  keys = {}
  for run in runs:
    if run is not reference:
      for key, _, _ in differences(reference.config, run.config, skip=NOT_WARNED):
        if key in reference.config and key in run.config:  # an older workdir records fewer
          keys.setdefault(key, None)
  name = lambda r: os.path.basename(os.path.normpath(r.workdir))  # noqa: E731
  return [f"{key}: " + ", ".join(f"{name(r)} {r.config.get(key, '(not recorded)')}" for r in runs)
          for key in sorted(keys)]


def eval_gap(run: Run):
  """(steps, % of the quantized eval loss above the full-precision eval of the same weights)."""
  pairs = [(s, q, f) for s, q, f in zip(run.eval_steps, run.eval_loss, run.eval_loss_fp)
           if math.isfinite(f) and f]
  return [s for s, _, _ in pairs], [100 * (q - f) / f for _, q, f in pairs]


def _baseline(runs):
  """The full-precision run the others are compared with (None for one run or none such)."""
  return next((r for r in runs if r.full_precision), None) if len(runs) > 1 else None


def summary_table(runs) -> str:
  """The last logged numbers of each run, one line each, and the gap: against the baseline at
  the last step both evaluated (its step in the last column), or else against the same weights
  in full precision at the run's last evaluation."""
  baseline = _baseline(runs)
  rows = [f"{'run':<44} {'train loss':>10} {'eval loss':>10} {'eval fp':>10} {'gap':>8} "
          f"{'at step':>7}"]
  missing = False
  for run in runs:
    train = run.train_loss[-1] if run.train_loss else math.nan
    q = run.eval_loss[-1] if run.eval_loss else math.nan
    f = run.eval_loss_fp[-1] if run.eval_loss_fp else math.nan
    gap, at = "-", "-"
    if baseline is not None and run is not baseline:
      steps, gaps = gap_to_baseline(run, baseline)
      if steps:
        gap, at = f"{gaps[-1]:+.2f}%", str(steps[-1])
      missing = missing or not steps
    elif baseline is None and math.isfinite(f) and f and not run.full_precision:
      gap, at = f"{100 * (q - f) / f:+.2f}%", str(run.eval_steps[-1])
    rows.append(f"{run.label[:44]:<44} {train:>10.4f} {q:>10.4f} {f:>10.4f} {gap:>8} {at:>7}")
  if baseline is not None:
    note = (f"gap: eval loss relative to the baseline {baseline.label} at the last step both "
            "evaluated")
    if missing:
      note += "; '-': no step both evaluated, so no gap"
  else:
    note = ("gap: eval loss with the run's quantization relative to the same weights in full "
            "precision")
  return "\n".join(rows + [f"({note})"])


def default_out(workdirs) -> str:
  """<workdir>/loss.png for one run; loss_<a>_vs_<b>....png beside the first for several."""
  first = os.path.normpath(workdirs[0])
  if len(workdirs) == 1:
    return os.path.join(first, "loss.png")
  names = "_vs_".join(os.path.basename(os.path.normpath(w)) for w in workdirs)
  return os.path.join(os.path.dirname(first), f"loss_{names[:150]}.png")


def auto_window(runs) -> int:
  """The default smoothing window: a twentieth of the longest run's logged steps (at least 1)."""
  return max(1, max(len(r.train_steps) for r in runs) // 20)


def plot_runs(runs, out: str, window: int = 0) -> str:
  """Draws `runs` (Run objects) into the PNG `out`; returns its path. Needs matplotlib.
  `window`: the training loss's moving-average window (0: `auto_window`)."""
  window = window or auto_window(runs)
  try:
    import matplotlib
  except ImportError as e:
    raise PlotError(MATPLOTLIB_MISSING) from e
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  baseline = _baseline(runs)
  fig, (ax, gap_ax) = plt.subplots(1, 2, figsize=(13, 5))
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for i, run in enumerate(runs):
    color = colors[i % len(colors)]
    if run.train_steps:
      ax.plot(run.train_steps, run.train_loss, color=color, alpha=0.2, linewidth=0.8)
      ax.plot(run.train_steps, smooth(run.train_loss, window), color=color,
              label=f"{run.label}: train")
    if run.eval_steps:
      ax.plot(run.eval_steps, run.eval_loss, "o", color=color,
              label=f"{run.label}: eval ({run.recipe})")
      if not run.full_precision:
        ax.plot(run.eval_steps, run.eval_loss_fp, "o", mfc="none", color=color,
                label=f"{run.label}: eval, same weights in full precision")
    if baseline is not None and run is not baseline:
      steps, gap = gap_to_baseline(run, baseline)
      if steps:
        gap_ax.plot(steps, gap, "o-", color=color, label=run.label)
    elif baseline is None and not run.full_precision:
      steps, gap = eval_gap(run)
      gap_ax.plot(steps, gap, "o-", color=color, label=run.label)
  ax.set_xlabel("step")
  ax.set_ylabel("loss")
  ax.set_title("Loss" + (f" (train: moving average over {window} logged steps)" if window > 1
                         else " (train: every logged step)"))
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3)
  gap_ax.axhline(0.0, color="black", linewidth=0.8)
  gap_ax.set_xlabel("step")
  if baseline is not None:
    gap_ax.set_ylabel(f"eval loss above the {baseline.recipe} run (%)")
    gap_ax.set_title(f"eval loss gap vs {baseline.label}, % at equal steps", fontsize=10)
  else:
    gap_ax.set_ylabel("eval loss above the same weights in full precision (%)")
    gap_ax.set_title("FP4 gap at evaluation: quantized vs full precision")
  if gap_ax.get_legend_handles_labels()[0]:
    gap_ax.legend(fontsize=8)
  else:
    gap_ax.text(0.5, 0.5, NO_COMMON_STEPS if baseline is not None else
                "no low-precision evaluation to compare", ha="center", wrap=True,
                transform=gap_ax.transAxes)
  warnings = config_warnings(runs)
  if warnings:  # on the picture too: it outlives the terminal
    fig.suptitle("Not like with like: the runs differ in " + "; ".join(warnings[:4])
                 + ("; ..." if len(warnings) > 4 else ""), color="firebrick", fontsize=9,
                 wrap=True)
  gap_ax.grid(alpha=0.3)
  fig.tight_layout(rect=(0, 0, 1, 0.92) if warnings else None)
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  fig.savefig(out, dpi=110)
  plt.close(fig)
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m lpjax.plot", description=__doc__.split("\n\n")[0],
      epilog="Example: python -m lpjax.plot runs/llama_tiny_mxfp4 runs/llama_tiny_bf16")
  parser.add_argument("workdirs", nargs="+", metavar="WORKDIR", help="train.py workdirs")
  parser.add_argument("--out", default="", help="the PNG to write (default: <workdir>/loss.png "
                      "for one run, loss_<a>_vs_<b>.png beside the first for several)")
  parser.add_argument("--smooth", type=int, default=0,
                      help="moving-average window over logged training steps (default: a "
                      "twentieth of them)")
  args = parser.parse_args(argv)
  try:
    runs = [read_run(w) for w in args.workdirs]
    warnings = config_warnings(runs)
    if warnings:
      print("Warning: these runs differ in more than the recipe, so their gap is not the "
            "recipe's alone:\n  " + "\n  ".join(warnings), file=sys.stderr)
    print(summary_table(runs))
    out = plot_runs(runs, args.out or default_out(args.workdirs), max(args.smooth, 0))
  except PlotError as e:
    print(f"Plot error: {e}", file=sys.stderr)
    return 2
  print(f"Wrote {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
