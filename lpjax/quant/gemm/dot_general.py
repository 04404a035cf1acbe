"""Quantized `dot_general` and `einsum`: one `jax.custom_vjp` running a recipe's three GEMMs.

Every GEMM is brought to the canonical form (B, M, K) x (B, K, N) -> (B, M, N) by transposing
and reshaping its operands (batch dims -> B, free dims -> M / N, contracting dims -> K, each
group flattened in the order given), and the custom VJP runs

    fwd:   Y  = Q(X along K) Q(W along K)
    dgrad: dX = Q(dY along N) Q(W along N)^T
    wgrad: dW = Q(X along M)^T Q(dY along M)

with the operand quantizers of the recipe (`lpjax.quant.recipes.gemm_recipe`). Backward operands are quantized
again from the high-precision values (or from packed column-wise copies made in the forward pass,
`residuals="quantized"`), never by transposing a row-wise quantized tensor (docs/numerics.md §7).
Fake quantization emulates the low-precision GEMM: the dequantized operands are cast to the
recipe's `compute_dtype` and multiplied with float32 accumulation.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lpjax.quant.gemm.einsum import einsum
  >>> from lpjax.quant.gemm.dot_general import dot_general
  >>> x = jax.random.normal(jax.random.key(0), (2, 8, 64))
  >>> w = jax.random.normal(jax.random.key(1), (64, 32))
  >>> y = jax.jit(lambda x, w: dot_general(x, w, (((2,), (0,)), ((), ())), "mxfp4_naive"))(x, w)
  >>> y.shape, y.dtype
  ((2, 8, 32), dtype('float32'))
  >>> loss = lambda w, key: einsum("bsd,df->bsf", x, w, recipe="mxfp4", key=key).sum()
  >>> jax.jit(jax.grad(loss))(w, jax.random.key(2)).shape   # SR needs the key
  (64, 32)
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from lpjax.quant.gemm import kernel_dispatch as gk
from lpjax.quant.gemm import operand as opq
from lpjax.quant.gemm import weight_gather as wg
from lpjax.quant.schemes.hadamard import hadamard
from lpjax.quant.schemes.quest import quest
from lpjax.quant.gemm.operand import LHS, RHS
from lpjax.quant import recipes
from lpjax.quant.gemm.canonical import canonical
from lpjax.quant.recipes.gemm_recipe import REUSE_FWD, GemmRecipe, OperandQuant


# The observer of `lpjax.quant.monitor`, set around one GEMM call while it measures: None (always,
# outside a measurement), or `observer(lhs3, rhs3, key, cfg, fwd, bwd)` returning the canonical
# product, where `fwd(lhs3, rhs3, key) -> (y, residuals)` and `bwd(residuals, dy) -> (dx, dw,
# None)` are this GEMM's own custom-VJP rules: an observer that runs them gets the same bits.
OBSERVER: contextvars.ContextVar = contextvars.ContextVar("lpjax_gemm_observer", default=None)


def as_key(key):
  """Accepts a typed key (jax.random.key) or a raw uint32[2] key (jax.random.PRNGKey)."""
  if key is None:
    return None
  key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return key
  return jax.random.wrap_key_data(key)


@dataclasses.dataclass(frozen=True)
class _Static:
  recipe: GemmRecipe
  out_dtype: Any  # dtype of Y
  preferred: Any  # the caller's preferred_element_type (used as-is without a compute dtype)
  batched: bool  # operands carry a leading batch axis
  rhs_axes: tuple | None = None  # logical axes of W (K, N), for the quantized weight gather


def _dims(a_axis: int, b_axis: int, a_ndim: int, batched: bool):
  batch = ((0,), (0,)) if batched else ((), ())
  return (((a_axis % a_ndim,), (b_axis % a_ndim,)), batch)


def _mm(a, b, a_axis: int, b_axis: int, cfg: _Static):
  """One GEMM contracting a's `a_axis` with b's `b_axis`; output (B, a free, b free)."""
  if cfg.recipe.compute_dtype is None:
    dtype = jnp.promote_types(a.dtype, b.dtype)
    pet = cfg.preferred
  else:
    dtype = cfg.recipe.compute_dtype
    pet = jnp.promote_types(dtype, jnp.float32)  # accumulate in fp32 (or wider)
  return jax.lax.dot_general(a.astype(dtype), b.astype(dtype), _dims(a_axis, b_axis, a.ndim, cfg.batched),
                             preferred_element_type=pet)


def gemm_signs(key, recipe: GemmRecipe, gemm: str):
  """(random Hadamard signs or None, Hadamard block or None) that `gemm` of `recipe` applies to
  both its operands, from the layer's key (QuEST's forward: a fixed transform, no signs)."""
  block = getattr(recipe, gemm).hadamard_block
  if gemm == "fwd" and recipe.trust_masked:
    return None, block  # QuEST: a fixed Hadamard transform, no random signs (Quartet)
  return (opq.hadamard_signs(key, gemm, block) if block else None), block


def _through_trust_mask(g, x, side: int, key, recipe: GemmRecipe):
  """QuEST's backward: gradient g of the rotated, quantized operand -> gradient of `x`.

  g is dX (M, Kp) for side LHS or dW (Kp, N) for RHS, in the forward's rotated domain (the
  backward GEMMs multiplied the forward's Q(X) / Q(W)); it is zeroed where the forward clipped
  (the trust mask, recomputed from x), rotated back along K and cropped to x's K.
  """
  signs, block = gemm_signs(key, recipe, "fwd")
  op = recipe.fwd.operands()[side]
  xk, _ = _to_last(x, -1 if side == LHS else -2, True)  # X (M, K) / W^T (N, K)
  mask = quest(opq.rotate(xk, block, -1, signs), op.format.block_size)[1]
  k_axis = -1 if side == LHS else -2
  if side == RHS:
    mask = jnp.swapaxes(mask, -1, -2)
  g = hadamard(jnp.where(mask, g, jnp.zeros((), g.dtype)), block, axis=k_axis, signs=signs,
               inverse=True)
  return jax.lax.slice_in_dim(g, 0, x.shape[k_axis], axis=g.ndim + k_axis)


def _to_last(x, axis: int, work: bool):
  """Moves the contraction axis last when there is per-block work to do along it.

  The transposed copy is the "column-wise" operand of TransformerEngine, and the layout in which
  stochastic rounding draws its bits. The quantizers and the RHT run as fast along an inner axis
  (in place, lpjax.quant.formats.layout), but the GEMMs do not: XLA:CPU's bf16 dot with both
  contraction axes last measured 1.8 ms for the MLP's wgrad shape against 14 ms contracting the
  leading axes, more than the transposes cost. Untouched operands keep their layout.
  """
  if work and axis % x.ndim != x.ndim - 1:
    return jnp.swapaxes(x, axis, -1), -1
  return x, axis


def _quantized(x, op, axes, weight: bool, recipe: GemmRecipe, *, pack: bool, **kw):
  """opq.pack (a QArray) or opq.fake (values) of an operand, pinned to its shards.

  Under `weight_sharding` (the trainer's FSDP step), an operand with logical axes `axes` (in x's
  layout) keeps its quantization on its own shards: an activation's rows stay split over the
  batch, and a weight (`weight`) is quantized on its shards and, unless packed as a residual,
  gathered as codes and scales (`lpjax.quant.gemm.weight_gather`); a high-precision weight is
  gathered in the compute dtype.
  """
  plain = lambda: (opq.pack(x, op, **kw) if (pack and op is not None) else
                   opq.fake(x, op, dtype=recipe.compute_dtype, **kw))
  if (op is not None and op.format is None) or not wg.active(
      axes, x.shape, op.format if op is not None else None, kw.get("block")):
    return plain()
  if weight and not pack:
    if op is None:  # high precision: gather the input (the compute dtype), then the RHT if any
      x = wg.pin(wg.pin(x, axes, gathered=False), axes, gathered=True)
      return opq.fake(x, None, dtype=recipe.compute_dtype, **kw)
    y = wg.fake_gathered(x, op, axes, dtype=recipe.compute_dtype, **kw)
    if y is not None:
      return y
  return wg.pin(plain(), axes, gathered=False)


def _layout_axes(x, gemm: str, side: int, w_axes, moved: bool):
  """(logical axes of operand x in its quantization layout, whether it is the weight).

  The weight (RHS of fwd and dgrad) has the axes its layer gave (`rhs_axes`); a 2-D activation
  (X or dY, rows = tokens) has its rows over "batch"; anything else has none.
  """
  if gemm in ("fwd", "dgrad") and side == RHS:
    return _swapped(w_axes, moved), True
  if x.ndim != 2:
    return None, False
  return ((None, "batch") if moved else ("batch", None)), False


def _swapped(w_axes, moved: bool):
  """W's logical axes after `_to_last` (W is 2-D when it has axes): reversed if it was moved."""
  return tuple(reversed(w_axes)) if (moved and w_axes is not None) else w_axes


