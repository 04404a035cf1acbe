"""Quantized `dot_general` and `einsum`: one `jax.custom_vjp` running a recipe's three GEMMs.

Every GEMM is brought to the canonical form (B, M, K) x (B, K, N) -> (B, M, N) by transposing
and reshaping its operands (batch dims -> B, free dims -> M / N, contracting dims -> K, each
group flattened in the order given), and the custom VJP runs

    fwd:   Y  = Q(X along K) Q(W along K)
    dgrad: dX = Q(dY along N) Q(W along N)^T
    wgrad: dW = Q(X along M)^T Q(dY along M)

with the operand quantizers of the recipe (`lpjax.quant.recipe`). Backward operands are quantized
again from the high-precision values (or from packed column-wise copies made in the forward pass,
`residuals="quantized"`), never by transposing a row-wise quantized tensor (NUMERICS.md §7).
Fake quantization emulates the low-precision GEMM: the dequantized operands are cast to the
recipe's `compute_dtype` and multiplied with float32 accumulation.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lpjax.quant.gemm import dot_general, einsum
  >>> x = jax.random.normal(jax.random.key(0), (2, 8, 64))
  >>> w = jax.random.normal(jax.random.key(1), (64, 32))
  >>> y = dot_general(x, w, (((2,), (0,)), ((), ())), "mxfp4_naive")
  >>> y.shape, y.dtype
  ((2, 8, 32), dtype('float32'))
  >>> g = jax.grad(lambda w: einsum("bsd,df->bsf", x, w, recipe="mxfp4", key=jax.random.key(2)).sum())(w)
  >>> g.shape
  (64, 32)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from lpjax.quant import operand as opq
from lpjax.quant.operand import LHS, RHS
from lpjax.quant.recipe import REUSE_FWD, GemmRecipe


def resolve_recipe(recipe) -> GemmRecipe:
  """A GemmRecipe, or a preset name of `lpjax.quant.recipes`."""
  if isinstance(recipe, GemmRecipe):
    return recipe
  if isinstance(recipe, str):
    from lpjax.quant import recipes  # recipes imports this package's modules, not this one

    return recipes.get(recipe)
  raise TypeError(f"recipe must be a GemmRecipe or a preset name, got {type(recipe).__name__}.")


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
  return (opq.hadamard_signs(key, gemm, block) if block else None), block


def _operand(x, gemm: str, side: int, axis: int, key, recipe: GemmRecipe):
  """Operand `side` of `gemm` from high precision (or the forward's, for REUSE_FWD)."""
  op = getattr(recipe, gemm).operands()[side]
  signs, block = _signs(key, recipe, gemm)
  if op == REUSE_FWD:  # the forward's fake-quantized X (side LHS) or W (side RHS), unrotated
    fwd_op = recipe.fwd.operands()[side]
    fwd_axis = -1 if side == LHS else -2
    x = opq.fake(x, fwd_op, axis=fwd_axis, key=opq.operand_key(key, "fwd", side),
                 dtype=recipe.compute_dtype)
    op = None
  return opq.fake(x, op, axis=axis, key=opq.operand_key(key, gemm, side), signs=signs, block=block,
                  dtype=recipe.compute_dtype)


# Which residual each backward operand comes from: (gemm, side, axis in the canonical operand).
_W_FOR_DGRAD = ("dgrad", RHS, -1)  # W blocked along N
_X_FOR_WGRAD = ("wgrad", LHS, -2)  # X blocked along M


def _pack_residual(x, which, key, recipe: GemmRecipe):
  """residuals="quantized": the backward operand packed in the forward pass, or x if high precision."""
  gemm, side, axis = which
  op = getattr(recipe, gemm).operands()[side]
  if op is None:
    return x
  if op == REUSE_FWD:
    fwd_op = recipe.fwd.operands()[side]
    if fwd_op is None:
      return x
    return opq.pack(x, fwd_op, axis=-1 if side == LHS else -2, key=opq.operand_key(key, "fwd", side))
  signs, block = _signs(key, recipe, gemm)
  return opq.pack(x, op, axis=axis, key=opq.operand_key(key, gemm, side), signs=signs, block=block)


def _residual_operand(res, which, key, recipe: GemmRecipe):
  """The backward operand from what `_pack_residual` kept."""
  gemm, side, axis = which
  op = getattr(recipe, gemm).operands()[side]
  if op is None or (op == REUSE_FWD and recipe.fwd.operands()[side] is None):
    return _operand(res, gemm, side, axis, key, recipe)  # kept in high precision
  signs, block = _signs(key, recipe, gemm)
  if op == REUSE_FWD:
    x = opq.unpack(res, recipe.fwd.operands()[side], recipe.compute_dtype or res.dtype)
    return opq.fake(x, None, axis=axis, key=None, signs=signs, block=block, dtype=recipe.compute_dtype)
  return opq.unpack(res, op, recipe.compute_dtype or res.dtype)


def _forward(lhs, rhs, key, cfg: _Static):
  r = cfg.recipe
  a = _operand(lhs, "fwd", LHS, -1, key, r)
  b = _operand(rhs, "fwd", RHS, -2, key, r)
  return _mm(a, b, -1, -2, cfg).astype(cfg.out_dtype)


def _qgemm_fwd(lhs, rhs, key, cfg: _Static):
  y = _forward(lhs, rhs, key, cfg)
  r = cfg.recipe
  if r.residuals == "quantized":
    res = (_pack_residual(lhs, _X_FOR_WGRAD, key, r), _pack_residual(rhs, _W_FOR_DGRAD, key, r))
  else:
    res = (lhs, rhs)
  return y, (res, key)


def _qgemm_bwd(cfg: _Static, lhs_dtype, rhs_dtype, residuals, dy):
  (x_res, w_res), key = residuals
  r = cfg.recipe
  quantized = r.residuals == "quantized"
  # dgrad: dX = dY W^T, contraction over N.
  dy_n = _operand(dy, "dgrad", LHS, -1, key, r)
  w_n = (_residual_operand(w_res, _W_FOR_DGRAD, key, r) if quantized
         else _operand(w_res, "dgrad", RHS, -1, key, r))
  dx = _mm(dy_n, w_n, -1, -1, cfg)
  # wgrad: dW = X^T dY, contraction over M; computed as (dY^T X)^T like jax's own transpose rule.
  x_m = (_residual_operand(x_res, _X_FOR_WGRAD, key, r) if quantized
         else _operand(x_res, "wgrad", LHS, -2, key, r))
  dy_m = _operand(dy, "wgrad", RHS, -2, key, r)
  dw = jnp.swapaxes(_mm(dy_m, x_m, -2, -2, cfg), -1, -2)
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


def _canonical(lhs, rhs, dimension_numbers):
  (lc, rc), (lb, rb) = dimension_numbers
  lc, rc, lb, rb = ([int(d) % x.ndim for d in dims] for x, dims in
                    ((lhs, lc), (rhs, rc), (lhs, lb), (rhs, rb)))
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
    >>> dot_general(x, w, (((1,), (0,)), ((), ())), "nvfp4", key=jax.random.key(0))[0, :2].tolist()
    [32.0, 32.0]
  """
  recipe = resolve_recipe(recipe)
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
    >>> import jax.numpy as jnp
    >>> s = operand_stats(jnp.ones((4, 32)), jnp.ones((32, 8)), (((1,), (0,)), ((), ())), "mxfp4_naive")
    >>> sorted(s), sorted(s["lhs"]), float(s["lhs"]["snr_db"])
    (['lhs', 'rhs'], ['amax', 'frac_flushed', 'frac_saturated', 'snr_db'], inf)
  """
  recipe = resolve_recipe(recipe)
  key = as_key(key)
  lhs3, rhs3, _, _ = _canonical(jnp.asarray(lhs), jnp.asarray(rhs), dimension_numbers)
  signs, block = _signs(key, recipe, "fwd")
  out = {}
  for name, x, side, axis in (("lhs", lhs3, LHS, -1), ("rhs", rhs3, RHS, -2)):
    op = recipe.fwd.operands()[side]
    if op is not None:
      out[name] = opq.stats(x, op, axis=axis, key=opq.operand_key(key, "fwd", side), signs=signs,
                            block=block)
  return out


# --- einsum ---------------------------------------------------------------------------------------


def _parse_einsum(subscripts: str, lhs_ndim: int, rhs_ndim: int):
  spec = subscripts.replace(" ", "")
  if "->" in spec:
    ins, out = spec.split("->")
  else:
    ins, out = spec, None
  terms = ins.split(",")
  if len(terms) != 2:
    raise ValueError(f"einsum {subscripts!r}: exactly two operands are supported.")
  used = set(c for c in spec if c.isalpha())
  spare = iter(c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in used)
  ell = None
  for i, (t, nd) in enumerate(zip(terms, (lhs_ndim, rhs_ndim))):
    if "..." in t:
      n = nd - (len(t) - 3)
      if ell is None:
        ell = "".join(next(spare) for _ in range(n))
      elif len(ell) != n:
        raise ValueError(f"einsum {subscripts!r}: '...' must cover the same number of axes in both operands.")
      terms[i] = t.replace("...", ell)
  if out is None:
    counts = {c: (terms[0] + terms[1]).count(c) for c in terms[0] + terms[1]}
    out = (ell or "") + "".join(sorted(c for c in counts if counts[c] == 1 and c not in (ell or "")))
  elif "..." in out:
    out = out.replace("...", ell or "")
  a, b = terms
  for t, nd in ((a, lhs_ndim), (b, rhs_ndim)):
    if len(t) != nd:
      raise ValueError(f"einsum {subscripts!r}: term {t!r} does not match an operand of rank {nd}.")
    if len(set(t)) != len(t):
      raise NotImplementedError(f"einsum {subscripts!r}: repeated indices within an operand (diagonals).")
  return a, b, out


def einsum(subscripts: str, *operands, recipe, key=None, preferred_element_type=None):
  """Two-operand `jnp.einsum` through `dot_general` with `recipe` (the first operand is the lhs).

  Indices in both operands and the output are batch dims, in both operands only contracted,
  in one operand and the output free; an index in one operand only and not in the output is summed
  first (in high precision). Supports '...' but not repeated indices within an operand.

  Examples:
    >>> import jax.numpy as jnp
    >>> q, k = jnp.ones((2, 4, 8, 32)), jnp.ones((2, 4, 8, 32))
    >>> einsum("bhqd,bhkd->bhqk", q, k, recipe="mxfp4_naive").shape
    (2, 4, 8, 8)
  """
  if len(operands) != 2:
    raise ValueError(f"einsum takes exactly two operands, got {len(operands)}.")
  lhs, rhs = (jnp.asarray(o) for o in operands)
  a, b, out = _parse_einsum(subscripts, lhs.ndim, rhs.ndim)
  for t, other, x in ((a, b, "lhs"), (b, a, "rhs")):
    lone = [c for c in t if c not in other and c not in out]
    if lone:
      arr = lhs if x == "lhs" else rhs
      arr = jnp.sum(arr, axis=tuple(t.index(c) for c in lone))
      t2 = "".join(c for c in t if c not in lone)
      if x == "lhs":
        lhs, a = arr, t2
      else:
        rhs, b = arr, t2
  batch = [c for c in a if c in b and c in out]
  contract = [c for c in a if c in b and c not in out]
  dims = ((tuple(a.index(c) for c in contract), tuple(b.index(c) for c in contract)),
          (tuple(a.index(c) for c in batch), tuple(b.index(c) for c in batch)))
  y = dot_general(lhs, rhs, dims, recipe, key=key, preferred_element_type=preferred_element_type)
  got = batch + [c for c in a if c not in b] + [c for c in b if c not in a]
  if sorted(got) != sorted(out):
    raise ValueError(f"einsum {subscripts!r}: output indices {out!r} do not match the operands.")
  return jnp.transpose(y, tuple(got.index(c) for c in out)) if got != list(out) else y
