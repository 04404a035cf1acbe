"""Quantized `dot_general` and `einsum`: one `jax.custom_vjp` running a recipe's three GEMMs.

Every GEMM is brought to the canonical form (B, M, K) x (B, K, N) -> (B, M, N) by transposing
and reshaping its operands (batch dims -> B, free dims -> M / N, contracting dims -> K, each
group flattened in the order given), and the custom VJP runs

    fwd:   Y  = Q(X along K) Q(W along K)
    dgrad: dX = Q(dY along N) Q(W along N)^T
    wgrad: dW = Q(X along M)^T Q(dY along M)

with the operand quantizers of the recipe (`lpjax.quant._gemm_recipe`). Backward operands are quantized
again from the high-precision values (or from packed column-wise copies made in the forward pass,
`residuals="quantized"`), never by transposing a row-wise quantized tensor (docs/numerics.md §7).
Fake quantization emulates the low-precision GEMM: the dequantized operands are cast to the
recipe's `compute_dtype` and multiplied with float32 accumulation.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lpjax.quant._einsum import einsum
  >>> from lpjax.quant._gemm import dot_general
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

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from lpjax.quant import _operand as opq
from lpjax.quant._hadamard import hadamard
from lpjax.quant._quest import quest
from lpjax.quant._operand import LHS, RHS
from lpjax.quant import recipes
from lpjax.quant._gemm_recipe import REUSE_FWD, GemmRecipe, OperandQuant


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


def _signs(key, recipe: GemmRecipe, gemm: str):
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
  signs, block = _signs(key, recipe, "fwd")
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

  The quantizer and the RHT are much faster along a contiguous last axis; the transposed copy
  is the "column-wise" operand of TransformerEngine. Untouched operands keep their layout.
  """
  if work and axis % x.ndim != x.ndim - 1:
    return jnp.swapaxes(x, axis, -1), -1
  return x, axis


def _fwd_operand(x, side: int, key, recipe: GemmRecipe, *, pack: bool = False):
  """Operand `side` of the forward GEMM: (values or QArray, contraction axis)."""
  op = recipe.fwd.operands()[side]
  signs, block = _signs(key, recipe, "fwd")
  x, axis = _to_last(x, -1 if side == LHS else -2, op is not None or bool(block))
  kw = dict(axis=axis, key=opq.operand_key(key, "fwd", side), signs=signs, block=block)
  if pack and op is not None:
    return opq.pack(x, op, **kw), axis
  return opq.fake(x, op, dtype=recipe.compute_dtype, **kw), axis


def _operand(x, gemm: str, side: int, axis: int, key, recipe: GemmRecipe, *, pack: bool = False):
  """Operand `side` of `gemm` from high precision: (values, or a QArray if `pack`; its axis)."""
  op = getattr(recipe, gemm).operands()[side]
  if op == REUSE_FWD:
    x, axis = _reuse(x, side, axis, key, recipe, pack=pack)
    if pack:
      return x, axis
    op = None
  elif isinstance(op, OperandQuant) and op.from_fwd:  # re-quantize the forward's Q(X) / Q(W)
    x, axis = _reuse(x, side, axis, key, recipe)
  elif op is None and recipe.trust_masked and (gemm, side) in (("dgrad", RHS), ("wgrad", LHS)):
    x, axis = _reuse(x, side, axis, key, recipe)  # QuEST's backward runs in the rotated domain
  signs, block = _signs(key, recipe, gemm)
  x, axis = _to_last(x, axis, op is not None or bool(block))
  kw = dict(axis=axis, key=opq.operand_key(key, gemm, side), signs=signs, block=block)
  if pack and op is not None:
    return opq.pack(x, op, **kw), axis
  return opq.fake(x, op, dtype=recipe.compute_dtype, **kw), axis


def _reuse(x, side: int, axis: int, key, recipe: GemmRecipe, *, pack: bool = False):
  """REUSE_FWD: the forward's fake-quantized X (LHS) or W (RHS), and where `axis` went."""
  y, fwd_axis = _fwd_operand(x, side, key, recipe, pack=pack)
  moved = fwd_axis != (-1 if side == LHS else -2)  # the forward swapped the last two axes
  if moved:
    axis = {-1: -2, -2: -1}[axis]
  return y, axis