def _fwd_operand(x, side: int, key, recipe: GemmRecipe, *, pack: bool = False, w_axes=None):
  """Operand `side` of the forward GEMM: (values or QArray, contraction axis)."""
  op = recipe.fwd.operands()[side]
  signs, block = gemm_signs(key, recipe, "fwd")
  x, axis = _to_last(x, -1 if side == LHS else -2, op is not None or bool(block))
  kw = dict(axis=axis, key=opq.operand_key(key, "fwd", side), signs=signs, block=block)
  axes, weight = _layout_axes(x, "fwd", side, w_axes, side == RHS and axis == -1)
  return _quantized(x, op, axes, weight, recipe, pack=pack, **kw), axis


def _operand(x, gemm: str, side: int, axis: int, key, recipe: GemmRecipe, *, pack: bool = False,
             w_axes=None):
  """Operand `side` of `gemm` from high precision: (values, or a QArray if `pack`; its axis)."""
  op = getattr(recipe, gemm).operands()[side]
  if op == REUSE_FWD:
    x, axis = _reuse(x, side, axis, key, recipe, pack=pack, w_axes=w_axes)
    if pack:
      return x, axis
    op, w_axes = None, None  # the forward's values, gathered already
  elif isinstance(op, OperandQuant) and op.from_fwd:  # re-quantize the forward's Q(X) / Q(W)
    x, axis = _reuse(x, side, axis, key, recipe, w_axes=w_axes)
    w_axes = None  # gathered already
  elif op is None and recipe.trust_masked and (gemm, side) in (("dgrad", RHS), ("wgrad", LHS)):
    x, axis = _reuse(x, side, axis, key, recipe, w_axes=w_axes)  # QuEST: the rotated domain
    w_axes = None
  signs, block = gemm_signs(key, recipe, gemm)
  before = axis % x.ndim
  x, axis = _to_last(x, axis, op is not None or bool(block))
  kw = dict(axis=axis, key=opq.operand_key(key, gemm, side), signs=signs, block=block)
  axes, weight = _layout_axes(x, gemm, side, w_axes, axis % x.ndim != before)
  return _quantized(x, op, axes, weight, recipe, pack=pack, **kw), axis


