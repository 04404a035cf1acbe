"""`SiteStats`: the table `lpjax.quant.site_stats` returns, one row per site, block and operand.

Examples:
  >>> t = SiteStats(rows=[dict(path="a", block=None, call=0, gemm="fwd", operand="x", snr_db=20.0,
  ...                         loss_delta=0.1), dict(path="b", block=None, call=0, gemm="fwd",
  ...                         operand="x", snr_db=12.0, loss_delta=0.5)])
  >>> [r["path"] for r in t.worst(1).rows], [r["path"] for r in t.worst(2, by="loss_delta").rows]
  (['b'], ['b', 'a'])
  >>> print(t.to_markdown(columns=("path", "gemm", "operand", "snr_db")))
  | path | gemm | operand | snr_db |
  |---|---|---|---|
  | a | fwd | x | 20.00 |
  | b | fwd | x | 12.00 |
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

# Statistics where lower is worse (the rest: higher is worse).
LOWER_IS_WORSE = ("snr_db", "out_snr_db", "grad_noise_ratio", "scale_min")
# Statistics of a whole site (the same in each of its operand rows).
SITE_FIELDS = ("grad_noise_ratio", "loss_delta", "flops")
COLUMNS = ("path", "block", "gemm", "operand", "snr_db", "rel_err", "saturated", "flushed",
           "scale_min", "scale_max", "scale_std", "clamped_scales", "out_snr_db",
           "grad_noise_ratio", "loss_delta", "status")


def _site(row) -> tuple:
  return row.get("path"), row.get("block"), row.get("call", 0)


def _json_value(v):
  if isinstance(v, float) and not math.isfinite(v):
    return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
  return v


@dataclasses.dataclass
class SiteStats:
  """Per-site, per-operand numerics of one forward and backward pass (`site_stats`).

  rows: one dict per (site, block, quantized operand); fields in docs/numerics_monitor.md (a row's
  `status`: "ok", "exact", "nonfinite" or "not_run" says what its numbers are).
  loss: the quantized loss of the pass (the run's own, unchanged); grads: its gradients with
  respect to the first argument; hp_loss: the loss with every measured site in high precision
  (when loss_delta was measured, else None).
  """

  rows: list
  loss: Any = None
  grads: Any = None
  hp_loss: Any = None

  def sites(self) -> list[tuple]:
    """The (path, block, call) of every site, in program order."""
    out = []
    for r in self.rows:
      if _site(r) not in out:
        out.append(_site(r))
    return out

  def worst(self, n: int = 10, by: str = "snr_db") -> "SiteStats":
    """The `n` worst rows by statistic `by` (lowest SNR / grad_noise_ratio, highest otherwise;
    NaN last). For a per-site statistic (grad_noise_ratio, loss_delta) one row per site."""
    lower = by in LOWER_IS_WORSE
    rows = [r for r in self.rows if isinstance(r.get(by), (int, float))]
    rows = [r for r in rows if not math.isnan(r[by])]
    if by in SITE_FIELDS:
      seen, unique = set(), []
      for r in rows:
        if _site(r) not in seen:
          seen.add(_site(r))
          unique.append(r)
      rows = unique
    rows = sorted(rows, key=lambda r: r[by] if lower else -r[by])
    return dataclasses.replace(self, rows=rows[:n])

  def to_markdown(self, columns=COLUMNS) -> str:
    """A markdown table of `columns` (floats with 2 decimals, small fractions in e-notation)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in self.rows:
      lines.append("| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |")
    return "\n".join(lines)

  def to_json(self) -> str:
    """JSON: {"loss", "hp_loss", "rows"}; NaN (not measured) is null, infinite SNR is "inf"."""
    rows = [{k: _json_value(v) for k, v in r.items()} for r in self.rows]
    loss = None if self.loss is None else float(self.loss)
    hp = None if self.hp_loss is None else float(self.hp_loss)
    return json.dumps({"loss": _json_value(loss), "hp_loss": _json_value(hp), "rows": rows})

  def __str__(self) -> str:
    return self.to_markdown()

  def _repr_pretty_(self, p, cycle):
    p.text(str(self))


def _fmt(v) -> str:
  if v is None:
    return ""
  if isinstance(v, float):
    if math.isnan(v):
      return "-"
    if v != 0 and abs(v) < 0.01:
      return f"{v:.2e}"
    return f"{v:.2f}"
  return str(v)
