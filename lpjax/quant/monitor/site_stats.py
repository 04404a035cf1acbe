"""`site_stats`: where FP4 hurts, per GEMM call site, from one forward and backward pass.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lpjax.quant.intercept.entry_points import quantized
  >>> def loss(params, x):
  ...   h = jnp.tanh(x @ params["up"]["kernel"])
  ...   return jnp.mean((h @ params["down"]["kernel"]) ** 2)
  >>> k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  >>> params = {"up": {"kernel": jax.random.normal(k1, (64, 128)) / 8},
  ...           "down": {"kernel": jax.random.normal(k2, (128, 64)) / 8}}
  >>> x = jax.random.normal(k3, (32, 64))
  >>> t = site_stats(quantized(loss, "mxfp4"), params, x, quant_key=jax.random.key(1))
  >>> len(t.rows), sorted({(r["gemm"], r["operand"]) for r in t.rows})[:3]
  (12, [('dgrad', 'dy'), ('dgrad', 'w'), ('fwd', 'w')])
  >>> t.worst(1).rows[0]["snr_db"] < 25   # MXFP4: about 4 bits of SNR
  True
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.quant.intercept.entry_points import as_policy, quantize_model, quantized
from lpjax.quant.monitor import observer as obs
from lpjax.quant.monitor import sink as sink_lib
from lpjax.quant.monitor.operand_numerics import STATS
from lpjax.quant.monitor.table import SiteStats


def resolve(target: Callable, policy=None):
  """(the callable to measure, its QuantPolicy or None) for `site_stats`'s `target` / `policy`.

  A function made by `quantized` runs with `policy` in place of its own when one is given; the
  `apply` of a linen model made by `quantize_model` likewise; a function marked
  `fn.lpjax_runs_policy = True` is measured as it is: it runs its GEMMs under `policy` itself
  (lpjax's own layers, or a model it intercepts, built with that policy: a trainer's loss, see
  `python -m lpjax.advise`); any other callable is measured as it is when `policy` is None (its
  GEMMs must go through an interception inside it), else through `quantized(target, policy)`.
  """
  own = getattr(target, "lpjax_policy", None)
  model = getattr(target, "__self__", None)
  if getattr(target, "lpjax_runs_policy", False):  # it quantizes with `policy` itself
    return target, (as_policy(policy) if policy is not None else None)
  if own is not None:
    if policy is None:
      return target, own
    return quantized(target.__wrapped__, policy), as_policy(policy)
  if model is not None and hasattr(model, "module") and hasattr(model, "policy"):
    if policy is None:
      return target, model.policy
    wrapped = quantize_model(model.module, policy, weight_axes=getattr(model, "weight_axes", None))
    return getattr(wrapped, target.__name__), as_policy(policy)
  if policy is None:
    return target, None
  return quantized(target, policy), as_policy(policy)


def discover(call: Callable, *args) -> dict:
  """{SiteKey: SiteInfo} of the quantized GEMMs of `call(*args)` (traced abstractly)."""
  with obs.measuring("discover") as sites:
    jax.eval_shape(call, *args)
  return sites


def measured_value_and_grad(call: Callable, sites: dict, *, has_aux: bool = False,
                            operand_stats: bool = True) -> Callable:
  """`f(params, *rest) -> (loss, grads, {SiteKey: float32[rows, len(SINK_FIELDS)]})`: the loss
  and gradients of `call` (the quantized run's own bits) with every site's statistics, a pure
  function of arrays (jit it, or call it inside a jitted step). With `has_aux`, `call` returns
  (loss, aux) and `loss` above is that pair, as `jax.value_and_grad(..., has_aux=True)` gives.
  A row's `calls` field is 0 for a site that never ran, `nonfinite` > 0 for one that saw a NaN
  or an infinity (`lpjax.quant.monitor.sink.status` reads them). `operand_stats=False`: the
  products' statistics and grad_noise_ratio only (the operand fields are not measured: not to
  be read); no quantizer runs again for the statistics."""

  def f(params, *rest):
    sinks = {k: jnp.zeros((info.rows, sink_lib.SIZE), jnp.float32) for k, info in sites.items()}

    def loss_of(params, sinks):
      with obs.measuring("stats", sites=sites, sinks=sinks, operand_stats=operand_stats):
        return call(params, *rest)

    loss, (grads, sums) = jax.value_and_grad(loss_of, argnums=(0, 1), has_aux=has_aux)(
        params, sinks)
    return loss, grads, sink_lib.finish_all(sums)

  return f


def selected_loss(call: Callable, sites: dict, high_precision="bf16") -> Callable:
  """`f(site_index, block, params, *rest) -> loss` with only that site (in that block) quantized
  and every other measured site run in `high_precision` (None: each site in the high-precision
  recipe of the policy that runs it); site_index -1: none quantized."""

  def f(site_index, block, params, *rest):
    select = (jnp.asarray(site_index, jnp.int32), jnp.asarray(block, jnp.int32))
    with obs.measuring("loss", sites=sites, select=select, high_precision=high_precision):
      return call(params, *rest)

  return f


def site_stats(target: Callable, *args, policy=None, quant_key=None, loss_delta: bool = False,
               **kwargs) -> SiteStats:
  """Per call site and per quantized operand numerics of one forward and backward pass.

  Args:
    target: a function returning a scalar loss whose GEMMs the interception runs: one made by
      `lpjax.quant.quantized`, the `apply` of a linen model made by `quantize_model`, a function
      that calls such models or lpjax's own (lpjax.nn layers), or any JAX function (then give
      `policy`).
    *args: its arguments; the first holds the weights (gradients are taken with respect to it).
    policy: a QuantPolicy or recipe name to measure with, in place of the target's own.
    quant_key: the step's key (stochastic rounding, RHT signs), passed as `quant_key=`.
    loss_delta: also measure, per site (and block), the loss with only that site quantized minus
      the loss with every measured site in the policy's high-precision recipe (one forward each,
      every forward in the one compiled function of the statistics).
    **kwargs: more keyword arguments of `target`.

  Returns:
    A `SiteStats` table: one row per quantized call site, block (a scan over blocks gives one row
    per block) and quantized operand (fwd x / w, dgrad dy / w, wgrad x / dy), with `path`,
    `block`, `call`, `recipe`, `gemm`, `operand`, `reuses_fwd`, `status` ("ok"; "exact": this
    operand quantized without error, its snr_db inf; "nonfinite": the site saw a NaN or an
    infinity, every statistic NaN; "not_run": the site never ran, e.g. the untaken branch of a
    `cond`, every statistic NaN and loss_delta None), the operand statistics
    (`snr_db`, `rel_err`, `saturated`, `flushed`, `scale_min`, `scale_max`, `scale_std`,
    `clamped_scales`), `out_snr_db` (the pass's product against the high-precision product of
    the same operands), and per site `grad_noise_ratio` (||dW_hp|| / ||dW_q - dW_hp||), `flops`
    (every call and loop iteration of the site) and `loss_delta` (None unless measured); the
    iterations of a loop (a scan not over blocks) pool into one row (`in_loop`); plus `.loss`
    and `.grads` of the quantized run
    (bit-identical to running `target` without measuring). docs/numerics_monitor.md says what
    each statistic means.
  """
  measurer = Measurer(target, policy, **kwargs)
  return measurer(*args, quant_key=quant_key, loss_delta=loss_delta)


class Measurer:
  """`site_stats` for one target, compiled once per argument shapes and run on many arguments of
  the same shapes (the advisor measures several batches with it). `m(*args, quant_key=,
  loss_delta=)`.

  With `loss_delta`, the statistics and every site's (and block's) selected-site forward run in
  one compiled function: the forwards are one `lax.scan` over the (site, block) selections, so the
  function compiles once whatever the number of sites."""

  def __init__(self, target: Callable, policy=None, *, operand_stats: bool = True, **kwargs):
    self.call_target, self.policy = resolve(target, policy)
    self.operand_stats = operand_stats  # False: operand fields not measured (the advisor reads none)
    self.kwargs = kwargs
    self.sites = None
    # the policy's high-precision recipe; for a target that brings its own policies (a function
    # calling a quantize_model model), each site's policy's (discovery records it)
    self._hp = self.policy.high_precision if self.policy is not None else None
    self._stats = jax.jit(lambda key, *a: measured_value_and_grad(
        self._call(key), self.sites, operand_stats=operand_stats)(*a))
    self._stats_and_losses = jax.jit(self._measure_all)

  def _call(self, key):
    kwargs = self.kwargs if key is None else dict(self.kwargs, quant_key=key)
    return lambda *a: self.call_target(*a, **kwargs)

  def _measure_all(self, key, selections, *args):
    """(loss, grads, stats, float32[len(selections)] losses): the losses with only the (site
    index, block) of each row of `selections` quantized (-1: none), one forward body mapped."""
    loss, grads, stats = measured_value_and_grad(self._call(key), self.sites,
                                                 operand_stats=self.operand_stats)(*args)
    forward = selected_loss(self._call(key), self.sites, self._hp)
    # the arguments ride in the carry (not closed over: an NNX variable cannot cross trace levels)
    _, losses = jax.lax.scan(lambda a, sel: (a, forward(sel[0], sel[1], *a)), args, selections)
    return loss, grads, stats, losses

  def selections(self) -> tuple:
    """((site, block) of each measured forward, ...): (-1, -1) (no site quantized) first, then
    every site's blocks in program order."""
    out = [(None, -1)]
    for key, info in self.sites.items():
      out += [(key, b) for b in range(info.rows)]
    return tuple(out)

  def __call__(self, *args, quant_key=None, loss_delta: bool = False) -> SiteStats:
    if self.sites is None:
      self.sites = discover(self._call(quant_key), *args)
    sites = self.sites
    deltas, hp_loss = {}, None
    if not loss_delta:
      loss, grads, stats = self._stats(quant_key, *args)
    else:
      chosen = self.selections()
      rows = np.asarray([(-1 if k is None else sites[k].index, b) for k, b in chosen], np.int32)
      loss, grads, stats, losses = self._stats_and_losses(quant_key, rows, *args)
      losses = np.asarray(jax.device_get(losses))
      hp_loss = float(losses[0])
      for (key, b), value in zip(chosen[1:], losses[1:]):
        deltas[(key, b)] = float(value) - hp_loss
    return SiteStats(rows=_rows(sites, jax.device_get(stats), deltas, self.operand_stats),
                     loss=loss, grads=grads,
                     hp_loss=hp_loss)