def _reuse(x, side: int, axis: int, key, recipe: GemmRecipe, *, pack: bool = False, w_axes=None):
  """REUSE_FWD: the forward's fake-quantized X (LHS) or W (RHS), and where `axis` went."""
  y, fwd_axis = _fwd_operand(x, side, key, recipe, pack=pack, w_axes=w_axes)
  moved = fwd_axis != (-1 if side == LHS else -2)  # the forward swapped the last two axes
  if moved:
    axis = {-1: -2, -2: -1}[axis]
  return y, axis


def _unpacked(res, axis: int, gemm: str, side: int, key, recipe: GemmRecipe, w_axes=None,
              pack: bool = False):
  """The backward operand from a residual kept by `_residual` (QArray or high precision).

  A packed weight residual (kept on its shards) is gathered as codes before it is unpacked
  (`pack`: not unpacked, for the FP4 GEMM kernel, `kernel_dispatch`).
  """
  op = getattr(recipe, gemm).operands()[side]
  if op == REUSE_FWD:
    fwd_op = recipe.fwd.operands()[side]
    if fwd_op is None:  # kept in high precision
      return _operand(res, gemm, side, axis, key, recipe, w_axes=w_axes)
    res = wg.pin_qarray(res, _swapped(w_axes, True), gathered=True)  # packed as W^T (N, K)
    x = opq.unpack(res, fwd_op, recipe.compute_dtype or res.dtype)
    signs, block = gemm_signs(key, recipe, gemm)
    x, axis = _to_last(x, axis, bool(block))
    return opq.fake(x, None, axis=axis, key=None, signs=signs, block=block,
                    dtype=recipe.compute_dtype), axis
  if op is None:
    return _operand(res, gemm, side, axis, key, recipe, w_axes=w_axes)
  res = wg.pin_qarray(res, w_axes, gathered=True) if w_axes is not None else res
  return (res if pack else opq.unpack(res, op, recipe.compute_dtype or res.dtype)), axis


