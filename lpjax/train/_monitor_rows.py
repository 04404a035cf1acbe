"""The monitor's records: one monitor.jsonl line per measured site and block (`row`), and the
`monitor.*` thresholds a line crosses (`alerts`); docs/numerics_monitor.md, "In training"."""

from __future__ import annotations

import math

import numpy as np

from lpjax.quant.monitor import observer
from lpjax.quant.monitor.operand_numerics import STATS

# (statistic, threshold key, lower is bad); operand statistics are checked on every quantized
# operand of a pass, out_snr_db per pass, grad_noise_ratio per site (a backward statistic).
OPERAND_CHECKS = (("saturated", "max_saturated", False), ("flushed", "max_flushed", False),
                  ("clamped_scales", "max_clamped_scales", False))
PASS_OF = {"fwd": "fwd", "dgrad": "bwd", "wgrad": "bwd"}


def _finite(v):
  """A JSON number: non-finite values (not measured, or an exact product's infinite SNR) as null."""
  v = float(v)
  return v if math.isfinite(v) else None


def fmt_value(v) -> str:
  return "null" if v is None else f"{v:.4g}"


def row(step: int, loss: float, key, block: int, info, values) -> dict:
  """One monitor.jsonl line: the statistics of site `key` (a SiteKey) in block row `block`.

  {"step", "path", "block", "call", "recipe", "loss", "grad_noise_ratio",
   "fwd": {"out_snr_db", "x": {snr_db, rel_err, saturated, flushed, scale_min, scale_max,
   scale_std, clamped_scales}, "w": {...}}, "dgrad": {"out_snr_db", "dy", "w"}, "wgrad": {...}};
  an operand the recipe does not quantize is absent.
  """
  v = dict(zip(observer.SINK_FIELDS, np.asarray(values, np.float64).tolist()))
  block = block if key.block == "scan" else int(key.block) if key.block else None
  out = dict(step=int(step), path=key.path, block=block, call=key.count,
             recipe=info.recipe, loss=_finite(loss),
             grad_noise_ratio=_finite(v["grad_noise_ratio"]))
  for gemm in observer.PASSES:
    out[gemm] = {"out_snr_db": _finite(v[f"{gemm}.out_snr_db"])}
  for gemm, operand, _ in info.operands:
    out[gemm][operand] = {s: _finite(v[f"{gemm}.{operand}.{s}"]) for s in STATS}
  return out


def alerts(r: dict, m) -> list[dict]:
  """The thresholds of config section `m` that row `r` crosses: [{statistic, value, threshold
  key, threshold, pass}] ("fwd" or "bwd": which GEMMs a fallback would switch).

  Examples:
    >>> from lpjax.train.config import llama_config
    >>> ok = dict(snr_db=18.0, rel_err=0.1, saturated=0.02, flushed=0.1, scale_min=-3.0,
    ...           scale_max=0.0, scale_std=0.5, clamped_scales=0.0)
    >>> r = {"grad_noise_ratio": 1.2, "fwd": {"out_snr_db": 3.5, "x": ok, "w": ok},
    ...      "dgrad": {"out_snr_db": None}, "wgrad": {"out_snr_db": 14.0, "dy": ok}}
    >>> [(a["statistic"], a["pass"], a["threshold"]) for a in alerts(r, llama_config().monitor)]
    [('fwd.out_snr_db', 'fwd', 6.0), ('grad_noise_ratio', 'bwd', 1.732)]
  """
  found = []

  def check(stat, value, key, low_bad):
    limit = m[key]
    if value is not None and (value < limit if low_bad else value > limit):
      found.append(dict(statistic=stat, value=value, key=key, threshold=limit,
                        **{"pass": PASS_OF[stat.split(".")[0]] if "." in stat else "bwd"}))

  for gemm in observer.PASSES:
    operands = {k: v for k, v in r[gemm].items() if k != "out_snr_db"}
    if not operands:
      continue  # not quantized (the statistics of a high-precision pass are no alarm)
    check(f"{gemm}.out_snr_db", r[gemm]["out_snr_db"], "min_out_snr_db", True)
    for operand, stats in operands.items():
      for stat, key, low_bad in OPERAND_CHECKS:
        check(f"{gemm}.{operand}.{stat}", stats[stat], key, low_bad)
  if len(r["wgrad"]) > 1:
    check("grad_noise_ratio", r["grad_noise_ratio"], "min_grad_noise_ratio", True)
  return found
