"""Results of benchmarks/sweeps/ablate.py: per-row statistics, the markdown table, quality goals (the
plots: ablate_plots.py, re-exported here).

A run recorded on another machine than the reference row's run of the same seed (run.json's
"machine", `run_machine.py`) is "other machine": left out of the statistics and named under the
table, since two machines train the same config to different losses.

Statistics over seeds: mean and sample standard deviation (ddof=1; undefined for one seed) of the
final eval loss, over the runs that finished with a finite loss. A run that failed (TrainingError
or any exception) or ended with a non-finite loss is "diverged": it is counted in the seeds column
and, in the quality goals, makes the row's loss +inf (a diverged run is worse than any finite one).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

import ablate_runs as run_records
from ablate_plots import (_distinct_colors, _pyplot, _seed_counts, _tick_label,  # noqa: F401
                         bars_note, plot_curves, plot_final, row_legend, seeds_note)
import run_machine

NAN = float("nan")


# --- runs -------------------------------------------------------------------------------------

def load_run(run_dir: str) -> dict:
  """{"status": ok | diverged | failed | missing, "results", "error", "curve": {step: loss},
  "machine": the fingerprint in run.json, or None}."""
  results_path = os.path.join(run_dir, "results.json")
  failed_path = os.path.join(run_dir, "failed.json")
  run = {"dir": run_dir, "status": "missing", "results": {}, "error": "", "curve": {},
         "machine": None}
  run["machine"] = run_records.recorded(run_dir).get("machine")
  if os.path.exists(results_path):
    with open(results_path) as f:
      run["results"] = json.load(f)
    loss = run["results"].get("final_eval_loss", NAN)
    run["status"] = "ok" if isinstance(loss, (int, float)) and math.isfinite(loss) else "diverged"
  elif os.path.exists(failed_path):
    with open(failed_path) as f:
      failure = json.load(f)
    run["status"], run["error"] = "failed", f"{failure.get('type', '')}: {failure.get('error', '')}"
  metrics_path = os.path.join(run_dir, "metrics.jsonl")
  if os.path.exists(metrics_path):
    with open(metrics_path) as f:
      for line in f:
        try:
          record = json.loads(line)
        except json.JSONDecodeError:
          continue
        if "train/loss" in record:
          run["curve"][int(record["step"])] = float(record["train/loss"])
  return run


def _mean_std(values):
  values = [v for v in values if math.isfinite(v)]
  if not values:
    return NAN, NAN
  std = float(np.std(values, ddof=1)) if len(values) > 1 else NAN
  return float(np.mean(values)), std


def row_stats(runs: list[dict]) -> dict:
  """Mean / std over the finished runs of one row, and how many seeds finished."""
  ok = [r for r in runs if r["status"] == "ok"]
  get = lambda key: [float(r["results"].get(key, NAN)) for r in ok]
  mean, std = _mean_std(get("final_eval_loss"))
  fp_mean, fp_std = _mean_std(get("final_eval_loss_fp"))
  train_mean, _ = _mean_std(get("final_train_loss"))
  wall_mean, _ = _mean_std(get("wall_time_s"))
  done = [r for r in runs if r["status"] not in ("missing", "other machine")]
  return {"n": len(runs), "n_done": len(done), "n_ok": len(ok), "n_diverged": len(done) - len(ok),
          "mean": mean, "std": std, "fp_mean": fp_mean, "fp_std": fp_std, "train_mean": train_mean,
          "wall_mean": wall_mean, "errors": [r["error"] for r in runs if r["error"]]}


def mean_curve(runs: list[dict]) -> dict:
  """Train loss per logged step: mean and std over the finished runs (steps all of them logged)."""
  curves = [r["curve"] for r in runs if r["status"] == "ok" and r["curve"]]
  if not curves:
    return {"steps": [], "mean": [], "std": []}
  steps = sorted(set.intersection(*(set(c) for c in curves)))
  values = np.array([[c[s] for s in steps] for c in curves], dtype=np.float64)
  std = values.std(axis=0, ddof=1) if len(curves) > 1 else np.full(len(steps), NAN)
  return {"steps": steps, "mean": values.mean(axis=0).tolist(), "std": std.tolist()}


def _leave_out_other_machines(rows: list[dict], reference: str) -> list[str]:
  """Marks (status "other machine") each finished run whose machine is not that of the reference
  row's run of the same seed; returns a line per such run."""
  ref = next((r for r in rows if r["label"] == reference), None)
  if ref is None:
    return []
  ref_machine = {r.get("seed"): r.get("machine") for r in ref["runs"] if r["status"] != "missing"}
  notes = []
  for row in rows:
    for run in row["runs"]:
      seed = run.get("seed")
      if (row is ref or run["status"] == "missing" or seed not in ref_machine
          or run_machine.same_machine(run.get("machine"), ref_machine[seed])):
        continue
      run["status"] = "other machine"
      notes.append(f"{row['label']} seed {seed}: ran on {run_machine.describe(run.get('machine'))}, "
                   f"the reference on {run_machine.describe(ref_machine[seed])}")
  return notes