# The backward operands that residuals="quantized" packs in the forward pass:
# (gemm, side, contraction axis in the canonical operand).
_W_FOR_DGRAD = ("dgrad", RHS, -1)  # W (K, N) blocked along N
_X_FOR_WGRAD = ("wgrad", LHS, -2)  # X (M, K) blocked along M


def _residual(x, which, key, recipe: GemmRecipe, w_axes=None):
  """residuals="quantized": (packed operand or x itself if high precision, its axis)."""
  gemm, side, axis = which
  op = getattr(recipe, gemm).operands()[side]
  if op is None or (op == REUSE_FWD and recipe.fwd.operands()[side] is None):
    return x, axis
  return _operand(x, gemm, side, axis, key, recipe, pack=True, w_axes=w_axes)


def _mm_out(a_ax, b_ax, cfg: _Static, kernel_gemm: str | None = None):
  (a, a_axis), (b, b_axis) = a_ax, b_ax
  if kernel_gemm is not None:  # two packed QArrays, blocked along their last axes
    return gk.matmul(a, b, cfg.recipe, kernel_gemm)
  return _mm(a, b, a_axis, b_axis, cfg)


def _forward(lhs, rhs, key, cfg: _Static):
  r = cfg.recipe
  kernel = gk.use_kernel(r, "fwd")
  w = _fwd_operand(rhs, RHS, key, r, pack=kernel, w_axes=cfg.rhs_axes)
  x = _fwd_operand(lhs, LHS, key, r, pack=kernel)
  return _mm_out(x, w, cfg, "fwd" if kernel else None).astype(cfg.out_dtype)


def _qgemm_fwd(lhs, rhs, key, cfg: _Static):
  r = cfg.recipe
  if r.residuals == "quantized":
    x_res, x_axis = _residual(lhs, _X_FOR_WGRAD, key, r)
    w_res, w_axis = _residual(rhs, _W_FOR_DGRAD, key, r, cfg.rhs_axes)
    res = (x_res, w_res)
    assert (x_axis, w_axis) == _residual_axes(r), "residual layout out of sync"
  else:
    res = (lhs, rhs)
  return _forward(lhs, rhs, key, cfg), (res, key)


def _residual_axes(recipe: GemmRecipe):
  """The contraction axes of the kept residuals (static, so recomputed from the recipe)."""
  out = []
  for gemm, side, axis in (_X_FOR_WGRAD, _W_FOR_DGRAD):
    op = getattr(recipe, gemm).operands()[side]
    if op == REUSE_FWD:
      if recipe.fwd.operands()[side] is not None and side == RHS:
        axis = -3 - axis  # the forward moved W's K axis last: swap -1 and -2
    elif op is not None:
      axis = -1  # packed along the last axis (`_to_last`)
    out.append(axis)
  return tuple(out)


def _qgemm_bwd(cfg: _Static, lhs_dtype, rhs_dtype, residuals, dy):
  (x_res, w_res), key = residuals
  r = cfg.recipe
  kd, kw = gk.use_kernel(r, "dgrad"), gk.use_kernel(r, "wgrad")  # packed operands, the kernel
  # dgrad: dX = dY W^T, contraction over N.
  dy_n = _operand(dy, "dgrad", LHS, -1, key, r, pack=kd)
  if r.residuals == "quantized":
    x_axis, w_axis = _residual_axes(r)
    w_n = _unpacked(w_res, w_axis, "dgrad", RHS, key, r, cfg.rhs_axes, pack=kd)
    x_m = _unpacked(x_res, x_axis, "wgrad", LHS, key, r, pack=kw)
  else:
    w_n = _operand(w_res, "dgrad", RHS, -1, key, r, pack=kd, w_axes=cfg.rhs_axes)
    x_m = _operand(x_res, "wgrad", LHS, -2, key, r, pack=kw)
  dx = _mm_out(dy_n, w_n, cfg, "dgrad" if kd else None)
  # wgrad: dW = X^T dY, contraction over M; computed as (dY^T X)^T like jax's own transpose rule.
  dy_m = _operand(dy, "wgrad", RHS, -2, key, r, pack=kw)
  dw = jnp.swapaxes(_mm_out(dy_m, x_m, cfg, "wgrad" if kw else None), -1, -2)
  if r.trust_masked:
    dx = _through_trust_mask(dx, x_res, LHS, key, r)
    dw = _through_trust_mask(dw, w_res, RHS, key, r)
  return dx.astype(lhs_dtype), dw.astype(rhs_dtype), None  # no cotangent for the key


