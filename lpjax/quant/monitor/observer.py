"""The trace-time hooks that measure the GEMMs a policy runs, as pure array computations.

`measuring(mode, ...)` installs `lpjax.quant.intercept.evaluator.SITE_OBSERVER` for the duration
of one traced call of an intercepted function; it sets `lpjax.quant.gemm.dot_general.OBSERVER`
around each GEMM that a recipe runs. Three modes:

- "discover": records each quantized call site (`SiteKey`: path, block label, repeat count) with
  its static facts (recipe, which operands are quantized, FLOPs per block, number of blocks); the
  GEMM runs unchanged. Used under `jax.eval_shape`.
- "stats": the GEMM runs through its own custom-VJP rules (the same bits) inside a custom VJP that
  also takes a zero "sink" array per site; the sink's cotangent carries the statistics, computed in
  the backward pass from the GEMM's operands and the incoming dY: per operand quantization
  `operand_numerics.STATS`, per pass the SNR of the quantized product against the high-precision
  product of the same operands (`out_snr_db`), and `grad_noise_ratio`. A site in a scan over
  blocks writes row `block` of its sink (the scan sums the rows' cotangents: one row per block).
- "loss": every quantized GEMM computes its quantized and its high-precision product and returns
  the quantized one only at the selected (site, block) (both traced), so one compiled forward gives
  the loss with any one site quantized, or none (site -1).

Examples:
  >>> len(SINK_FIELDS), SINK_FIELDS[:2], SINK_FIELDS[-4:]
  (52, ('fwd.x.snr_db', 'fwd.x.rel_err'), ('fwd.out_snr_db', 'dgrad.out_snr_db', 'wgrad.out_snr_db', 'grad_noise_ratio'))
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.quant import recipes
from lpjax.quant.gemm import dot_general as dg
from lpjax.quant.gemm import operand as opq
from lpjax.quant.intercept import evaluator
from lpjax.quant.intercept.sites import QUANTIZED, Site
from lpjax.quant.monitor.operand_numerics import STATS, operand_numerics
from lpjax.quant.recipes.gemm_recipe import REUSE_FWD, OperandQuant

PASSES = ("fwd", "dgrad", "wgrad")
# The operand rows, in the order of lpjax.quant.gemm.dot_general.QUANTIZER_PLACES.
OPERANDS = tuple((g, name) for g, _, name, _, _ in dg.QUANTIZER_PLACES)
SINK_FIELDS = (tuple(f"{g}.{o}.{s}" for g, o in OPERANDS for s in STATS)
               + tuple(f"{g}.out_snr_db" for g in PASSES) + ("grad_noise_ratio",))
_INDEX = {f: i for i, f in enumerate(SINK_FIELDS)}


@dataclasses.dataclass(frozen=True, order=True)
class SiteKey:
  """One quantized GEMM call of a traced function."""

  path: str  # the policy's path
  block: str  # "" (no block), "3" (a static block index) or "scan" (a scan over blocks)
  count: int  # 0, or the n-th repeated call of the same site


@dataclasses.dataclass
class SiteInfo:
  """What discovery learns about a site (static)."""

  key: SiteKey
  index: int  # position in program order
  recipe: str
  operands: tuple  # ((gemm, operand, reuses_fwd), ...) of the quantized operands
  flops: int  # 2 B M K N of the forward product, per block, summed over the site's calls
  rows: int  # number of blocks (a scan over blocks) or 1
  weight_path: str | None
  in_loop: bool = False  # inside a scan that is not over blocks: measured as the sum over steps


@dataclasses.dataclass
class _State:
  mode: str
  sites: dict  # SiteKey -> SiteInfo
  sinks: dict | None = None  # SiteKey -> sink array (stats mode)
  select: Any = None  # (site index, block index) traced int32 scalars (loss mode)
  high_precision: Any = None  # GemmRecipe of the high-precision products (loss mode)


def _block_row(block):
  """A block index as an int32 scalar (0 outside blocks)."""
  if block is None:
    return jnp.int32(0)
  return jnp.asarray(block, jnp.int32)


@contextlib.contextmanager
def measuring(mode: str, *, sites: dict | None = None, sinks: dict | None = None, select=None,
              high_precision="bf16"):
  """Measures the quantized GEMMs traced within the block (see the module docstring); yields the
  {SiteKey: SiteInfo} dict ("discover" fills it)."""
  state = _State(mode, {} if sites is None else sites, sinks, select,
                 recipes.get(high_precision))

  def site_observer(site, block, num_blocks, count, folds):
    if site.status != "quantized":
      return contextlib.nullcontext()
    key = SiteKey(site.path, site.block, count)
    traced_block = site.block == "scan"
    return _gemm_context(state, key, site, block if traced_block else None,
                         (num_blocks or 1) if traced_block else 1, bool(folds))

  token = evaluator.SITE_OBSERVER.set(site_observer)
  layers = _LAYERS.set((site_observer, {}, {}))
  try:
    yield state.sites
  finally:
    _LAYERS.reset(layers)
    evaluator.SITE_OBSERVER.reset(token)


# lpjax.nn's layers, which call lpjax.quant.dot_general themselves (not through the interception):
# while measuring, (the site observer, {layer path: block}, {(path, block label): calls so far}).
_LAYERS: contextvars.ContextVar = contextvars.ContextVar("lpjax_monitor_layers", default=None)


def note_block(path: str, block) -> None:
  """A layer of lpjax.nn tells the monitor its block (an int, a traced index of a scan over
  blocks, or None) when the model derives its key (`site_key`); nothing outside a measurement."""
  active = _LAYERS.get()
  if active is not None:
    active[1][path] = block


def layer_site(path: str, recipe, num_blocks: int | None = None):
  """The context a layer of lpjax.nn runs its GEMM in, so that the monitor measures it as the
  site `path` (in the block it noted); a null context outside a measurement or for a
  high-precision recipe.

  Examples:
    >>> with layer_site("mlp/up", None):   # not measuring: nothing happens
    ...   pass
  """
  active = _LAYERS.get()
  if active is None or recipe.is_high_precision:
    return contextlib.nullcontext()
  observe, blocks, counts = active
  block = blocks.get(path)
  label = "" if block is None else str(block) if isinstance(block, int) else "scan"
  count = counts.get((path, label), 0)
  counts[(path, label)] = count + 1
  site = Site(path=path, op="dot_general", lhs_shape=(), rhs_shape=(), weight="rhs",
              weight_path=path, block=label, recipe=str(recipe), status=QUANTIZED)
  return observe(site, block, num_blocks, count, ())


@contextlib.contextmanager
def _gemm_context(state: _State, key: SiteKey, site, block, rows: int, in_loop: bool):
  def observer(lhs3, rhs3, key_, cfg, fwd, bwd):
    recipe = cfg.recipe
    if state.mode == "discover":
      _discover(state, key, site, recipe, lhs3, rhs3, rows, in_loop)
      return dg.canonical_gemm(lhs3, rhs3, key_, cfg)
    info = state.sites.get(key)
    if info is None:
      raise RuntimeError(f"GEMM site {key} was not found when the function was first traced; "
                         "site_stats needs a function that traces the same GEMMs every call.")
    if state.mode == "loss":
      y_q = dg.canonical_gemm(lhs3, rhs3, key_, cfg)
      y_hp = dg.canonical_gemm(lhs3, rhs3, key_, cfg, state.high_precision)
      chosen = (state.select[0] == info.index) & (state.select[1] == _block_row(block))
      return jnp.where(chosen, y_q, y_hp.astype(y_q.dtype))
    return _measured(lhs3, rhs3, key_, state.sinks[key], _block_row(block), recipe, fwd, bwd)

  token = dg.OBSERVER.set(observer)
  try:
    yield
  finally:
    dg.OBSERVER.reset(token)


def _discover(state: _State, key: SiteKey, site, recipe, lhs3, rhs3, rows: int, in_loop: bool):
  flops = 2 * math.prod(lhs3.shape) * rhs3.shape[-1]
  if key in state.sites:  # a conv with feature groups calls the GEMM more than once
    state.sites[key].flops += flops
    return
  state.sites[key] = SiteInfo(key, len(state.sites), str(recipe), quantized_operands(recipe),
                              flops, rows, site.weight_path, in_loop)


def quantized_operands(recipe) -> tuple:
  """((gemm, operand, reuses_fwd), ...): the operands `recipe` quantizes, in OPERANDS order."""
  out = []
  for gemm, side, name, _, _ in dg.QUANTIZER_PLACES:
    op = getattr(recipe, gemm).operands()[side]
    reuses = op == REUSE_FWD
    if reuses:
      op = recipe.fwd.operands()[side]
    if isinstance(op, OperandQuant):
      out.append((gemm, name, reuses))
  return tuple(out)


def _measured(lhs3, rhs3, key, sink, row, recipe, fwd, bwd):
  """The GEMM (its own fwd / bwd rules, so the same bits) with its statistics as sink's cotangent."""

  @jax.custom_vjp
  def gemm(lhs3, rhs3, key, sink, row):
    return fwd(lhs3, rhs3, key)[0]

  def gemm_fwd(lhs3, rhs3, key, sink, row):
    y, res = fwd(lhs3, rhs3, key)
    return y, (res, lhs3, rhs3, key, y, row, jnp.zeros_like(sink))

  def gemm_bwd(saved, dy):
    res, lhs3, rhs3, key, y, row, zeros = saved
    dx, dw, _ = bwd(res, dy)
    values = _statistics(lhs3, rhs3, key, dy, y, dx, dw, recipe)
    ct = jax.lax.dynamic_update_slice(zeros, values[None, :], (row, jnp.int32(0)))
    return dx, dw, None, ct, None

  gemm.defvjp(gemm_fwd, gemm_bwd)
  return gemm(lhs3, rhs3, key, sink, row)


