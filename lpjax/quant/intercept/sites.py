"""The GEMM call sites that the interception finds: what each one is, and the report of a trace.

A call site is one `dot_general` or `conv_general_dilated` of the traced function (`jnp.dot`,
`@`, `jnp.einsum`, `jnp.matmul` and every Flax layer lower to these). Its path is the module
path that the policy matches: the weight's parameter path without the leaf name ("layers/0/mlp/
up_proj/kernel" -> "layers/0/mlp/up_proj") when one operand is a weight; for a product of two
activations, the enclosing named scope (Flax linen's module path) or else the longest common
module path of the weight GEMMs that feed it, followed by what the product is
(`lpjax.quant.intercept.roles`): "attn_scores" for attention's score product (one whose result
reaches another product of two activations through a softmax's exp), "attn_values" for the
product that consumes it, "act_product" for any other (an MoE's dispatch or combine): the
attention rules of `QuantPolicy`, docs/numerics.md §7. Parameter paths are named by
`lpjax.quant.policy.param_path` (no linen "params" collection, no NNX value attribute), and a
raw linen `m.apply`'s class name is left out of scopes: a layer has one path whichever way it is
reached (`quantized` on a loss, `quantize_model`, a factory model in the trainer).

A report lists the rules of the traced policies that match no site (`unmatched_rules`;
`check_rules()` raises on them), each with the nearest site paths.

Examples:
  >>> s = Site(path="layers/0/mlp/up", op="dot_general", lhs_shape=(8, 64), rhs_shape=(64, 128),
  ...          weight="rhs", weight_path="layers/0/mlp/up/kernel", block="0", recipe="mxfp4",
  ...          status="quantized")
  >>> print(Report((s,)))   # doctest: +NORMALIZE_WHITESPACE
  path             op           lhs      rhs       weight  block  recipe  status
  layers/0/mlp/up  dot_general  (8, 64)  (64, 128)  rhs    0      mxfp4   quantized
  1 GEMM call sites: 1 quantized, 0 high precision, 0 unchanged
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

from lpjax.quant.intercept import rule_check

QUANTIZED, HIGH_PRECISION, UNCHANGED = "quantized", "high precision", "unchanged"
# Leaf names a weight carries in Flax / Haiku / Equinox / plain pytrees ("layers/0/up/kernel").
_LEAF_NAMES = ("kernel", "weight", "w", "embedding", "scale", "bias", "b")


@dataclasses.dataclass(frozen=True)
class Site:
  """One GEMM call site of a traced function and what the interception did with it."""

  path: str  # the module path the policy matched (see the module docstring)
  op: str  # "dot_general" or "conv_general_dilated"
  lhs_shape: tuple  # shapes of the operands as the function passed them
  rhs_shape: tuple
  weight: str  # which operand is a parameter: "rhs", "lhs", "none" (two activations), "both"
  weight_path: str | None  # the parameter's full path, when there is one
  block: str  # block index: "3", "scan" (the iteration of a scan over stacked layers), "" (none)
  recipe: str  # the recipe that ran (the policy's), or "" when the original op ran
  status: str  # QUANTIZED, HIGH_PRECISION (a high-precision recipe ran) or UNCHANGED
  reason: str = ""  # why a site kept its original op, or why the policy kept it high precision


@dataclasses.dataclass(frozen=True)
class Report:
  """Every GEMM call site of one traced call, in program order (`lpjax.quant.report`)."""

  sites: tuple[Site, ...]
  rules: tuple = ()  # (regex, recipe) of the traced policies' rules, checked against the sites

  @property
  def unmatched_rules(self) -> tuple:
    """The rules that match no site's path: they change nothing (a typo, a block of a scanned
    stack, a parameter's name for its layer's; `check_rules` says which)."""
    return rule_check.unmatched(self.rules, self.sites)

  def check_rules(self) -> "Report":
    """This report; ValueError naming each rule that matches no site, with the nearest paths."""
    missed = self.unmatched_rules
    if missed:
      raise ValueError("QuantPolicy rule(s) that match no GEMM call site, so they change "
                       "nothing: " + " | ".join(f"{r[0]!r}: {rule_check.explain(r[0], self.sites)}"
                                                for r in missed) + ".")
    return self

  def by_status(self, status: str) -> tuple[Site, ...]:
    return tuple(s for s in self.sites if s.status == status)

  @property
  def quantized(self) -> tuple[Site, ...]:
    return self.by_status(QUANTIZED)

  @property
  def unchanged(self) -> tuple[Site, ...]:
    return self.by_status(UNCHANGED)

  def __str__(self) -> str:
    head = ("path", "op", "lhs", "rhs", "weight", "block", "recipe", "status")
    rows = [head] + [(s.path, s.op, str(s.lhs_shape), str(s.rhs_shape), s.weight, s.block,
                      s.recipe, s.status + (f" ({s.reason})" if s.reason else ""))
                     for s in self.sites]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    n = {st: len(self.by_status(st)) for st in (QUANTIZED, HIGH_PRECISION, UNCHANGED)}
    lines.append(f"{len(self.sites)} GEMM call sites: {n[QUANTIZED]} quantized, "
                 f"{n[HIGH_PRECISION]} high precision, {n[UNCHANGED]} unchanged")
    for regex, recipe in self.unmatched_rules:
      lines.append(f"rule {regex!r} -> {recipe} matches no site ("
                   f"{rule_check.explain(regex, self.sites)})")
    return "\n".join(line.rstrip() for line in lines)

  def _repr_pretty_(self, p, cycle):  # IPython / notebooks print the table
    p.text(str(self))


def module_path(weight_path: str) -> str:
  """A parameter's path -> the path of the layer that owns it: a conventional leaf name
  ("kernel", "weight", "w", ...) is dropped, any other name is the site's own ("attn/wq").

  Examples:
    >>> module_path("layers/0/mlp/up/kernel"), module_path("attn/wq"), module_path("lora/lora_a")
    ('layers/0/mlp/up', 'attn/wq', 'lora/lora_a')
  """
  head, _, leaf = weight_path.rpartition("/")
  return head if head and leaf in _LEAF_NAMES else weight_path


def common_path(paths: Sequence[str]) -> str:
  """The longest common module path of `paths` ("a/b/q", "a/b/k" -> "a/b")."""
  if not paths:
    return ""
  parts = [p.split("/") for p in paths]
  prefix = os.path.commonprefix(parts)
  if len(paths) == 1:  # one feeding layer: its parent is the scope
    prefix = prefix[:-1]
  return "/".join(prefix)


def scope_of_name_stack(name_stack: str, root: str = "") -> str:
  """A JAX name stack -> a module path. Transform markers ("jvp(...)", "transpose(...)") are
  unwrapped; jitted functions' names, `jnp.einsum`'s own scope ("bqhd,bkhd->bhqk") and lifted
  lambdas ("layers.<lambda>") are dropped; `root` (a linen model's class name, the first scope
  of its name stack) is dropped too. A scope repeated at once is one module whose method calls
  another of its methods (linen's `SelfAttention.__call__` calls its parent class's): it is
  named once.

  Examples:
    >>> scope_of_name_stack("jvp(Model)/layers_0/attn/bqhd,bkhd->bhqk", root="Model")
    'layers_0/attn'
    >>> scope_of_name_stack("block/jit(helper)/attn")
    'block/attn'
    >>> scope_of_name_stack("M/SelfAttention_0/SelfAttention_0/...hqk,...khd->...qhd", root="M")
    'SelfAttention_0'
  """
  parts = []
  for part in str(name_stack).split("/"):
    if part.startswith(("jit(", "pjit(")) or "->" in part or "<" in part:
      continue
    while "(" in part and part.endswith(")"):
      part = part[part.index("(") + 1:-1]
    if part and not (parts and parts[-1] == part):
      parts.append(part)
  head = root.split("/") if root else []
  if head and parts[:len(head)] == head:
    parts = parts[len(head):]
  return "/".join(parts)


def scope_root_of(name_stack: str, site_path: str) -> str:
  """The scopes that a weight GEMM's name stack holds above its layer's path (a linen model's
  class name when a loss calls its raw `m.apply`): what activation products' scopes leave out,
  so that they are named as the layers are. "" when the name stack does not end with the path.

  Examples:
    >>> scope_root_of("jvp(Model)/layers_0/up", "layers_0/up"), scope_root_of("up", "up")
    ('Model', '')
  """
  parts, own = scope_of_name_stack(name_stack).split("/"), site_path.split("/")
  if len(parts) > len(own) and parts[-len(own):] == own:
    return "/".join(parts[:-len(own)])
  return ""
