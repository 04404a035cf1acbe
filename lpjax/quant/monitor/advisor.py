"""`advise`: which GEMM call sites to keep in high precision, from measured sensitivity.

The advisor measures every quantized site of `loss_fn` on a few batches (`site_stats` with
`loss_delta`), ranks the sites and keeps the most sensitive ones in the policy's high-precision
recipe, within a budget:

- ranking: first the sites whose weight gradient fails the sqrt(3) criterion of "FP4 All the
  Way" (Chmiel et al. 2025, arXiv 2505.19115: mean `grad_noise_ratio` below sqrt(3), the FP4
  gradient is mostly quantization noise), then every site by its mean `loss_delta` (the loss with
  only that site quantized minus the high-precision loss), largest first;
- a site is a policy path: the blocks of a scanned stack share one path, so they are kept together
  (their loss_delta is the largest over blocks, their FLOPs the sum);
- only sites that measurably hurt are kept (loss_delta > 0, or failing the sqrt(3) criterion);
- a site that never ran (the untaken branch of a `cond`) has no measurement: it ranks last, with
  `status` "not_run", and is never kept; a batch on which the loss or a site's operands are not
  finite (NaN or Inf) measures nothing, and `advise` raises naming the batch;
- budget: an int keeps at most that many sites; a float in [0, 1] keeps sites, in ranking order,
  while their forward GEMM FLOPs stay within that fraction of the FLOPs of every measured site
  (a site that does not fit is skipped, a smaller one further down may still fit).

The advice is a `QuantPolicy`: the given one with one rule per kept site, `^<path>$` -> its
`high_precision` recipe, ahead of its other rules.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> def loss(params, x):
  ...   h = jnp.tanh(x @ params["up"]["kernel"])
  ...   return jnp.mean((h @ params["down"]["kernel"]) ** 2)
  >>> k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  >>> params = {"up": {"kernel": jax.random.normal(k1, (64, 128)) / 8},
  ...           "down": {"kernel": jax.random.normal(k2, (128, 64)) / 8}}
  >>> batches = [jax.random.normal(k3, (32, 64))]
  >>> advice = advise(loss, params, batches, "mxfp4_naive", budget=1, quant_key=jax.random.key(1))
  >>> policy, ranking = advice
  >>> len(policy.rules) <= 1, [r["path"] for r in ranking] in (["up", "down"], ["down", "up"])
  (True, True)
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from typing import Callable, Iterable

import jax
import numpy as np

from lpjax.quant.intercept.entry_points import as_policy
from lpjax.quant.policy import QuantPolicy
from lpjax.quant.monitor.site_stats import Measurer

SQRT3 = math.sqrt(3.0)


class NonFiniteBatch(ValueError):
  """A batch on which the loss or a site's operands are not finite: nothing can be measured."""


@dataclasses.dataclass(frozen=True)
class Advice:
  """What `advise` returns; unpacks as `policy, ranking = advice`."""

  policy: QuantPolicy  # the given policy with the kept sites in high precision
  ranking: tuple  # one dict per site, most sensitive first (fields in `advise`)
  kept: tuple  # the paths kept in high precision, in ranking order
  budget: float  # as given
  kept_flops_fraction: float  # forward GEMM FLOPs of the kept sites / of every measured site

  def __iter__(self):
    yield self.policy
    yield self.ranking

  def to_markdown(self) -> str:
    cols = ("rank", "path", "kept", "loss_delta", "grad_noise_ratio", "out_snr_db", "flops")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for i, r in enumerate(self.ranking):
      if r["status"] == "not_run":
        vals = (i + 1, r["path"], "", "not run", "not run", "not run", r["flops"])
      else:
        vals = (i + 1, r["path"], "yes" if r["kept"] else "", f"{r['loss_delta']:.4g}",
                f"{r['grad_noise_ratio']:.3g}", f"{r['out_snr_db']:.1f}", r["flops"])
      lines.append("| " + " | ".join(str(v) for v in vals) + " |")
    return "\n".join(lines)


