"""What the interception's evaluator asks of one jaxpr equation: is it a GEMM, how long is its
contraction, is an operand an embedding table (a gathered or one-hot-multiplied input) or a weight
computed from parameters alone, and how to bind it as written. Pure functions of equations.
"""

from __future__ import annotations

import functools

# bind and inner_jaxprs are the evaluator's too (equations.bind, equations.inner_jaxprs)
from lpjax.quant.intercept.jax_compat import (  # noqa: F401
    bind, conv_params, dot_dimension_numbers, inner_jaxprs, is_literal)

GEMMS = ("dot_general", "conv_general_dilated")
# Ops that move or cast a weight without mixing it with anything: their result is still it.
LAYOUT_OPS = {"convert_element_type", "reshape", "transpose", "copy", "copy_p", "squeeze",
               "expand_dims", "sharding_constraint", "mesh_cast", "slice", "dynamic_slice",
               "reduce_precision"}

# Ops with n operands and n results, the i-th result being the i-th operand (moved or pinned).
PER_OPERAND_OPS = {"optimization_barrier", "device_put", "pvary", "pbroadcast"}

def computed_weight(eqn, weight_of, gemm_ok: bool = False):
  """A weight computed from parameters alone (weight normalisation, a LoRA product, a scale
  folded in): the operands are all parameters (or literals), and the result is named after the
  largest of them."""
  refs = [(v, weight_of(v)) for v in eqn.invars if not is_literal(v)]
  if not refs or any(w is None for _, w in refs) or (has_gemm(eqn) and not gemm_ok):
    return None
  return max(refs, key=lambda r: r[0].aval.size if hasattr(r[0].aval, "size") else 0)[1]


# QuEST (quartet's forward) scales each block of 32 by its RMS, zero padding included: a block
# that holds fewer than this many values of the contraction is clipped to a fraction of itself
# (K = 1: output ~0, gradient 0; K = 2: relative error 0.5).
QUEST_MIN_BLOCK_VALUES = 4


def contraction_length(eqn) -> int:
  """K, the number of products summed into one output: the contracting dims of a dot_general;
  for a convolution, input features per group times the kernel window."""
  if eqn.primitive.name == "dot_general":
    (lc, _), _ = dot_dimension_numbers(eqn)
    shape = eqn.invars[0].aval.shape
    k = 1
    for d in lc:
      k *= shape[d]
    return k
  rhs = eqn.invars[1].aval.shape
  dn = conv_params(eqn).dimension_numbers
  out_dim = dn.rhs_spec[0] if dn is not None else 0
  k = 1
  for d, n in enumerate(rhs):
    if d != out_dim:
      k *= n
  return k


def short_contraction(eqn, recipe, lhs, rhs) -> str:
  """Why `recipe` cannot quantize this GEMM's contraction, or "" (then it runs quantized).

  Measured for every preset at K = 1, 2, 3, 7, 16, 31, 33 (tests/quant/test_intercept_short_k.py):
  the block-scaled recipes (amax scales, zero padding) hold their error level at every K; QuEST's
  RMS scale does not when a block of the contraction holds fewer than QUEST_MIN_BLOCK_VALUES
  values (K = 1, 2, 3, 33, 34, 35, ...)."""
  fwd = recipe.fwd
  quest = [op for op in fwd.operands() if op is not None and getattr(op, "scheme", None) == "quest"]
  if not quest:
    return ""
  k = contraction_length(eqn)
  block = quest[0].format.block_size
  tail = k % block
  if k < block and k < QUEST_MIN_BLOCK_VALUES or 0 < tail < QUEST_MIN_BLOCK_VALUES:
    held = k if k < block else tail
    return (f"contraction K={k} leaves a block of {held} value(s) in {recipe.name or 'the'}'s "
            f"{block}-blocks (fewer than {QUEST_MIN_BLOCK_VALUES}): QuEST's RMS scale would clip it")
  return ""


def one_hot_results(eqn, marks: dict) -> list[int]:
  """Positions of `eqn`'s results that are one-hot rows: the result of a comparison (`eq`) cast
  to a float and moved by layout ops, here or inside a nested function without GEMMs
  (`jax.nn.one_hot`'s jit). `marks`: {var: "eq" or "one_hot"} so far."""
  name = eqn.primitive.name
  first = eqn.invars[0] if eqn.invars and not is_literal(eqn.invars[0]) else None
  if name == "eq":
    for v in eqn.outvars:
      marks[v] = "eq"
    return []
  if name == "convert_element_type" and first is not None and first in marks:
    return [0]
  if name in LAYOUT_OPS and first is not None and marks.get(first) == "one_hot":
    return [0]
  found = []
  for sub in inner_jaxprs(eqn):
    if len(sub.outvars) == len(eqn.outvars) and not jaxpr_has_gemm(sub):
      inner: dict = {}
      for e in sub.eqns:
        for i in one_hot_results(e, inner):
          inner[e.outvars[i]] = "one_hot"
      found += [i for i, v in enumerate(sub.outvars) if inner.get(v) == "one_hot"]
  return found


def gathered_inputs(jaxpr) -> set[int]:
  """Positions of `jaxpr`'s inputs that a gather reads rows of, through layout ops and nested
  functions."""
  origin = {v: i for i, v in enumerate(jaxpr.invars)}
  found = set()
  for eqn in jaxpr.eqns:
    ins = [origin.get(v) if not is_literal(v) else None for v in eqn.invars]
    if eqn.primitive.name == "gather" and ins and ins[0] is not None:
      found.add(ins[0])
    elif eqn.primitive.name in LAYOUT_OPS and ins and ins[0] is not None:
      for v in eqn.outvars:
        origin[v] = ins[0]
    else:
      for sub in inner_jaxprs(eqn):
        if len(sub.invars) == len(ins):
          found.update(ins[i] for i in gathered_inputs(sub) if ins[i] is not None)
  return found


def has_gemm(eqn) -> bool:
  return any(jaxpr_has_gemm(j) for j in inner_jaxprs(eqn))


@functools.lru_cache(maxsize=4096)
def _jaxpr_has_gemm_cached(jaxpr) -> bool:
  return any(e.primitive.name in GEMMS or has_gemm(e) for e in jaxpr.eqns)


def jaxpr_has_gemm(jaxpr) -> bool:
  try:
    return _jaxpr_has_gemm_cached(jaxpr)
  except TypeError:  # unhashable
    return any(e.primitive.name in GEMMS or has_gemm(e) for e in jaxpr.eqns)


def is_activation_site(path: str) -> bool:
  """A site path of a product of two activations (`lpjax.quant.intercept.roles` names them)."""
  return path.rpartition("/")[2] in ("attn_scores", "attn_values", "act_product")