def _unpacked(res, axis: int, gemm: str, side: int, key, recipe: GemmRecipe):
  """The backward operand from a residual kept by `_residual` (QArray or high precision)."""
  op = getattr(recipe, gemm).operands()[side]
  if op == REUSE_FWD:
    fwd_op = recipe.fwd.operands()[side]
    if fwd_op is None:  # kept in high precision
      return _operand(res, gemm, side, axis, key, recipe)
    x = opq.unpack(res, fwd_op, recipe.compute_dtype or res.dtype)
    signs, block = _signs(key, recipe, gemm)
    x, axis = _to_last(x, axis, bool(block))
    return opq.fake(x, None, axis=axis, key=None, signs=signs, block=block,
                    dtype=recipe.compute_dtype), axis
  if op is None:
    return _operand(res, gemm, side, axis, key, recipe)
  return opq.unpack(res, op, recipe.compute_dtype or res.dtype), axis


# The backward operands that residuals="quantized" packs in the forward pass:
# (gemm, side, contraction axis in the canonical operand).
_W_FOR_DGRAD = ("dgrad", RHS, -1)  # W (K, N) blocked along N
_X_FOR_WGRAD = ("wgrad", LHS, -2)  # X (M, K) blocked along M


def _residual(x, which, key, recipe: GemmRecipe):
  """residuals="quantized": (packed operand or x itself if high precision, its axis)."""
  gemm, side, axis = which
  op = getattr(recipe, gemm).operands()[side]
  if op is None or (op == REUSE_FWD and recipe.fwd.operands()[side] is None):
    return x, axis
  return _operand(x, gemm, side, axis, key, recipe, pack=True)


def _mm_out(a_ax, b_ax, cfg: _Static):
  (a, a_axis), (b, b_axis) = a_ax, b_ax
  return _mm(a, b, a_axis, b_axis, cfg)


def _forward(lhs, rhs, key, cfg: _Static):
  r = cfg.recipe
  return _mm_out(_fwd_operand(lhs, LHS, key, r), _fwd_operand(rhs, RHS, key, r), cfg).astype(cfg.out_dtype)


def _qgemm_fwd(lhs, rhs, key, cfg: _Static):
  r = cfg.recipe
  if r.residuals == "quantized":
    x_res, x_axis = _residual(lhs, _X_FOR_WGRAD, key, r)
    w_res, w_axis = _residual(rhs, _W_FOR_DGRAD, key, r)
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
  # dgrad: dX = dY W^T, contraction over N.
  dy_n = _operand(dy, "dgrad", LHS, -1, key, r)
  if r.residuals == "quantized":
    x_axis, w_axis = _residual_axes(r)
    w_n = _unpacked(w_res, w_axis, "dgrad", RHS, key, r)
    x_m = _unpacked(x_res, x_axis, "wgrad", LHS, key, r)
  else:
    w_n = _operand(w_res, "dgrad", RHS, -1, key, r)
    x_m = _operand(x_res, "wgrad", LHS, -2, key, r)
  dx = _mm_out(dy_n, w_n, cfg)
  # wgrad: dW = X^T dY, contraction over M; computed as (dY^T X)^T like jax's own transpose rule.
  dy_m = _operand(dy, "wgrad", RHS, -2, key, r)
  dw = jnp.swapaxes(_mm_out(dy_m, x_m, cfg), -1, -2)
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


# --- general dot_general -> canonical form ---------------------------------------------------------


