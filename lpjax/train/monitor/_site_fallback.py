"""Per-site fallback (`monitor.fallback=True`): a site's forward or backward GEMMs switch to
`monitor.fallback_recipe` after `monitor.fallback_after` failing measurements in a row.

A switch is a rule `^<path>$` -> a composite GemmRecipe added to the run's low-phase QuantPolicy
(the warm-up, finish and loss-driven fallback phases replace the recipe with `with_recipe`, which
drops rules, so they stay as they are). A forward switch replaces the recipe's `fwd` GEMM, a
backward switch its `dgrad` and `wgrad` GEMMs; a site may have both. The blocks of a scanned stack
share one policy path, so a switch applies to every block of that path. The switches are host
state (a list of dicts), saved in the checkpoint's meta: a resumed run rebuilds the same policy.

Examples:
  >>> from lpjax.quant import QuantPolicy, recipes
  >>> r = composite(recipes.get("mxfp4"), recipes.get("bf16"), ("bwd",))
  >>> r.name, r.fwd == recipes.get("mxfp4").fwd, r.wgrad.lhs is None, r.is_high_precision
  ('mxfp4+bwd:bf16', True, True, False)
  >>> p = with_switches(QuantPolicy(recipe="mxfp4"), [dict(path="layers/mlp/up_proj", **{
  ...     "pass": "fwd"}, step=3, recipe="bf16")])
  >>> p.recipe_for("layers/mlp/up_proj").name, p.recipe_for("layers/mlp/down_proj").name
  ('mxfp4+fwd:bf16', 'mxfp4')
"""

from __future__ import annotations

import dataclasses
import functools
import re

from lpjax.quant import QuantPolicy, recipes
from lpjax.quant.recipes.gemm_recipe import REUSE_FWD, GemmQuant, GemmRecipe, OperandQuant

PASSES = ("fwd", "bwd")  # the two things that fall back separately
PASS_GEMMS = {"fwd": ("fwd",), "bwd": ("dgrad", "wgrad")}


def _standalone(gemm: GemmQuant, fwd: GemmQuant) -> GemmQuant:
  """A backward GEMM that no longer leans on the forward's quantized operands: REUSE_FWD becomes
  the forward's own quantizer, from_fwd an ordinary quantization of the operand."""

  def fix(op, fwd_op):
    if op == REUSE_FWD:
      return fwd_op
    if isinstance(op, OperandQuant) and op.from_fwd:
      return dataclasses.replace(op, from_fwd=False)
    return op

  return GemmQuant(lhs=fix(gemm.lhs, fwd.lhs), rhs=fix(gemm.rhs, fwd.rhs))


@functools.lru_cache(maxsize=None)
def composite(own: GemmRecipe, fallback: GemmRecipe, passes: tuple) -> GemmRecipe:
  """`own` with the GEMMs of `passes` ("fwd" and/or "bwd") taken from `fallback`; named
  "<own>+<pass>:<fallback>". The operands still run in `own`'s compute dtype (bfloat16 for
  lpjax's FP4 presets), so a "bf16" fallback is exactly a bfloat16 GEMM there. Hashable."""
  fields = {}
  if "fwd" in passes:
    fields["fwd"] = fallback.fwd
    # the backward GEMMs may reuse the forward's quantized operands: they now quantize their own
    fields["dgrad"] = _standalone(own.dgrad, own.fwd)
    fields["wgrad"] = _standalone(own.wgrad, own.fwd)
  if "bwd" in passes:
    fields["dgrad"] = _standalone(fallback.dgrad, fallback.fwd)
    fields["wgrad"] = _standalone(fallback.wgrad, fallback.fwd)
  name = own.name or "recipe"
  name += "".join(f"+{p}:{fallback.name or 'fallback'}" for p in PASSES if p in passes)
  return dataclasses.replace(own, name=name, **fields)


def rule_pattern(path: str) -> str:
  """The QuantPolicy rule regex of exactly one policy path."""
  return "^" + re.escape(path) + "$"


def with_switches(base: QuantPolicy, switches: list) -> QuantPolicy:
  """`base` with one rule per switched path (its passes from the switches' recipes), ahead of
  base's own rules. `switches`: [{"path", "pass", "recipe", ...}] in the order they happened."""
  if not switches:
    return base
  by_path = {}
  for s in switches:
    by_path.setdefault(s["path"], {})[s["pass"]] = s["recipe"]
  rules = []
  for path, passes in by_path.items():
    recipe = recipes.get(next((r for pat, r in base.rules if re.search(pat, path)), base.recipe))
    for p in PASSES:  # one fallback recipe per pass (the config's, recorded in the switch)
      if p in passes:
        recipe = composite(recipe, recipes.get(passes[p]), (p,))
    rules.append((rule_pattern(path), recipe))
  return dataclasses.replace(base, rules=tuple(rules) + tuple(base.rules))
