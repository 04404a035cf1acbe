"""The plots of benchmarks/sweeps/ablate.py's reports (`ablate_report`): loss curves per row
(`plot_curves`) and the final eval loss per row with its difference to the reference
(`plot_final`), each stating n, with error bars / bands only where n > 1."""

from __future__ import annotations

import math
import textwrap

import numpy as np

NAN = float("nan")

def _pyplot():
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def _seed_counts(rows: list[dict]) -> tuple[list[int], str]:
  """The distinct seed counts of the rows that have a finished run, and them in words ("3", "1-3")."""
  counts = sorted({int(r.get("n_ok", 0)) for r in rows if r.get("n_ok", 0)})
  if not counts:
    return counts, ""
  return counts, str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def seeds_note(rows: list[dict]) -> str:
  """How many seeds each row's mean has, in words for a plot title: "n = 3 seeds per row (band /
  error bar: ± std)", "n = 1 seed (no error band)", or "n = 1-3 seeds per row (...)"."""
  counts, n = _seed_counts(rows)
  if not counts:
    return "no finished runs"
  if counts[-1] == 1:
    return "n = 1 seed (no error band)"
  return f"n = {n} seeds per row (band / error bar: ± std over the seeds)"


def bars_note(rows: list[dict]) -> str:
  """The bar chart's words for n and its error bars: "n = 1 seed per row (no error bar)",
  "n = 3 seeds per row; error bar: ± sample std over the 3 seeds", or, for mixed counts,
  "n = 1-3 seeds per row (n under each bar); error bar where n > 1: ± sample std over its n seeds".

  >>> bars_note([{"n_ok": 1}, {"n_ok": 1}])
  'n = 1 seed per row (no error bar)'
  >>> bars_note([{"n_ok": 3}, {"n_ok": 3}])
  'n = 3 seeds per row; error bar: ± sample std over the 3 seeds'
  """
  counts, n = _seed_counts(rows)
  if not counts:
    return "no finished runs"
  if counts[-1] == 1:
    return "n = 1 seed per row (no error bar)"
  if len(counts) == 1:
    return f"n = {n} seeds per row; error bar: ± sample std over the {n} seeds"
  return (f"n = {n} seeds per row (n under each bar); error bar where n > 1: ± sample std over "
          "its n seeds")


def row_legend(row: dict) -> str:
  """A row's legend label: its label and, when the plot mixes seed counts, its n."""
  return f"{row['label']} (n={row.get('n_ok', 0)})"


def _distinct_colors(plt, n: int) -> list:
  """n colours, no two alike: tab10's for up to 10 lines, tab20's for up to 20 (the default cycle
  repeats after 10, which gave two rows of one plot the same colour), then a continuous map."""
  if n <= 10:
    return [plt.get_cmap("tab10")(i) for i in range(n)]
  if n <= 20:
    return [plt.get_cmap("tab20")(i) for i in range(n)]
  return [plt.get_cmap("turbo")(i / (n - 1)) for i in range(n)]


def plot_curves(summary: dict, path: str):
  """Left: train loss vs step, mean over seeds (band: ± std where n > 1), the reference dashed.
  Right: each row's mean train loss relative to the reference's at the same step (%), where
  rows that overlap on the left come apart."""
  plt = _pyplot()
  rows = [r for r in summary["rows"] if r["curve"]["steps"]]
  ref = next((r for r in rows if r["label"] == summary["reference"]), None)
  fig, (ax, gap_ax) = plt.subplots(1, 2, figsize=(14, 5.5))
  ref_at = dict(zip(ref["curve"]["steps"], ref["curve"]["mean"])) if ref else {}
  colors = iter(_distinct_colors(plt, sum(r is not ref for r in rows)))
  for r in rows:
    c = r["curve"]
    steps, mean, std = np.array(c["steps"]), np.array(c["mean"]), np.array(c["std"])
    is_ref = r is ref
    line, = ax.plot(steps, mean, "--" if is_ref else "-", color="k" if is_ref else next(colors),
                    label=row_legend(r), lw=1.5)
    if r.get("n_ok", 0) > 1 and np.isfinite(std).any():
      ax.fill_between(steps, mean - std, mean + std, color=line.get_color(), alpha=0.15, lw=0)
    shared = [(s, m) for s, m in zip(c["steps"], c["mean"]) if s in ref_at and ref_at[s]]
    if shared and not is_ref:
      gap_ax.plot([s for s, _ in shared], [100.0 * (m / ref_at[s] - 1.0) for s, m in shared],
                  color=line.get_color(), lw=1.2)
  ax.set_xlabel("training step")
  ax.set_ylabel("train loss (nats/token; mean over seeds)")
  ax.set_title(f"{summary['sweep']}: train loss; {seeds_note(rows)}", fontsize=10)
  gap_ax.axhline(0.0, color="k", ls="--", lw=1)
  gap_ax.set_xlabel("training step")
  gap_ax.set_ylabel(f"train loss vs {summary['reference']} at the same step (%)")
  gap_ax.set_title("each row against the reference (means over seeds)", fontsize=10)
  for a in (ax, gap_ax):
    a.grid(alpha=0.3)
  if ax.get_legend_handles_labels()[0]:  # outside the axes: many rows stay readable
    gap_ax.legend(*ax.get_legend_handles_labels(), fontsize=8, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), frameon=False)
  fig.tight_layout()
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)