@functools.lru_cache(maxsize=None)
def _qgemm(cfg: _Static, lhs_dtype, rhs_dtype):
  """The custom_vjp GEMM for one static configuration (cached: one Python function per config)."""

  @jax.custom_vjp
  def gemm(lhs, rhs, key):
    return _forward(lhs, rhs, key, cfg)

  gemm.defvjp(functools.partial(_qgemm_fwd, cfg=cfg),
              functools.partial(_qgemm_bwd, cfg, lhs_dtype, rhs_dtype))
  return gemm


def dot_general(lhs, rhs, dimension_numbers, recipe, *, key=None, preferred_element_type=None,
                rhs_axes=None):
  """`jax.lax.dot_general` with the operands of its forward and backward GEMMs quantized by `recipe`.

  Args:
    lhs, rhs: float arrays (X and W of the recipe's tables: lhs is the activation side).
    dimension_numbers: ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)), as for lax.
    recipe: a `GemmRecipe` or a preset name (`lpjax.quant.recipes.NAMES`).
    key: jax.random key for stochastic rounding and RHT signs; SR and per-GEMM/per-operand keys
      are derived from it with `jax.random.fold_in` (without a key the RHT signs are fixed).
    preferred_element_type: output dtype; default the promoted input dtype.
    rhs_axes: logical axes of a 2-D weight `rhs` (K, N) contracted on its first axis, e.g.
      ("embed", "mlp"). Within `lpjax.quant.weight_sharding(resolver)` (the trainer enters it
      under FSDP) the quantized weight is then made on its shards and all-gathered as packed
      codes and scales, not as high-precision values; the result is bit-identical.

  Returns:
    The dot_general result, laid out as lax.dot_general's: (batch, lhs free, rhs free).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> x, w = jnp.ones((4, 64)), jnp.full((64, 8), 0.5)
    >>> f = jax.jit(lambda x, w: dot_general(x, w, (((1,), (0,)), ((), ())), "mxfp4_naive"))
    >>> f(x, w)[0, :2].tolist()   # 1 and 0.5 are exact in MXFP4
    [32.0, 32.0]
    >>> g = jax.jit(lambda x, w, key: dot_general(x, w, (((1,), (0,)), ((), ())), "mxfp4", key=key))
    >>> g(x, w, jax.random.key(0)).shape   # RHT-32 before rounding: no longer exact
    (4, 8)
  """
  recipe = recipes.get(recipe)
  lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
  if recipe.compute_dtype is None and lhs.dtype != rhs.dtype:
    common = jnp.promote_types(lhs.dtype, rhs.dtype)
    lhs, rhs = lhs.astype(common), rhs.astype(common)
  out_dtype = jnp.dtype(preferred_element_type or jnp.result_type(lhs, rhs))
  key = as_key(key)
  if key is None and recipe.needs_key:
    raise ValueError(f"Recipe {recipe} rounds stochastically: pass key=jax.random.key(...).")
  lhs3, rhs3, out_shape, batched = canonical(lhs, rhs, dimension_numbers)
  if rhs_axes is not None:
    rhs_axes = tuple(rhs_axes)
    if rhs.ndim != 2 or len(rhs_axes) != 2 or batched or tuple(dimension_numbers[0][1]) not in ((0,), (-2,)):
      raise ValueError(f"rhs_axes={rhs_axes!r} names the axes of a 2-D weight (K, N) contracted "
                       f"on its first axis; this rhs has shape {rhs.shape} and dimension_numbers "
                       f"{dimension_numbers!r}. Drop rhs_axes or bring the weight to (K, N).")
  cfg = _Static(recipe, out_dtype, preferred_element_type, batched, rhs_axes)
  observer = OBSERVER.get()
  if observer is not None:
    fwd = functools.partial(_qgemm_fwd, cfg=cfg)
    bwd = functools.partial(_qgemm_bwd, cfg, lhs3.dtype, rhs3.dtype)
    return observer(lhs3, rhs3, key, cfg, fwd, bwd).reshape(out_shape)
  return _qgemm(cfg, lhs3.dtype, rhs3.dtype)(lhs3, rhs3, key).reshape(out_shape)


