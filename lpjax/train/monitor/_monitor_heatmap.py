"""monitor_heatmap.png: sites x steps of the monitor's SNR and gradient-noise ratio.

Read from <workdir>/monitor.jsonl at the end of a run (so a resumed run's picture covers all of
it). Top: per site and block, the lowest `out_snr_db` of its quantized passes (dB; FP4 is about
12-16, below `monitor.min_out_snr_db` is an alert); bottom: `grad_noise_ratio` on a log scale
(below sqrt(3) the FP4 weight gradient is mostly noise). Each panel's colours turn at its alert
threshold: red below it, yellow at it, green above, so a healthy run is green whatever its range.
An exact reading (infinite SNR or ratio) is drawn at the top of the scale; a site that did not
run in that step is grey, one that saw a NaN or an infinity is black; white: not measured.
Without matplotlib (requirements-plot.txt) it logs a line and writes nothing.
"""

from __future__ import annotations

import json
import logging
import math
import os

import numpy as np

FILENAME = "monitor_heatmap.png"
log = logging.getLogger("lpjax.train.monitor")


def _read(path: str) -> list:
  rows = []
  with open(path) as f:
    for line in f:
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return rows


# the colour codes of `status_grid`
STATUS_CODES = {"not_run": 1.0, "nonfinite": 2.0}


def _number(v):
  return math.nan if v is None else float(v)  # "inf" (exact) is math.inf


def grids(rows: list):
  """(site labels, steps, snr grid, gnr grid): NaN where a site was not measured (or did not run,
  or saw non-finite values: `status_grid`), inf where it was exact."""
  labels, steps = [], sorted({r["step"] for r in rows})
  for r in rows:
    label = r["path"] + ("" if r.get("block") is None else f"[{r['block']}]") + (
        f"#{r['call']}" if r.get("call") else "")
    r["_label"] = label
    if label not in labels:
      labels.append(label)
  snr = np.full((len(labels), len(steps)), np.nan)
  gnr = np.full_like(snr, np.nan)
  col = {s: i for i, s in enumerate(steps)}
  line = {l: i for i, l in enumerate(labels)}
  for r in rows:
    i, j = line[r["_label"]], col[r["step"]]
    if r.get("status", "ok") in STATUS_CODES:
      continue
    values = [_number(r[g]["out_snr_db"]) for g in ("fwd", "dgrad", "wgrad")
              if len(r.get(g, {})) > 1 and r[g]["out_snr_db"] is not None]
    if values:
      snr[i, j] = min(values)
    if r.get("grad_noise_ratio") is not None:
      gnr[i, j] = _number(r["grad_noise_ratio"])
  return labels, steps, snr, gnr


def status_grid(rows: list, labels: list, steps: list):
  """NaN, or STATUS_CODES of the (site, step) cells that did not run or saw non-finite values
  (after `grids`, which labels the rows)."""
  grid = np.full((len(labels), len(steps)), np.nan)
  line, col = {l: i for i, l in enumerate(labels)}, {s: i for i, s in enumerate(steps)}
  for r in rows:
    code = STATUS_CODES.get(r.get("status", "ok"))
    if code is not None:
      grid[line[r["_label"]], col[r["step"]]] = code
  return grid


def threshold_limits(grid, threshold: float) -> tuple[float, float, float]:
  """(vmin, vcenter, vmax) of a panel whose colours turn at `threshold`: the data's range,
  widened to at least one unit either side of the threshold.

  Examples:
    >>> threshold_limits(np.array([[12.0, 14.5], [np.nan, 13.0]]), 6.0)
    (5.0, 6.0, 14.5)
  """
  finite = grid[np.isfinite(grid)]
  low = float(finite.min()) if finite.size else threshold
  high = float(finite.max()) if finite.size else threshold
  return min(low, threshold - 1.0), threshold, max(high, threshold + 1.0)


def write_heatmap(workdir: str, *, min_out_snr_db: float = 6.0,
                  min_grad_noise_ratio: float = math.sqrt(3.0)) -> str | None:
  """Writes <workdir>/monitor_heatmap.png; returns its path (None: no data or no matplotlib).
  The thresholds (the monitor's config keys) are where each panel's colours turn."""
  path = os.path.join(workdir, "monitor.jsonl")
  rows = _read(path) if os.path.exists(path) else []
  if not rows:
    return None
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    log.info("matplotlib is not installed, so no %s was drawn (pip install -r "
             "requirements-plot.txt; monitor.jsonl holds the numbers).", FILENAME)
    return None
  labels, steps, snr, gnr = grids(rows)
  marks = np.ma.masked_invalid(status_grid(rows, labels, steps))
  height = 1.5 + 0.22 * len(labels)
  fig, axes = plt.subplots(2, 1, figsize=(max(6.0, 0.3 * len(steps) + 4), 2 * height))
  from matplotlib.colors import ListedColormap, TwoSlopeNorm

  gnr_threshold = math.log10(min_grad_noise_ratio)
  panels = ((snr, f"lowest out_snr_db of the quantized passes (dB; alert below "
             f"{min_out_snr_db:g})", min_out_snr_db),
            (np.log10(np.where(gnr > 0, gnr, np.nan)), "log10 grad_noise_ratio (alert below "
             f"{gnr_threshold:.2f} = log10 {min_grad_noise_ratio:.3g})", gnr_threshold))
  for ax, (grid, title, threshold) in zip(axes, panels):
    vmin, vcenter, vmax = threshold_limits(grid, threshold)
    grid = np.where(np.isposinf(grid), vmax, grid)  # exact: the top of the scale
    image = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap="RdYlGn",
                      interpolation="nearest", norm=TwoSlopeNorm(vcenter, vmin, vmax))
    if marks.count():  # grey: did not run; black: non-finite
      ax.imshow(marks, aspect="auto", interpolation="nearest", vmin=1.0, vmax=2.0,
                cmap=ListedColormap(["lightgrey", "black"]))
    ax.set_title(title + ("; grey: did not run, black: NaN / Inf" if marks.count() else ""),
                 fontsize=9)
    ax.set_yticks(range(len(labels)), labels, fontsize=6)
    ticks = range(0, len(steps), max(1, len(steps) // 12))
    ax.set_xticks(list(ticks), [str(steps[i]) for i in ticks], fontsize=7)
    ax.set_xlabel("step", fontsize=8)
    fig.colorbar(image, ax=ax)
  fig.tight_layout()
  out = os.path.join(workdir, FILENAME)
  fig.savefig(out, dpi=110)
  plt.close(fig)
  log.info("Monitor heatmap (sites x steps of SNR and gradient-noise ratio): %s", out)
  return out
