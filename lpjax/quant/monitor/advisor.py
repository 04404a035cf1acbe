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
import re
from typing import Callable, Iterable

import jax
import numpy as np

from lpjax.quant.intercept.entry_points import as_policy
from lpjax.quant.policy import QuantPolicy
from lpjax.quant.monitor.site_stats import Measurer

SQRT3 = math.sqrt(3.0)


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
      fraction of the forward FLOPs of every measured site.
    quant_key: the key of the measurements (batch i uses `jax.random.fold_in(quant_key, i)`).
    **kwargs: more keyword arguments of `loss_fn`.

  Returns:
    An `Advice` (`policy, ranking = advice`): `.policy`, `.ranking` (per site, most sensitive
    first: path, loss_delta (mean over batches of the largest over its blocks), grad_noise_ratio
    (mean over batches of the smallest over its blocks), out_snr_db (smallest), flops, fails_sqrt3,
    kept), `.kept`, `.kept_flops_fraction`. The module docstring gives the rules.
  """
  policy = recipe if isinstance(recipe, QuantPolicy) else as_policy(recipe)
  if isinstance(budget, bool) or not isinstance(budget, (int, float)):
    raise TypeError(f"budget must be an int (a number of sites) or a float in [0, 1] (a fraction "
                    f"of the GEMM FLOPs), got {budget!r}.")
  if isinstance(budget, float) and not 0.0 <= budget <= 1.0:
    raise ValueError(f"A float budget is a fraction of the GEMM FLOPs, in [0, 1]; got {budget}. "
                     "For a number of sites pass an int.")
  if isinstance(budget, int) and budget < 0:
    raise ValueError(f"budget must be >= 0 sites, got {budget}.")
  batches = list(batches)
  if not batches:
    raise ValueError("advise needs at least one batch to measure on.")
  measurer = Measurer(loss_fn, policy, **kwargs)
  per_site: dict = {}
  for i, batch in enumerate(batches):
    key = None if quant_key is None else jax.random.fold_in(quant_key, i)
    table = measurer(params, batch, quant_key=key, loss_delta=True)
    seen: dict = {}
    for r in table.rows:
      s = seen.setdefault(r["path"], dict(loss_delta=-math.inf, grad_noise_ratio=math.inf,
                                          out_snr_db=math.inf, flops={}))
      s["loss_delta"] = max(s["loss_delta"], r["loss_delta"])
      s["grad_noise_ratio"] = min(s["grad_noise_ratio"], r["grad_noise_ratio"])
      s["out_snr_db"] = min(s["out_snr_db"], r["out_snr_db"])
      s["flops"][(r["block"], r["call"])] = r["flops"]
    for path, s in seen.items():
      acc = per_site.setdefault(path, dict(loss_delta=[], grad_noise_ratio=[], out_snr_db=[],
                                           flops=sum(s["flops"].values())))
      for k in ("loss_delta", "grad_noise_ratio", "out_snr_db"):
        acc[k].append(s[k])
  ranking = []
  for path, acc in per_site.items():
    ratio = float(np.mean(acc["grad_noise_ratio"]))
    ranking.append(dict(path=path, loss_delta=float(np.mean(acc["loss_delta"])),
                        grad_noise_ratio=ratio, out_snr_db=float(np.min(acc["out_snr_db"])),
                        flops=int(acc["flops"]), fails_sqrt3=ratio < SQRT3, kept=False))
  ranking.sort(key=lambda r: (not r["fails_sqrt3"], -r["loss_delta"]))
  total = sum(r["flops"] for r in ranking)
  kept, used = [], 0
  for r in ranking:
    if not (r["loss_delta"] > 0 or r["fails_sqrt3"]):
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