def advise(loss_fn: Callable, params, batches: Iterable, recipe, *, budget, quant_key,
           **kwargs) -> Advice:
  """A QuantPolicy that keeps at most `budget` of `loss_fn`'s GEMM sites in high precision.

  Args:
    loss_fn: `loss_fn(params, batch, **kwargs)` -> scalar loss: a plain JAX function, or one made
      by `lpjax.quant.quantized` (its policy is replaced by `recipe`'s), or a function calling a
      linen model's `apply`... as `site_stats` takes it.
    params: the weights (the first argument).
    batches: a few batches (an iterable; each is `loss_fn`'s second argument).
    recipe: a recipe name or GemmRecipe (measured as `QuantPolicy(recipe=recipe)`, with its
      default high-precision list), or a QuantPolicy.
    budget: an int, the most sites kept; or a float in [0, 1], the most GEMM FLOPs kept, as a
      fraction of the forward FLOPs of every measured site (numpy integer and float scalars too).
    quant_key: the key of the measurements (batch i uses `jax.random.fold_in(quant_key, i)`).
    **kwargs: more keyword arguments of `loss_fn`.

  Returns:
    An `Advice` (`policy, ranking = advice`): `.policy`, `.ranking` (per site, most sensitive
    first: path, loss_delta (mean over batches of the largest over its blocks), grad_noise_ratio
    (mean over batches of the smallest over its blocks), out_snr_db (smallest), flops, fails_sqrt3,
    kept, status: "ok", or "not_run" for a site that ran on no batch, its numbers NaN), `.kept`,
    `.kept_flops_fraction`. The module docstring gives the rules.

  Raises:
    ValueError: a batch whose loss or GEMM operands are not finite (no site can be measured on
      it), or a budget out of range; TypeError: a budget that is no number (or a bool).
  """
  policy = recipe if isinstance(recipe, QuantPolicy) else as_policy(recipe)
  budget = _budget(budget)
  if isinstance(budget, float) and not 0.0 <= budget <= 1.0:
    raise ValueError(f"A float budget is a fraction of the GEMM FLOPs, in [0, 1]; got {budget}. "
                     "For a number of sites pass an int.")
  if isinstance(budget, int) and budget < 0:
    raise ValueError(f"budget must be >= 0 sites, got {budget}.")
  batches = list(batches)
  if not batches:
    raise ValueError("advise needs at least one batch to measure on.")
  # the ranking reads the products' statistics only: the operands' are not computed
  measurer = Measurer(loss_fn, policy, operand_stats=False, **kwargs)
  per_site: dict = {}
  flops_of: dict = {}
  for i, batch in enumerate(batches):
    key = None if quant_key is None else jax.random.fold_in(quant_key, i)
    table = measurer(params, batch, quant_key=key, loss_delta=True)
    _check_finite(i, len(batches), table)
    seen: dict = {}
    for r in table.rows:
      flops_of.setdefault(r["path"], {})[(r["block"], r["call"])] = r["flops"]
      if r["status"] == "not_run":  # e.g. the untaken branch of a cond: nothing measured
        continue
      s = seen.setdefault(r["path"], dict(loss_delta=-math.inf, grad_noise_ratio=math.inf,
                                          out_snr_db=math.inf))
      s["loss_delta"] = max(s["loss_delta"], r["loss_delta"])
      s["grad_noise_ratio"] = min(s["grad_noise_ratio"], r["grad_noise_ratio"])
      s["out_snr_db"] = min(s["out_snr_db"], r["out_snr_db"])
    for path, s in seen.items():
      acc = per_site.setdefault(path, dict(loss_delta=[], grad_noise_ratio=[], out_snr_db=[]))
      for k in ("loss_delta", "grad_noise_ratio", "out_snr_db"):
        acc[k].append(s[k])
  ranking = []
  for path, acc in per_site.items():
    ratio = float(np.mean(acc["grad_noise_ratio"]))
    ranking.append(dict(path=path, loss_delta=float(np.mean(acc["loss_delta"])),
                        grad_noise_ratio=ratio, out_snr_db=float(np.min(acc["out_snr_db"])),
                        flops=int(sum(flops_of[path].values())), fails_sqrt3=ratio < SQRT3,
                        kept=False, status="ok"))
  ranking.sort(key=lambda r: (not r["fails_sqrt3"], -r["loss_delta"]))
  for path, flops in flops_of.items():  # never ran on any batch: last, never kept
    if path not in per_site:
      ranking.append(dict(path=path, loss_delta=math.nan, grad_noise_ratio=math.nan,
                          out_snr_db=math.nan, flops=int(sum(flops.values())),
                          fails_sqrt3=False, kept=False, status="not_run"))
  total = sum(r["flops"] for r in ranking)
  kept, used = [], 0
  for r in ranking:
    if r["status"] != "ok" or not (r["loss_delta"] > 0 or r["fails_sqrt3"]):
      continue
    if isinstance(budget, int):
      if len(kept) >= budget:
        break
    elif used + r["flops"] > budget * total:
      continue
    r["kept"] = True
    kept.append(r["path"])
    used += r["flops"]
  rules = tuple((f"^{re.escape(p)}$", policy.high_precision) for p in kept)
  advised = dataclasses.replace(policy, rules=rules + tuple(policy.rules))
  return Advice(policy=advised, ranking=tuple(ranking), kept=tuple(kept), budget=budget,
                kept_flops_fraction=used / total if total else 0.0)


def _budget(budget):
  """`budget` as a Python int or float (numpy scalars too); TypeError for anything else."""
  if isinstance(budget, (bool, np.bool_)) or not isinstance(budget, numbers.Real):
    raise TypeError(f"budget must be an int (a number of sites) or a float in [0, 1] (a fraction "
                    f"of the GEMM FLOPs), got {budget!r}.")
  return int(budget) if isinstance(budget, numbers.Integral) else float(budget)


def _check_finite(index: int, count: int, table) -> None:
  """A ValueError naming batch `index` when its loss or a site's operands are not finite."""
  bad = sorted({r["path"] for r in table.rows if r["status"] == "nonfinite"})
  loss = float(table.loss)
  if bad or not math.isfinite(loss):
    where = (f"site(s) {', '.join(bad)} saw a NaN or an infinity in their operands or products"
             if bad else "its GEMM sites are finite")
    raise NonFiniteBatch(
        f"batch {index} of {count} is non-finite: the quantized loss is {loss} and {where}, so "
        "nothing can be measured on it (its statistics would all be NaN). Check the batch (and "
        "the params) for NaN / Inf values, or leave the batch out.")