def canonical_gemm(lhs3, rhs3, key, cfg: _Static, recipe: GemmRecipe | None = None):
  """The canonical GEMM of `dot_general` (an observer's `cfg`), with `recipe` in place of the
  configuration's own if given (e.g. its high-precision counterpart)."""
  if recipe is not None:
    cfg = dataclasses.replace(cfg, recipe=recipe)
  return _qgemm(cfg, lhs3.dtype, rhs3.dtype)(lhs3, rhs3, key)


# (gemm, side, operand name, the canonical tensor it comes from, its contraction axis there)
QUANTIZER_PLACES = (("fwd", LHS, "x", "lhs", -1), ("fwd", RHS, "w", "rhs", -2),
                    ("dgrad", LHS, "dy", "dy", -1), ("dgrad", RHS, "w", "rhs", -1),
                    ("wgrad", LHS, "x", "lhs", -2), ("wgrad", RHS, "dy", "dy", -2))


def quantizer_inputs(lhs3, rhs3, dy3, key, recipe: GemmRecipe) -> list[dict]:
  """What each quantized operand quantizer of the GEMM's three passes is given, in the layout
  and with the keys the custom VJP uses (`_fwd_operand` / `_operand`); the monitor measures these.

  One dict per quantized operand, in `QUANTIZER_PLACES` order: gemm, side, operand ("x", "w",
  "dy"), x (before the RHT and pre-scale, its blocked axis at `axis`), op (the OperandQuant), and
  axis, key, signs, block for `operand.quantize_view`; `reuses_fwd` is True where the pass
  multiplies the forward's quantized operand (REUSE_FWD: the forward's quantizer input again).
  High-precision operands are left out. `dy3` may be None (then the dY operands are left out).
  """
  tensors = {"lhs": lhs3, "rhs": rhs3, "dy": dy3}
  out = []
  for gemm, side, name, source, axis in QUANTIZER_PLACES:
    x = tensors[source]
    if x is None:
      continue
    op = getattr(recipe, gemm).operands()[side]
    reuses = op == REUSE_FWD
    if reuses:
      gemm_of_op, op = "fwd", recipe.fwd.operands()[side]
      axis = -1 if side == LHS else -2
    else:
      gemm_of_op = gemm
      if isinstance(op, OperandQuant) and op.from_fwd:  # re-quantizes the forward's Q(X) / Q(W)
        x, axis = _reuse(x, side, axis, key, recipe)
    if not isinstance(op, OperandQuant):
      continue
    signs, block = gemm_signs(key, recipe, gemm_of_op)
    x, axis = _to_last(x, axis, True)
    out.append(dict(gemm=gemm, side=side, operand=name, x=x, op=op, axis=axis,
                    key=opq.operand_key(key, gemm_of_op, side), signs=signs, block=block,
                    reuses_fwd=reuses))
  return out


def operand_stats(lhs, rhs, dimension_numbers, recipe, *, key=None):
  """Numerics statistics of the forward GEMM's quantized operands (see `operand.stats`).

  Recomputes the forward quantization (same keys, so the same values) under stop_gradient; the
  GEMM result is unaffected. Returns {"lhs": {...}, "rhs": {...}} with the quantized sides only.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> stats = jax.jit(operand_stats, static_argnums=(2, 3))
    >>> s = stats(jnp.ones((4, 32)), jnp.ones((32, 8)), (((1,), (0,)), ((), ())), "mxfp4_naive")
    >>> sorted(s), sorted(s["lhs"]), float(s["lhs"]["snr_db"])
    (['lhs', 'rhs'], ['amax', 'frac_flushed', 'frac_saturated', 'snr_db'], inf)
  """
  recipe = recipes.get(recipe)
  key = as_key(key)
  lhs3, rhs3, _, _ = canonical(jnp.asarray(lhs), jnp.asarray(rhs), dimension_numbers)
  signs, block = gemm_signs(key, recipe, "fwd")
  out = {}
  for name, x, side, axis in (("lhs", lhs3, LHS, -1), ("rhs", rhs3, RHS, -2)):
    op = recipe.fwd.operands()[side]
    if op is not None:
      x, axis = _to_last(x, axis, True)  # the layout `_fwd_operand` quantizes in
      out[name] = opq.stats(x, op, axis=axis, key=opq.operand_key(key, "fwd", side), signs=signs,
                            block=block)
  return out