def _finished_losses(row: dict) -> dict:
  """{seed: final eval loss} of the row's finished runs."""
  return {r["seed"]: float(r["final_eval_loss"]) for r in row["runs"]
          if r["status"] == "ok" and r.get("final_eval_loss") is not None
          and math.isfinite(float(r["final_eval_loss"]))}


def _ratio_pct(losses: dict, ref_losses: dict) -> float:
  """mean / mean(reference) - 1 in %, both over the seeds that finished in both rows, so that a
  row with fewer seeds so far is compared with the reference's runs of the same seeds."""
  seeds = sorted(set(losses) & set(ref_losses))
  if not seeds:
    return NAN
  ref_mean = float(np.mean([ref_losses[k] for k in seeds]))
  return (float(np.mean([losses[k] for k in seeds])) / ref_mean - 1.0) * 100.0 if ref_mean > 0 else NAN


def summarize(sweep: str, rows: list[dict], reference: str, meta: dict) -> dict:
  """rows: [{"label", "recipe", "optimizer", "lr", "overrides", "command", "runs"}] -> summary."""
  out_rows = []
  other_machines = _leave_out_other_machines(rows, reference)
  for row in rows:
    stats = row_stats(row["runs"])
    out_rows.append({**{k: v for k, v in row.items() if k != "runs"}, **stats,
                     "curve": mean_curve(row["runs"]),
                     "runs": [{"seed": r.get("seed"), "status": r["status"], "error": r["error"],
                               "machine": r.get("machine"),
                               **{k: r["results"].get(k) for k in
                                  ("final_eval_loss", "final_eval_loss_fp", "final_train_loss",
                                   "wall_time_s", "skipped_steps", "steps")}}
                              for r in row["runs"]]})
  ref = next((r for r in out_rows if r["label"] == reference), None)
  ref_losses = _finished_losses(ref) if ref else {}
  for r in out_rows:
    r["ratio_pct"] = _ratio_pct(_finished_losses(r), ref_losses)
  return {"sweep": sweep, "reference": reference, **meta, "rows": out_rows,
          "other_machines": other_machines}


# --- markdown ---------------------------------------------------------------------------------

def _pm(mean, std, digits=4):
  if not math.isfinite(mean):
    return "—"
  return f"{mean:.{digits}f} ± {std:.{digits}f}" if math.isfinite(std) else f"{mean:.{digits}f}"


def _seeds(r):
  text = f"{r['n_ok']}/{r['n']}"
  if r["n_diverged"]:
    text += f" ({r['n_diverged']} diverged)"
  return text


def _recipe_cell(r):
  extra = ", ".join(f"{k}={v}" for k, v in r.get("overrides", ()))
  return f"`{r['recipe']}`" + (f" ({extra})" if extra else "")