def _tick_label(row: dict, with_n: bool, width: int = 26) -> str:
  """A bar's x label: the row's label (with its n where `with_n`), wrapped to lines of at most
  `width` characters."""
  return textwrap.fill(row_legend(row) if with_n else row["label"], width=width,
                       break_long_words=False, break_on_hyphens=False)


def plot_final(summary: dict, path: str):
  """Final eval loss per row (top; error bar ± std only where n > 1 and a std is known) and its
  difference to the reference in % (bottom), one x axis; n in the title, and under each bar too
  where the rows' n differ.

  summary: {"sweep", "reference" (the reference row's label), "rows": [{"label", "mean", "std",
  "n_ok", "ratio_pct"}]}, optionally "title" (default: the sweep) and "reference_name" (the
  reference in the axis labels; default: its label)."""
  plt = _pyplot()
  rows = summary["rows"]
  reference = summary["reference"]
  ref_name = summary.get("reference_name") or reference
  x = np.arange(len(rows))
  mean = np.array([r["mean"] for r in rows], dtype=float)
  std = np.array([r["std"] if r.get("n_ok", 0) > 1 else NAN for r in rows], dtype=float)
  bar = np.isfinite(std) & np.isfinite(mean)  # an error bar only for n > 1 with a known std
  ratio = np.array([r["ratio_pct"] for r in rows], dtype=float)
  ref_mean = next((r["mean"] for r in rows if r["label"] == reference), NAN)
  fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(max(7.0, 0.8 * len(rows) + 2.5), 8.0))
  finite = np.isfinite(mean)
  ax1.bar(x[finite], mean[finite], color="tab:blue")
  if bar.any():
    ax1.errorbar(x[bar], mean[bar], yerr=std[bar], fmt="none", ecolor="k", capsize=4, lw=1.2)
  if finite.any():
    spread = np.nan_to_num(std)
    lo, hi = np.min((mean - spread)[finite]), np.max((mean + spread)[finite])
    pad = max(0.08 * (hi - lo), 1e-3)
    ax1.set_ylim(lo - pad, hi + pad)
  if math.isfinite(ref_mean):
    ax1.axhline(ref_mean, color="k", ls="--", lw=1)
  ax1.set_ylabel("final eval loss (nats/token)\ny axis does not start at 0")
  ax1.set_title("final eval loss" + (f" (dashed line: {ref_name})" if math.isfinite(ref_mean)
                                     else ""), fontsize=10)
  shown = np.isfinite(ratio)
  ax2.bar(x[shown], ratio[shown], color=np.where(ratio[shown] > 0, "tab:red", "tab:green"))
  ratio_bar = bar & shown & (ref_mean > 0)
  if ratio_bar.any():
    ax2.errorbar(x[ratio_bar], ratio[ratio_bar], yerr=(std / ref_mean * 100.0)[ratio_bar],
                 fmt="none", ecolor="k", capsize=4, lw=1.2)
  ax2.axhline(0.0, color="k", lw=1)
  ax2.set_ylabel(f"vs {ref_name} (%)")
  ax2.set_title(f"final eval loss vs {ref_name} (%)"
                + ("; error bar: the row's std in % of the reference's mean" if ratio_bar.any()
                   else ""), fontsize=10)
  mixed = len(_seed_counts(rows)[0]) > 1
  ax2.set_xticks(x, [_tick_label(r, mixed) for r in rows], rotation=30, ha="right", fontsize=9)
  ax2.set_xlabel("row (n = seeds that finished)" if mixed else "row")
  for ax in (ax1, ax2):
    ax.grid(axis="y", alpha=0.3)
  fig.suptitle(f"{summary.get('title') or summary['sweep']}\n{bars_note(rows)}", fontsize=11)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)