def _snr_db(ref, approx):
  ref, approx = ref.astype(jnp.float32), approx.astype(jnp.float32)
  err = jnp.sum(jnp.square(ref - approx))
  power = jnp.sum(jnp.square(ref))
  return jnp.where(err > 0, 10.0 * jnp.log10(power / jnp.where(err > 0, err, 1.0)), jnp.inf)


def _hp_products(lhs3, rhs3, dy):
  """The three products of the GEMM in float32 at the highest precision, from the same operands."""
  f = lambda a: jax.lax.stop_gradient(a).astype(jnp.float32)
  x, w, g = f(lhs3), f(rhs3), f(dy)
  hi = jax.lax.Precision.HIGHEST
  y = jnp.matmul(x, w, precision=hi)
  dx = jnp.matmul(g, jnp.swapaxes(w, -1, -2), precision=hi)
  dw = jnp.matmul(jnp.swapaxes(x, -1, -2), g, precision=hi)
  return y, dx, dw


def _statistics(lhs3, rhs3, key, dy, y, dx, dw, recipe):
  """The sink row of one GEMM call: SINK_FIELDS as a float32 vector (NaN where not measured)."""
  values = np.full(len(SINK_FIELDS), np.nan, np.float32)
  values = jnp.asarray(values)
  dy3 = dy.reshape(lhs3.shape[:-1] + rhs3.shape[-1:])
  for d in dg.quantizer_inputs(lhs3, rhs3, dy3, key, recipe):
    view = opq.quantize_view(d["x"], d["op"], axis=d["axis"], key=d["key"], signs=d["signs"],
                             block=d["block"])
    stats = operand_numerics(*view, d["op"])
    for s in STATS:
      values = values.at[_INDEX[f"{d['gemm']}.{d['operand']}.{s}"]].set(stats[s])
  y_hp, dx_hp, dw_hp = _hp_products(lhs3, rhs3, dy3)
  dw_hp_norm = jnp.sqrt(jnp.sum(jnp.square(dw_hp)))
  noise = jnp.sqrt(jnp.sum(jnp.square(dw.astype(jnp.float32) - dw_hp)))
  ratio = jnp.where(noise > 0, dw_hp_norm / jnp.where(noise > 0, noise, 1.0), jnp.inf)
  for g, ref, approx in (("fwd", y_hp, y), ("dgrad", dx_hp, dx), ("wgrad", dw_hp, dw)):
    values = values.at[_INDEX[f"{g}.out_snr_db"]].set(_snr_db(ref, approx))
  return values.at[_INDEX["grad_noise_ratio"]].set(ratio)