def markdown(summary: dict) -> str:
  s = summary
  lines = [f"# Ablation: {s['sweep']}", "", s.get("description", ""), "",
           f"LLaMA-{s.get('size', '?')} ({s.get('scale', '?')} scale), {s.get('steps', '?')} steps, "
           f"seeds {', '.join(str(k) for k in s.get('seeds', []))}. Final eval loss: mean ± sample "
           f"std over the seeds that finished; \"vs FP32 Adam\" = mean / mean({s['reference']}) - 1 over "
           "the seeds that finished in both; "
           "\"quant off\" evaluates the same weights with every GEMM in fp32.", "",
           "| row | recipe | optimizer | lr | final eval loss | eval loss, quant off | vs FP32 Adam "
           "| wall time / run | seeds |",
           "|---|---|---|---|---|---|---|---|---|"]
  for r in s["rows"]:
    ratio = f"{r['ratio_pct']:+.2f}%" if math.isfinite(r["ratio_pct"]) else "—"
    wall = f"{r['wall_mean']:.0f} s" if math.isfinite(r["wall_mean"]) else "—"
    lines.append(f"| {r['label']} | {_recipe_cell(r)} | {r['optimizer']} | {r['lr']:g} | "
                 f"{_pm(r['mean'], r['std'])} | {_pm(r['fp_mean'], r['fp_std'])} | {ratio} | {wall} | "
                 f"{_seeds(r)} |")
  if s.get("other_machines"):
    lines += ["", "Left out, trained on another machine than the reference run of their seed "
              "(`ablate.py --rerun-other-machines` trains them again here):", ""]
    lines += [f"- {note}" for note in s["other_machines"]]
  errors = [(r["label"], e) for r in s["rows"] for e in r["errors"]]
  if errors:
    lines += ["", "Failed runs:", ""] + [f"- {label}: {e}" for label, e in errors]
  lines += ["", "Reproduce a row (seed 0; `--config.seed=K` for seed K):", ""]
  lines += [f"- {r['label']}: `{r['command']}`" for r in s["rows"]]
  return "\n".join(lines) + "\n"



def write_reports(summary: dict, out_dir: str) -> dict:
  """DIR/<sweep>.md, .json, _curves.png, _final.png; returns their paths."""
  os.makedirs(out_dir, exist_ok=True)
  name = summary["sweep"]
  paths = {"md": os.path.join(out_dir, f"{name}.md"), "json": os.path.join(out_dir, f"{name}.json"),
           "curves": os.path.join(out_dir, f"{name}_curves.png"),
           "final": os.path.join(out_dir, f"{name}_final.png")}
  with open(paths["md"], "w") as f:
    f.write(markdown(summary))
  with open(paths["json"], "w") as f:
    json.dump(summary, f, indent=1, default=str)
  plot_curves(summary, paths["curves"])
  plot_final(summary, paths["final"])
  return paths


# --- the quality goals ----------------------------------------------------------------

def _effective(stats):
  """The row's loss for the goals: None if not run, +inf if a seed diverged, else the mean."""
  if stats is None or stats["n_done"] == 0:
    return None
  if stats["n_diverged"] or stats["n_done"] < stats["n"]:
    return math.inf if stats["n_diverged"] else None
  return stats["mean"]


def _fmt(v):
  return "not run" if v is None else ("diverged" if v == math.inf else f"{v:.4f}")


