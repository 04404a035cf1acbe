"""The quantized call that replaces one intercepted GEMM equation (`lpjax.quant.intercept.entry_points`).

A `dot_general` runs as `lpjax.quant.dot_general` with the weight as the recipe's W (rhs),
whatever side it was on; two activations run in the order whose canonical GEMM needs no
transpose; a `conv_general_dilated` runs as `lpjax.quant.conv_general_dilated`.
"""

from __future__ import annotations

import jax.numpy as jnp

from lpjax.quant.gemm.conv import conv_general_dilated
from lpjax.quant.gemm.dot_general import dot_general
from lpjax.quant.intercept import jax_compat
from lpjax.quant.recipes.gemm_recipe import GemmRecipe


def is_identity(recipe: GemmRecipe, lhs, rhs, pet) -> bool:
  """A high-precision recipe under which the site runs its original op: one that feeds the
  operands as given, or an fp32 recipe on operands of at most 32 bits (fp32, bf16, fp16): "fp32"
  means the model's own GEMM, bit for bit, never a cast of a narrower model up to fp32."""
  if not recipe.is_high_precision:
    return False
  dt = recipe.compute_dtype
  return dt is None or (dt == jnp.float32 and all(
      jnp.issubdtype(x.dtype, jnp.floating) and x.dtype.itemsize <= 4 for x in (lhs, rhs)))


def _natural(x, contracting, batch, first: bool) -> bool:
  """True when `x`'s contracting dims come right after its batch dims (first=True: the rhs of a
  row-major GEMM) or last (False: the lhs), so that the canonical GEMM needs no transpose."""
  free = [d for d in range(x.ndim) if d not in batch]
  k = len(contracting)
  return list(contracting) == (free[:k] if first else free[len(free) - k:])


def quantized_dot(eqn, lhs, rhs, weight: str, recipe, key, rhs_axes):
  (lc, rc), (lb, rb) = jax_compat.dot_dimension_numbers(eqn)
  pet = jax_compat.preferred_element_type(eqn)
  if weight == "none":
    # Two activations: `jnp.einsum` may have put them in either order. Run them in the order
    # whose canonical GEMM needs no transposes (probabilities x values, not values x
    # probabilities): the order lpjax's own layers use, same bits and no transposed copy.
    as_is = _natural(lhs, lc, lb, False) + _natural(rhs, rc, rb, True)
    swapped = _natural(rhs, rc, rb, False) + _natural(lhs, lc, lb, True)
    weight = "lhs" if swapped > as_is else "none"
  if weight != "lhs":
    axes = rhs_axes if _plain_weight(rhs, rc, rb) else None
    return dot_general(lhs, rhs, ((lc, rc), (lb, rb)), recipe, key=key,
                       preferred_element_type=pet, rhs_axes=axes)
  # the weight (or the operand swapped in above) is the lhs: run it as the recipe's rhs, then
  # restore lax's (batch, lhs, rhs) order
  axes = rhs_axes if (rhs_axes is not None and _plain_weight(lhs, lc, lb)) else None
  y = dot_general(rhs, lhs, ((rc, lc), (rb, lb)), recipe, key=key, preferred_element_type=pet,
                  rhs_axes=axes)
  nb, n_act = len(lb), rhs.ndim - len(rc) - len(rb)
  n_w = lhs.ndim - len(lc) - len(lb)
  perm = list(range(nb)) + [nb + n_act + i for i in range(n_w)] + [nb + i for i in range(n_act)]
  return jnp.transpose(y, perm)


def _plain_weight(w, contracting, batch) -> bool:
  """A 2-D weight contracted on its first axis: the layout the FP4 weight gather takes."""
  return w.ndim == 2 and not batch and tuple(contracting) == (0,)


def quantized_conv(eqn, lhs, rhs, recipe, key):
  p = jax_compat.conv_params(eqn)
  return conv_general_dilated(lhs, rhs, p.window_strides, p.padding, p.lhs_dilation,
                              p.rhs_dilation, p.dimension_numbers, p.feature_group_count,
                              recipe=recipe, key=key,
                              preferred_element_type=p.preferred_element_type)