def _rows(sites: dict, stats: dict, deltas: dict, operand_stats: bool = True) -> list:
  """One row per (site, block, operand). Without `operand_stats` the operand fields were not
  measured: they read NaN, and the status reads the product's (never "exact")."""
  rows = []
  for key, info in sites.items():
    values = np.asarray(stats[key])
    for b in range(info.rows):
      block = (b if key.block == "scan" else int(key.block) if key.block else None)
      site = dict(path=key.path, block=block, call=key.count, recipe=info.recipe,
                  flops=info.flops, in_loop=info.in_loop)
      v = {f: float(x) for f, x in zip(obs.SINK_FIELDS, values[b])}
      for gemm, operand, reuses in info.operands:
        prefix = f"{gemm}.{operand}"
        row = dict(site, gemm=gemm, operand=operand, reuses_fwd=reuses,
                   status=sink_lib.status(v, prefix if operand_stats else None))
        row.update({s: v[f"{prefix}.{s}"] if operand_stats else math.nan for s in STATS})
        row["out_snr_db"] = v[f"{gemm}.out_snr_db"]
        row["grad_noise_ratio"] = v["grad_noise_ratio"]
        # a site that never ran changes no loss: its loss_delta is not a measurement
        row["loss_delta"] = None if row["status"] == "not_run" else deltas.get((key, b))
        rows.append(row)
  return rows