def quality_goals(stats: dict) -> list[dict]:
  """The issue's goals from the `quality` sweep's row stats (label -> row_stats); thresholds fixed.

  Returns [{"goal", "measured", "holds"}] with holds True / False / None (rows missing).
  """
  e = {label: _effective(s) for label, s in stats.items()}
  goals = []

  def add(goal, measured, holds):
    goals.append({"goal": goal, "measured": measured, "holds": holds})

  def ratio_goal(label, limit_pct, text):
    a, ref = e.get(label), e.get("fp32_adam")
    if a is None or ref is None:
      return add(text, f"{_fmt(a)} vs {_fmt(ref)}", None)
    pct = (a / ref - 1) * 100 if math.isfinite(a) and math.isfinite(ref) else math.inf
    add(text, f"{_fmt(a)} vs {_fmt(ref)} ({pct:+.2f}%)", bool(pct <= limit_pct))

  def le_goal(a_label, b_label, text):
    a, b = e.get(a_label), e.get(b_label)
    holds = None if a is None or b is None else bool(a <= b)
    add(text, f"{_fmt(a)} vs {_fmt(b)}", holds)

  ratio_goal("mxfp4_bwd_adam", 1.0, "mxfp4_bwd within +1% of FP32 Adam")
  ratio_goal("mxfp4_adam", 3.0, "mxfp4 within +3% of FP32 Adam")
  le_goal("nvfp4_adam", "mxfp4_adam", "nvfp4 no worse than mxfp4")
  # "Visibly": the difference exceeds twice its standard error sqrt(s1^2/n1 + s2^2/n2).
  naive, mx = e.get("mxfp4_naive_adam"), e.get("mxfp4_adam")
  if naive is None or mx is None:
    add("mxfp4_naive visibly worse than mxfp4", f"{_fmt(naive)} vs {_fmt(mx)}", None)
  else:
    s1, s2 = stats["mxfp4_naive_adam"], stats["mxfp4_adam"]
    se = math.sqrt(sum((s["std"] ** 2) / s["n_ok"] for s in (s1, s2)
                       if s["n_ok"] > 1 and math.isfinite(s["std"])))
    diff = naive - mx
    add("mxfp4_naive visibly worse than mxfp4 (difference > 2 standard errors)",
        f"{_fmt(naive)} vs {_fmt(mx)} (diff {diff:+.4f}, 2 SE {2 * se:.4f})", bool(diff > 2 * se))
  le_goal("fp32_stable_spam", "fp32_adam", "stable_spam <= adam in FP32")
  le_goal("mxfp4_stable_spam", "mxfp4_adam", "stable_spam <= adam in MXFP4")
  # 3x lr: the premise (adam + mxfp4 degrades: > +1% over its 1x loss, or diverges), then
  # stable_spam + mxfp4 at 3x finishes every seed, within +1% of its 1x loss and below adam's 3x.
  a1, a3 = e.get("mxfp4_adam"), e.get("mxfp4_adam_lr3x")
  s1, s3 = e.get("mxfp4_stable_spam"), e.get("mxfp4_stable_spam_lr3x")
  if a1 is None or a3 is None:
    add("adam + mxfp4 degrades at 3x lr (> +1% over 1x, or diverges)", f"{_fmt(a3)} vs {_fmt(a1)}", None)
  else:
    add("adam + mxfp4 degrades at 3x lr (> +1% over 1x, or diverges)", f"{_fmt(a3)} vs {_fmt(a1)}",
        bool(a3 > 1.01 * a1))
  if None in (s1, s3, a3):
    add("stable_spam + mxfp4 stable at 3x lr", f"{_fmt(s3)} vs 1x {_fmt(s1)}", None)
  else:
    add("stable_spam + mxfp4 stable at 3x lr (all seeds finish, <= +1% over its 1x, < adam 3x)",
        f"{_fmt(s3)} vs 1x {_fmt(s1)}, adam 3x {_fmt(a3)}",
        bool(math.isfinite(s3) and s3 <= 1.01 * s1 and s3 < a3))
  return goals


def quality_markdown(goals: list[dict]) -> str:
  mark = {True: "yes", False: "NO", None: "not measured"}
  lines = ["## Quality goals (mean final eval loss over seeds, equal steps)", "",
           "| goal | measured | holds |", "|---|---|---|"]
  lines += [f"| {g['goal']} | {g['measured']} | {mark[g['holds']]} |" for g in goals]
  return "\n".join(lines) + "\n"
