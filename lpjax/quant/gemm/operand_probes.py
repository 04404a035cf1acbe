"""What the quantized GEMM's operand quantizers are given, recomputed for measurement.

`quantizer_inputs` gives, for each quantized operand of `dot_general`'s three passes (in
`QUANTIZER_PLACES` order), the tensor its quantizer sees with the layout, keys and Hadamard signs
the custom VJP uses (`lpjax.quant.monitor` measures these where it cannot read the GEMM's own
quantization: `pass_operands.OPERAND_OBSERVER`); `operand_stats` gives the numerics
statistics of the forward GEMM's quantized operands. Both recompute the quantization from the
same keys (so the same values) and leave the GEMM itself untouched.

Examples:
  >>> import jax.numpy as jnp
  >>> x, w = jnp.ones((4, 32)), jnp.ones((32, 8))   # X (M, K), W (K, N); no dY: its rows left out
  >>> seen = quantizer_inputs(x, w, None, None, recipes.get("mxfp4_naive"))
  >>> [(d["gemm"], d["operand"], d["x"].shape) for d in seen]   # each blocked along its last axis
  [('fwd', 'x', (4, 32)), ('fwd', 'w', (8, 32)), ('dgrad', 'w', (32, 8)), ('wgrad', 'x', (32, 4))]
"""

from __future__ import annotations

import jax.numpy as jnp

from lpjax.quant import recipes
from lpjax.quant.gemm import operand as opq
from lpjax.quant.gemm import pass_operands as po
from lpjax.quant.gemm.canonical import canonical
from lpjax.quant.gemm.operand import LHS, RHS
from lpjax.quant.recipes.gemm_recipe import REUSE_FWD, GemmRecipe, OperandQuant


# (gemm, side, operand name, the canonical tensor it comes from, its contraction axis there)
QUANTIZER_PLACES = (("fwd", LHS, "x", "lhs", -1), ("fwd", RHS, "w", "rhs", -2),
                    ("dgrad", LHS, "dy", "dy", -1), ("dgrad", RHS, "w", "rhs", -1),
                    ("wgrad", LHS, "x", "lhs", -2), ("wgrad", RHS, "dy", "dy", -2))


def quantizer_inputs(lhs3, rhs3, dy3, key, recipe: GemmRecipe) -> list[dict]:
  """What each quantized operand quantizer of the GEMM's three passes is given, in the layout
  and with the keys the custom VJP uses (`pass_operands.fwd_operand` / `pass_operand`); the
  monitor measures these.

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
        x, axis = po.reuse(x, side, axis, key, recipe)
    if not isinstance(op, OperandQuant):
      continue
    signs, block = po.gemm_signs(key, recipe, gemm_of_op)
    x, axis = po.to_last(x, axis, True)
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
  key = po.as_key(key)
  lhs3, rhs3, _, _ = canonical(jnp.asarray(lhs), jnp.asarray(rhs), dimension_numbers)
  signs, block = po.gemm_signs(key, recipe, "fwd")
  out = {}
  for name, x, side, axis in (("lhs", lhs3, LHS, -1), ("rhs", rhs3, RHS, -2)):
    op = recipe.fwd.operands()[side]
    if op is not None:
      x, axis = po.to_last(x, axis, True)  # the layout `pass_operands.fwd_operand` quantizes in
      out[name] = opq.stats(x, op, axis=axis, key=opq.operand_key(key, "fwd", side), signs=signs,
                            block=block)
  return out

