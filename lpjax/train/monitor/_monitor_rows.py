"""The monitor's records: one monitor.jsonl line per measured site and block (`row`), and the
`monitor.*` thresholds a line crosses (`alerts`); docs/numerics_monitor.md, "In training".

The encodings (valid JSON, no bare NaN or Infinity): a line's `status` is "ok", "nonfinite" (the
site saw a NaN or an infinity in that step: every statistic null) or "not_run" (the site never ran,
e.g. the untaken branch of a `cond`: every statistic null); an operand's `status` is "ok" or
"exact" (quantized without error); a statistic is a number, null (not measured or not meaningful:
the status says why) or "inf" / "-inf" (an exact product's infinite SNR or gradient-noise ratio).
Only "ok" and "exact" lines are checked against the thresholds.
"""

from __future__ import annotations

import math

import numpy as np

from lpjax.quant.monitor import observer, sink
from lpjax.quant.monitor.operand_numerics import STATS

# (statistic, threshold key, lower is bad); operand statistics are checked on every quantized
# operand of a pass, out_snr_db per pass, grad_noise_ratio per site (a backward statistic).
OPERAND_CHECKS = (("saturated", "max_saturated", False), ("flushed", "max_flushed", False),
                  ("clamped_scales", "max_clamped_scales", False))
PASS_OF = {"fwd": "fwd", "dgrad": "bwd", "wgrad": "bwd"}


MEASURED = ("ok", "exact")  # the statuses whose numbers are readings


def _json(v):
  """A JSON value: NaN (not measured) as null, infinities as "inf" / "-inf".

  Examples:
    >>> _json(float("nan")), _json(float("inf")), _json(2.5)
    (None, 'inf', 2.5)
  """
  v = float(v)
  if math.isnan(v):
    return None
  return v if math.isfinite(v) else ("inf" if v > 0 else "-inf")


def number(v):
  """A monitor.jsonl statistic as a float (None stays None; "inf" is math.inf)."""
  return None if v is None else float(v)


def fmt_value(v) -> str:
  return "null" if v is None else f"{number(v):.4g}"


def row(step: int, loss: float, key, block: int, info, values) -> dict:
  """One monitor.jsonl line: the statistics of site `key` (a SiteKey) in block row `block`.

  {"step", "path", "block", "call", "recipe", "status", "loss", "grad_noise_ratio",
   "fwd": {"out_snr_db", "x": {status, snr_db, rel_err, saturated, flushed, scale_min, scale_max,
   scale_std, clamped_scales}, "w": {...}}, "dgrad": {"out_snr_db", "dy", "w"}, "wgrad": {...}};
  an operand the recipe does not quantize is absent (the module docstring has the encodings).
  """
  v = dict(zip(observer.SINK_FIELDS, np.asarray(values, np.float64).tolist()))
  block = block if key.block == "scan" else int(key.block) if key.block else None
  loss = float(loss)
  out = dict(step=int(step), path=key.path, block=block, call=key.count,
             recipe=info.recipe, status=sink.status(v),
             loss=loss if math.isfinite(loss) else None,
             grad_noise_ratio=_json(v["grad_noise_ratio"]))
  for gemm in observer.PASSES:
    out[gemm] = {"out_snr_db": _json(v[f"{gemm}.out_snr_db"])}
  for gemm, operand, _ in info.operands:
    out[gemm][operand] = dict(status=sink.status(v, f"{gemm}.{operand}"),
                              **{s: _json(v[f"{gemm}.{operand}.{s}"]) for s in STATS})
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
  if r.get("status", "ok") not in MEASURED:
    return found  # a site that did not run, or saw a NaN or an infinity: nothing was measured

  def check(stat, value, key, low_bad):
    limit = m[key]
    value = number(value)
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
