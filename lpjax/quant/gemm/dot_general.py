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

This module holds the custom VJP and its entry point. The operands of each pass are made in
`lpjax.quant.gemm.pass_operands`; what their quantizers see, recomputed for measurement
(`quantizer_inputs`, `operand_stats`: re-exported here), in `lpjax.quant.gemm.operand_probes`.

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
from lpjax.quant.gemm import pass_operands as po
from lpjax.quant.gemm.operand import LHS, RHS
from lpjax.quant import recipes
from lpjax.quant.gemm.canonical import canonical
from lpjax.quant.gemm.operand_probes import (  # noqa: F401 (re-exported)
    QUANTIZER_PLACES, operand_stats, quantizer_inputs)
from lpjax.quant.gemm.pass_operands import as_key, gemm_signs  # noqa: F401 (re-exported)
from lpjax.quant.recipes.gemm_recipe import GemmRecipe


# The observer of `lpjax.quant.monitor`, set around one GEMM call while it measures: None (always,
# outside a measurement), or `observer(lhs3, rhs3, key, cfg, fwd, bwd)` returning the canonical
# product, where `fwd(lhs3, rhs3, key) -> (y, residuals)` and `bwd(residuals, dy) -> (dx, dw,
# None)` are this GEMM's own custom-VJP rules: an observer that runs them gets the same bits.
OBSERVER: contextvars.ContextVar = contextvars.ContextVar("lpjax_gemm_observer", default=None)


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


def _mm_out(a_ax, b_ax, cfg: _Static, kernel_gemm: str | None = None):
  (a, a_axis), (b, b_axis) = a_ax, b_ax
  if kernel_gemm is not None:  # two packed QArrays, blocked along their last axes
    return gk.matmul(a, b, cfg.recipe, kernel_gemm)
  return _mm(a, b, a_axis, b_axis, cfg)


def _forward(lhs, rhs, key, cfg: _Static, memo: dict | None = None):
  r = cfg.recipe
  kernel = gk.use_kernel(r, "fwd")
  memo = {} if memo is None else memo  # one derivation of each pass's RHT signs (po.gemm_signs)
  po.derive_pass_keys(key, r, ("fwd",), memo)
  w = po.fwd_operand(rhs, RHS, key, r, pack=kernel, w_axes=cfg.rhs_axes, memo=memo)
  x = po.fwd_operand(lhs, LHS, key, r, pack=kernel, memo=memo)
  return _mm_out(x, w, cfg, "fwd" if kernel else None).astype(cfg.out_dtype)


def _qgemm_fwd(lhs, rhs, key, cfg: _Static):
  r = cfg.recipe
  memo = {}
  if r.residuals == "quantized":
    x_res, x_axis = po.residual(lhs, po.X_FOR_WGRAD, key, r, memo=memo)
    w_res, w_axis = po.residual(rhs, po.W_FOR_DGRAD, key, r, cfg.rhs_axes, memo=memo)
    res = (x_res, w_res)
    assert (x_axis, w_axis) == po.residual_axes(r), "residual layout out of sync"
  else:
    res = (lhs, rhs)
  return _forward(lhs, rhs, key, cfg, memo), (res, key)


def _qgemm_bwd(cfg: _Static, lhs_dtype, rhs_dtype, residuals, dy):
  (x_res, w_res), key = residuals
  r = cfg.recipe
  kd, kw = gk.use_kernel(r, "dgrad"), gk.use_kernel(r, "wgrad")  # packed operands, the kernel
  m = {}  # each pass's RHT signs derived once, shared by its operands (po.gemm_signs)
  kept = (po.W_FOR_DGRAD[:2], po.X_FOR_WGRAD[:2]) if r.residuals == "quantized" else ()
  po.derive_pass_keys(key, r, ("dgrad", "wgrad"), m, skip=kept)  # both passes' SR streams at once
  # dgrad: dX = dY W^T, contraction over N.
  dy_n = po.pass_operand(dy, "dgrad", LHS, -1, key, r, pack=kd, memo=m)
  if r.residuals == "quantized":
    x_axis, w_axis = po.residual_axes(r)
    w_n = po.unpacked(w_res, w_axis, "dgrad", RHS, key, r, cfg.rhs_axes, pack=kd, memo=m)
    x_m = po.unpacked(x_res, x_axis, "wgrad", LHS, key, r, pack=kw, memo=m)
  else:
    w_n = po.pass_operand(w_res, "dgrad", RHS, -1, key, r, pack=kd, w_axes=cfg.rhs_axes, memo=m)
    x_m = po.pass_operand(x_res, "wgrad", LHS, -2, key, r, pack=kw, memo=m)
  dx = _mm_out(dy_n, w_n, cfg, "dgrad" if kd else None)
  # wgrad: dW = X^T dY, contraction over M; computed as (dY^T X)^T like jax's own transpose rule.
  dy_m = po.pass_operand(dy, "wgrad", RHS, -2, key, r, pack=kw, memo=m)
  dw = jnp.swapaxes(_mm_out(dy_m, x_m, cfg, "wgrad" if kw else None), -1, -2)
  if r.trust_masked:
    dx = po.through_trust_mask(dx, x_res, LHS, key, r, m)
    dw = po.through_trust_mask(dw, w_res, RHS, key, r, m)
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
