"""The trace-time hooks that measure the GEMMs a policy runs, as pure array computations.

`measuring(mode, ...)` installs `lpjax.quant.intercept.evaluator.SITE_OBSERVER` for the duration
of one traced call of an intercepted function; it sets `lpjax.quant.gemm.dot_general.OBSERVER`
around each GEMM that a recipe runs. Three modes:

- "discover": records each quantized call site (`SiteKey`: path, block label, repeat count) with
  its static facts (recipe, which operands are quantized, FLOPs per block, number of blocks); the
  GEMM runs unchanged. Used under `jax.eval_shape`.
- "stats": the GEMM runs through its own custom-VJP rules (the same bits) inside a custom VJP that
  also takes a zero "sink" array per site; the sink's cotangent carries the statistics' additive
  sums (`lpjax.quant.monitor.sink`), computed from the GEMM's operands and the incoming dY: per
  operand quantization the sums of `operand_numerics.STATS`, read from the quantization the GEMM's
  own rules make (`pass_operands.OPERAND_OBSERVER`: no operand is quantized twice), per pass those
  of the SNR of the quantized product against the high-precision product of the same operands
  (`out_snr_db`), of `grad_noise_ratio`, and the number of calls. A site in a scan over blocks
  writes row `block` of its sink (the scan sums the rows' cotangents: one row per block); the
  iterations of a loop (a scan that is not over blocks) add to the same row, and a site in the
  untaken branch of a `cond` gets a zero cotangent: calls 0, "not run".
- "loss": every quantized GEMM runs its quantized product at the selected (site, block) (both
  traced) and its high-precision product elsewhere (a `lax.cond`: one of the two runs), so one
  compiled forward gives the loss with any one site quantized, or none (site -1).

Examples:
  >>> len(SINK_FIELDS), SINK_FIELDS[:2], SINK_FIELDS[-4:]
  (54, ('fwd.x.snr_db', 'fwd.x.rel_err'), ('wgrad.out_snr_db', 'grad_noise_ratio', 'calls', 'nonfinite'))
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from lpjax.quant import recipes
from lpjax.quant.gemm import dot_general as dg
from lpjax.quant.gemm import operand as opq
from lpjax.quant.gemm import pass_operands as po
from lpjax.quant.intercept import evaluator
from lpjax.quant.intercept.sites import QUANTIZED, Site
from lpjax.quant.monitor import sink as sink_lib
from lpjax.quant.monitor.operand_numerics import operand_sums
from lpjax.quant.monitor.sink import OPERANDS, PASSES, SINK_FIELDS  # noqa: F401 (re-exported)
from lpjax.quant.recipes.gemm_recipe import REUSE_FWD, OperandQuant


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
  flops: int  # 2 B M K N of the forward product, per block, summed over the site's calls and
  # the iterations of the loops around it
  rows: int  # number of blocks (a scan over blocks) or 1
  weight_path: str | None
  in_loop: bool = False  # inside a scan that is not over blocks: its iterations pool in one row
  high_precision: Any = None  # the high-precision recipe of the policy that runs it (if known)


@dataclasses.dataclass
class _State:
  mode: str
  sites: dict  # SiteKey -> SiteInfo
  sinks: dict | None = None  # SiteKey -> sink array (stats mode)
  select: Any = None  # (site index, block index) traced int32 scalars (loss mode)
  high_precision: Any = None  # GemmRecipe of the high-precision products (loss mode); None:
  # each site's own policy's
  operand_stats: bool = True  # stats mode: also the operand quantizations' statistics (False:
  # the products' and gradient's only, the operand fields not measured; no quantizer runs again)


def _block_row(block):
  """A block index as an int32 scalar (0 outside blocks)."""
  if block is None:
    return jnp.int32(0)
  return jnp.asarray(block, jnp.int32)


@contextlib.contextmanager
def measuring(mode: str, *, sites: dict | None = None, sinks: dict | None = None, select=None,
              high_precision="bf16", operand_stats: bool = True):
  """Measures the quantized GEMMs traced within the block (see the module docstring); yields the
  {SiteKey: SiteInfo} dict ("discover" fills it). `operand_stats=False` ("stats" mode): only the
  products' statistics, grad_noise_ratio, calls and non-finite counts (the operand fields are not
  measured: not to be read)."""
  state = _State(mode, {} if sites is None else sites, sinks, select,
                 None if high_precision is None else recipes.get(high_precision), operand_stats)

  def site_observer(site, block, num_blocks, count, folds, trips=1, high_precision=None):
    if site.status != "quantized":
      return contextlib.nullcontext()
    key = SiteKey(site.path, site.block, count)
    traced_block = site.block == "scan"
    return _gemm_context(state, key, site, block if traced_block else None,
                         (num_blocks or 1) if traced_block else 1, bool(folds), trips,
                         high_precision)

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
def _gemm_context(state: _State, key: SiteKey, site, block, rows: int, in_loop: bool,
                  trips: int, high_precision):
  def observer(lhs3, rhs3, key_, cfg, fwd, bwd):
    recipe = cfg.recipe
    if state.mode == "discover":
      _discover(state, key, site, recipe, lhs3, rhs3, rows, in_loop, trips, high_precision)
      return dg.canonical_gemm(lhs3, rhs3, key_, cfg)
    info = state.sites.get(key)
    if info is None:
      raise RuntimeError(f"GEMM site {key} was not found when the function was first traced; "
                         "site_stats needs a function that traces the same GEMMs every call.")
    if state.mode == "loss":
      hp = (state.high_precision if state.high_precision is not None
            else recipes.get(info.high_precision or "bf16"))
      chosen = (state.select[0] == info.index) & (state.select[1] == _block_row(block))
      # one of the two products runs: the quantized one at the selected (site, block) only
      quantized = lambda l, r, k: dg.canonical_gemm(l, r, k, cfg)
      out = jax.eval_shape(quantized, lhs3, rhs3, key_)
      high = lambda l, r, k: dg.canonical_gemm(l, r, k, cfg, hp).astype(out.dtype)
      return jax.lax.cond(chosen, quantized, high, lhs3, rhs3, key_)
    return _measured(lhs3, rhs3, key_, state.sinks[key], _block_row(block), recipe, fwd, bwd,
                     state.operand_stats)

  token = dg.OBSERVER.set(observer)
  try:
    yield
  finally:
    dg.OBSERVER.reset(token)


def _discover(state: _State, key: SiteKey, site, recipe, lhs3, rhs3, rows: int, in_loop: bool,
              trips: int, high_precision):
  flops = 2 * math.prod(lhs3.shape) * rhs3.shape[-1] * trips  # every iteration of its loops
  if key in state.sites:  # a conv with feature groups calls the GEMM more than once
    state.sites[key].flops += flops
    return
  state.sites[key] = SiteInfo(key, len(state.sites), str(recipe), quantized_operands(recipe),
                              flops, rows, site.weight_path, in_loop, high_precision)


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


def _measured(lhs3, rhs3, key, sink, row, recipe, fwd, bwd, operand_stats=True):
  """The GEMM (its own fwd / bwd rules, so the same bits) with its statistics' sums as sink's
  cotangent (added to row `row`). The operand statistics are read from the quantizations the
  rules make themselves (`pass_operands.OPERAND_OBSERVER`): no operand is quantized twice."""

  @jax.custom_vjp
  def gemm(lhs3, rhs3, key, sink, row):
    return fwd(lhs3, rhs3, key)[0]

  def gemm_fwd(lhs3, rhs3, key, sink, row):
    with _seeing(operand_stats) as seen:
      y, res = fwd(lhs3, rhs3, key)
    return y, (res, lhs3, rhs3, key, y, row, jnp.zeros_like(sink), seen)

  def gemm_bwd(saved, dy):
    res, lhs3, rhs3, key, y, row, zeros, seen = saved
    with _seeing(operand_stats) as seen_bwd:
      dx, dw, _ = bwd(res, dy)
    # the forward's quantizations are the forward rule's (a backward pass that reuses them
    # quantizes the forward's operand again: the same values)
    seen = {**seen, **{k: v for k, v in seen_bwd.items() if k[0] != "fwd"}}
    # The statistics read the tensors through a product with an opaque 1.0 (exact): an elementwise
    # consumer that XLA fuses like the run's own, so that no tensor of the run is materialized or
    # fused otherwise than without the monitor (a bias gradient's sum of dY keeps its bits).
    one = jax.lax.optimization_barrier(jnp.ones((), jnp.float32))
    seen_arrays = [a * one.astype(a.dtype) for a in (lhs3, rhs3, dy, y, dx, dw)]
    values = _statistics(*seen_arrays[:2], key, *seen_arrays[2:], recipe, operand_stats, seen)
    ct = jax.lax.dynamic_update_slice(zeros, values[None, :], (row, jnp.int32(0)))
    return dx, dw, None, ct, None

  gemm.defvjp(gemm_fwd, gemm_bwd)
  return gemm(lhs3, rhs3, key, sink, row)


@contextlib.contextmanager
def _seeing(active: bool):
  """Within the block, {(gemm, side): operand_sums} of each operand the GEMM's rules quantize
  (the first quantization of each; nothing when not `active`)."""
  got: dict = {}

  def seen(gemm, side, op, view):
    if (gemm, side) not in got:
      got[(gemm, side)] = operand_sums(*view, op)

  token = po.OPERAND_OBSERVER.set(seen if active else None)
  try:
    yield got
  finally:
    po.OPERAND_OBSERVER.reset(token)


def _power_err(ref, approx):
  ref, approx = ref.astype(jnp.float32), approx.astype(jnp.float32)
  return jnp.sum(jnp.square(ref)), jnp.sum(jnp.square(ref - approx))


def _hp_products(lhs3, rhs3, dy):
  """The three products of the GEMM in float32 at the highest precision, from the same operands."""
  f = lambda a: jax.lax.stop_gradient(a).astype(jnp.float32)
  x, w, g = f(lhs3), f(rhs3), f(dy)
  hi = jax.lax.Precision.HIGHEST
  y = jnp.matmul(x, w, precision=hi)
  dx = jnp.matmul(g, jnp.swapaxes(w, -1, -2), precision=hi)
  dw = jnp.matmul(jnp.swapaxes(x, -1, -2), g, precision=hi)
  return y, dx, dw


def _nonfinite(*arrays):
  return sum(jnp.sum((~jnp.isfinite(a.astype(jnp.float32))).astype(jnp.float32)) for a in arrays)


def _statistics(lhs3, rhs3, key, dy, y, dx, dw, recipe, operand_stats=True, seen=None):
  """The sink row of one GEMM call: the sums of `lpjax.quant.monitor.sink` (float32[SIZE]).
  `seen`: {(gemm, side): operand_sums} of the quantizations the GEMM made itself; an operand not
  there (a quantizer the hook does not see: SSP, a scheme, a weight gathered as codes) is
  quantized again from the same inputs and keys (the same values)."""
  dy3 = dy.reshape(lhs3.shape[:-1] + rhs3.shape[-1:])
  operands, seen = {}, seen or {}
  for gemm, side, name, _, _ in dg.QUANTIZER_PLACES if operand_stats else ():
    source = ("fwd", side) if getattr(recipe, gemm).operands()[side] == REUSE_FWD else (gemm,
                                                                                         side)
    if source in seen:
      operands[(gemm, name)] = seen[source]
  missing = [] if not operand_stats else [
      d for d in dg.quantizer_inputs(lhs3, rhs3, dy3, key, recipe)
      if (d["gemm"], d["operand"]) not in operands]
  for d in missing:
    view = opq.quantize_view(d["x"], d["op"], axis=d["axis"], key=d["key"], signs=d["signs"],
                             block=d["block"])
    operands[(d["gemm"], d["operand"])] = operand_sums(*view, d["op"])
  y_hp, dx_hp, dw_hp = _hp_products(lhs3, rhs3, dy3)
  products = {g: _power_err(ref, approx)
              for g, ref, approx in (("fwd", y_hp, y), ("dgrad", dx_hp, dx), ("wgrad", dw_hp, dw))}
  nonfinite = _nonfinite(lhs3, rhs3, dy3, y, dx, dw)
  return sink_lib.pack(operands, products, products["wgrad"], nonfinite)