def _checked_dims(dimension_numbers, lhs_ndim: int, rhs_ndim: int):
  """The four dimension tuples, non-negative; a clear ValueError for a malformed or out-of-range one."""
  try:
    (lc, rc), (lb, rb) = dimension_numbers
    dims = [tuple(int(d) for d in t) for t in (lc, rc, lb, rb)]
  except (TypeError, ValueError):
    raise ValueError(
        f"dimension_numbers must be ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)), "
        f"tuples of ints as for jax.lax.dot_general, e.g. (((1,), (0,)), ((), ())); got "
        f"{dimension_numbers!r}.") from None
  out = []
  for name, t, nd in zip(("lhs contracting", "rhs contracting", "lhs batch", "rhs batch"), dims,
                         (lhs_ndim, rhs_ndim, lhs_ndim, rhs_ndim)):
    for d in t:
      if not -nd <= d < nd:
        raise ValueError(f"dimension_numbers {dimension_numbers!r}: {name} dimension {d} is out "
                         f"of range for an operand of rank {nd}.")
    out.append([d % nd for d in t])
  return out


def _canonical(lhs, rhs, dimension_numbers):
  lc, rc, lb, rb = _checked_dims(dimension_numbers, lhs.ndim, rhs.ndim)
  if len(lc) != len(rc) or len(lb) != len(rb):
    raise ValueError(f"dimension_numbers {dimension_numbers}: lhs and rhs need as many contracting "
                     "and batch dimensions.")
  for a, b in list(zip(lc, rc)) + list(zip(lb, rb)):
    if lhs.shape[a] != rhs.shape[b]:
      raise ValueError(f"dimension_numbers {dimension_numbers}: lhs axis {a} ({lhs.shape[a]}) and "
                       f"rhs axis {b} ({rhs.shape[b]}) differ in size.")
  if len(set(lc + lb)) != len(lc + lb) or len(set(rc + rb)) != len(rc + rb):
    raise ValueError(f"dimension_numbers {dimension_numbers}: an axis appears twice.")
  lf = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
  rf = [d for d in range(rhs.ndim) if d not in rc and d not in rb]
  batch_shape = tuple(lhs.shape[d] for d in lb)
  m_shape = tuple(lhs.shape[d] for d in lf)
  n_shape = tuple(rhs.shape[d] for d in rf)
  k = math.prod(lhs.shape[d] for d in lc)
  lead = (math.prod(batch_shape),) if lb else ()
  lhs3 = jnp.transpose(lhs, lb + lf + lc).reshape(lead + (math.prod(m_shape), k))
  rhs3 = jnp.transpose(rhs, rb + rc + rf).reshape(lead + (k, math.prod(n_shape)))
  return lhs3, rhs3, batch_shape + m_shape + n_shape, bool(lb)


def dot_general(lhs, rhs, dimension_numbers, recipe, *, key=None, preferred_element_type=None):
  """`jax.lax.dot_general` with the operands of its forward and backward GEMMs quantized by `recipe`.

  Args:
    lhs, rhs: float arrays (X and W of the recipe's tables: lhs is the activation side).
    dimension_numbers: ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)), as for lax.
    recipe: a `GemmRecipe` or a preset name (`lpjax.quant.recipes.NAMES`).
    key: jax.random key for stochastic rounding and RHT signs; SR and per-GEMM/per-operand keys
      are derived from it with `jax.random.fold_in` (without a key the RHT signs are fixed).
    preferred_element_type: output dtype; default the promoted input dtype.

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
  lhs3, rhs3, out_shape, batched = _canonical(lhs, rhs, dimension_numbers)
  cfg = _Static(recipe, out_dtype, preferred_element_type, batched)
  return _qgemm(cfg, lhs3.dtype, rhs3.dtype)(lhs3, rhs3, key).reshape(out_shape)


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
  lhs3, rhs3, _, _ = _canonical(jnp.asarray(lhs), jnp.asarray(rhs), dimension_numbers)
  signs, block = _signs(key, recipe, "fwd")
  out = {}
  for name, x, side, axis in (("lhs", lhs3, LHS, -1), ("rhs", rhs3, RHS, -2)):
    op = recipe.fwd.operands()[side]
    if op is not None:
      x, axis = _to_last(x, axis, True)  # the layout `_fwd_operand` quantizes in
      out[name] = opq.stats(x, op, axis=axis, key=opq.operand_key(key, "fwd", side), signs=signs,
                            block=block)
  return out
