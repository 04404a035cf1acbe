"""Everything the interception reads of JAX's jaxprs, in one module: a JAX release breaks this file.

The interception is a jaxpr interpreter (`lpjax.quant.intercept.evaluator`): it reads primitive
names and parameters, which JAX changes between minor releases. Supported and tested: jax 0.10
(Python 3.11, the pinned stack) through 0.12 (Python 3.12+); tests/quant/test_jax_compat.py reads
a real jaxpr of every primitive below on whichever jax is installed. What changed, and where:

- `scan`: jax 0.10 gives `num_consts`, `num_carry` and a `ClosedJaxpr` body; jax 0.11 and 0.12
  give `ft_in` / `ft_out` (flat trees of the consts, carry and xs operands; of the carry and ys
  results) and an open `Jaxpr` body whose constants are operands (`scan_params`).
- `cond` branches, `while`'s cond and body, `jit`'s and `custom_jvp_call` / `custom_vjp_call`'s
  `call_jaxpr`: `ClosedJaxpr` on jax 0.10, an open `Jaxpr` from jax 0.11 (`Body` holds either).
- `closed_call` is named `eval_jaxpr` from jax 0.11 (`CALL_PRIMITIVES`).
- binding an equation: `get_bind_params` returned `(subfuns, params)` before jax 0.7 (`bind`).
- lpjax.pallas's FP4 GEMM partitioning rule reads an operand's HLO tiling as a PartitionSpec
  with jax's private `parse_flatten_op_sharding` (`spec_of_hlo_sharding`): lpjax's only
  `jax._src` import, here.

Each accessor reads a parameter by what is there, not by the version number, and a layout it
does not know is refused with the parameters it found (`UnsupportedJaxprError`).

Examples:
  >>> import jax, jax.numpy as jnp
  >>> def f(w, c, xs):
  ...   return jax.lax.scan(lambda c, x: (c @ w + x, c.sum()), c, xs)
  >>> jaxpr = jax.make_jaxpr(f)(jnp.ones((4, 4)), jnp.ones((4, 4)), jnp.ones((3, 4, 4))).jaxpr
  >>> s = scan_params(jaxpr.eqns[-1])
  >>> s.num_consts, s.num_carry, s.length, s.reverse, len(s.body.jaxpr.outvars)
  (1, 1, 3, False, 2)
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import jax
from jax._src import sharding_impls  # private: parse_flatten_op_sharding (jax 0.10-0.12)
from jax.extend import core as jcore

JAX_VERSION = tuple(int(p) for p in jax.__version__.split(".")[:3] if p.isdigit())
# The (major, minor) releases whose jaxprs tests/quant/test_jax_compat.py passes on: 0.10 (the
# pinned stack), 0.11 (a CUDA image's), 0.12 (the current stack).
SUPPORTED_JAX = ((0, 10), (0, 11), (0, 12))
# Primitives that call a jaxpr once, on their operands as given (`jax.jit` is "pjit" before
# jax 0.7; `closed_call` is "eval_jaxpr" from jax 0.11).
CALL_PRIMITIVES = ("jit", "pjit", "closed_call", "core_call", "eval_jaxpr")
# `jax.checkpoint` / `nn.remat` ("checkpoint" in old jax releases).
REMAT_PRIMITIVES = ("remat2", "checkpoint")
CUSTOM_CALL_PRIMITIVES = ("custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr")


class UnsupportedJaxprError(NotImplementedError):
  """A primitive's parameters in a layout this module does not know (a newer JAX)."""


def _unsupported(eqn, what: str) -> UnsupportedJaxprError:
  return UnsupportedJaxprError(
      f"lpjax cannot read {what} of a `{eqn.primitive.name}` equation on jax {jax.__version__}: "
      f"its parameters are {sorted(eqn.params)}. lpjax supports jax 0.10-0.12 "
      "(lpjax/quant/intercept/jax_compat.py); install a supported jax (requirements.txt or "
      "requirements-py312.txt) or report this layout.")


@dataclasses.dataclass(frozen=True)
class Body:
  """A nested jaxpr and the constants it closes over (none for the open jaxprs of jax 0.11+): what
  a `ClosedJaxpr` gives as `.jaxpr` and `.consts`."""

  jaxpr: Any  # a jax.extend.core.Jaxpr
  consts: tuple = ()  # values of jaxpr.constvars


def as_body(j) -> Body:
  """A `ClosedJaxpr` or an open `Jaxpr` (no constvars) as a `Body`."""
  if isinstance(j, jcore.ClosedJaxpr):
    return Body(j.jaxpr, tuple(j.consts))
  if isinstance(j, jcore.Jaxpr):
    if j.constvars:
      raise UnsupportedJaxprError(f"an open jaxpr with {len(j.constvars)} constvars and no values "
                                  f"for them (jax {jax.__version__})")
    return Body(j, ())
  raise UnsupportedJaxprError(f"expected a Jaxpr or ClosedJaxpr, got {type(j).__name__} "
                              f"(jax {jax.__version__})")


def inner_jaxprs(eqn) -> list:
  """Every jaxpr nested in `eqn`'s parameters (open `Jaxpr`s), in parameter order."""
  out = []
  for v in eqn.params.values():
    for j in (v if isinstance(v, (tuple, list)) else (v,)):
      if isinstance(j, jcore.ClosedJaxpr):
        out.append(j.jaxpr)
      elif isinstance(j, jcore.Jaxpr):
        out.append(j)
  return out


# -- control flow ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ScanParams:
  """What a `scan` equation runs: operands are consts, then carry, then xs; results are the
  carry, then the stacked ys; the body maps (consts, carry, x) to (carry, y)."""

  num_consts: int  # operands passed to every iteration as they are
  num_carry: int  # operands threaded through the iterations (and the first results)
  length: int  # number of iterations
  reverse: bool  # iterate from the last slice of xs to the first
  unroll: Any  # the unroll factor, passed on to lax.scan
  body: Body  # the loop body


def scan_params(eqn) -> ScanParams:
  """A `scan` equation's layout (`lax.scan`, `nn.scan`, `nnx.scan`)."""
  p = eqn.params
  if "num_consts" in p and "num_carry" in p:  # jax 0.10
    nc, ncarry = p["num_consts"], p["num_carry"]
  elif "ft_in" in p:  # jax 0.11+: a flat tree of the (consts, carry, xs) operands
    parts = p["ft_in"].unpack()
    if len(parts) != 3 or len(p["ft_in"]) != len(eqn.invars):
      raise _unsupported(eqn, "the (consts, carry, xs) split")
    nc, ncarry = len(parts[0]), len(parts[1])
  else:
    raise _unsupported(eqn, "the number of consts and carries")
  return ScanParams(num_consts=nc, num_carry=ncarry, length=p["length"], reverse=p["reverse"],
                    unroll=p.get("unroll", 1), body=as_body(p["jaxpr"]))


def cond_branches(eqn) -> tuple[Body, ...]:
  """A `cond` equation's branches (its first operand is the branch index, the rest the
  branches' operands)."""
  if "branches" not in eqn.params:
    raise _unsupported(eqn, "the branches")
  return tuple(as_body(b) for b in eqn.params["branches"])


@dataclasses.dataclass(frozen=True)
class WhileParams:
  """A `while` equation: operands are the cond's consts, the body's consts, then the carry."""

  cond_nconsts: int
  cond: Body  # (cond consts, carry) -> bool
  body_nconsts: int
  body: Body  # (body consts, carry) -> carry


def while_params(eqn) -> WhileParams:
  p = eqn.params
  try:
    return WhileParams(p["cond_nconsts"], as_body(p["cond_jaxpr"]), p["body_nconsts"],
                       as_body(p["body_jaxpr"]))
  except KeyError:
    raise _unsupported(eqn, "the cond and body") from None


# -- calls ----------------------------------------------------------------------------------------
def call_body(eqn) -> Body | None:
  """The jaxpr that a call primitive (`jax.jit`, `closed_call`) runs on its operands as given;
  None for any other primitive."""
  if eqn.primitive.name not in CALL_PRIMITIVES:
    return None
  j = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
  if j is None:
    raise _unsupported(eqn, "the called jaxpr")
  return as_body(j)


@dataclasses.dataclass(frozen=True)
class RematParams:
  """A `jax.checkpoint` (`nn.remat`) equation: its body runs on the operands as given."""

  body: Body
  prevent_cse: bool  # passed on to jax.checkpoint
  policy: Any  # the saveable policy, passed on to jax.checkpoint


def remat_params(eqn) -> RematParams | None:
  """The body and options of a `jax.checkpoint` equation; None for any other primitive."""
  p = eqn.params
  if eqn.primitive.name not in REMAT_PRIMITIVES and not ("prevent_cse" in p and "jaxpr" in p):
    return None
  if "jaxpr" not in p:
    raise _unsupported(eqn, "the rematerialized jaxpr")
  return RematParams(as_body(p["jaxpr"]), p.get("prevent_cse", True), p.get("policy"))


def custom_call_body(eqn) -> tuple[Body, int] | None:
  """(the primal function's jaxpr, its number of leading const operands) of a `custom_jvp` /
  `custom_vjp` call; None for any other primitive."""
  if eqn.primitive.name not in CUSTOM_CALL_PRIMITIVES:
    return None
  j = eqn.params.get("call_jaxpr", eqn.params.get("fun_jaxpr"))
  if j is None:
    raise _unsupported(eqn, "the primal function")
  return as_body(j), eqn.params.get("num_consts", 0)


def shard_map_body(eqn) -> Body | None:
  """The per-shard jaxpr of a `shard_map` equation; None for any other primitive."""
  if eqn.primitive.name != "shard_map":
    return None
  if "jaxpr" not in eqn.params:
    raise _unsupported(eqn, "the per-shard jaxpr")
  return as_body(eqn.params["jaxpr"])


# -- GEMMs ----------------------------------------------------------------------------------------
def dot_dimension_numbers(eqn):
  """A `dot_general`'s ((lhs contracting, rhs contracting), (lhs batch, rhs batch))."""
  (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
  return (tuple(lc), tuple(rc)), (tuple(lb), tuple(rb))


def preferred_element_type(eqn):
  """A GEMM's `preferred_element_type` (None: the operands' type)."""
  return eqn.params.get("preferred_element_type")


@dataclasses.dataclass(frozen=True)
class ConvParams:
  """A `conv_general_dilated`'s parameters, as `lax.conv_general_dilated` takes them."""

  window_strides: tuple
  padding: tuple
  lhs_dilation: tuple
  rhs_dilation: tuple
  dimension_numbers: Any  # a lax.ConvDimensionNumbers (lhs_spec, rhs_spec, out_spec), or None
  feature_group_count: int
  batch_group_count: int
  preferred_element_type: Any


def conv_params(eqn) -> ConvParams:
  p = eqn.params
  dn = p["dimension_numbers"]
  if dn is not None:
    dn = jax.lax.ConvDimensionNumbers(dn.lhs_spec, dn.rhs_spec, dn.out_spec)
  return ConvParams(p["window_strides"], p["padding"], p["lhs_dilation"], p["rhs_dilation"], dn,
                    p["feature_group_count"], p.get("batch_group_count", 1),
                    p.get("preferred_element_type"))


# -- equations ------------------------------------------------------------------------------------
def is_literal(v) -> bool:
  """A jaxpr operand that is a constant written into the equation (its value is `v.val`)."""
  return isinstance(v, jcore.Literal)


def name_stack(eqn) -> str:
  """The equation's name stack ("Model/layers_0/attn"), as a string."""
  return str(eqn.source_info.name_stack)


def bind(eqn, invals):
  """The equation as written (with its context: name scope, compute placement)."""
  params = eqn.primitive.get_bind_params(eqn.params)
  subfuns = []
  if isinstance(params, tuple):  # a call primitive, or JAX before 0.7: (subfuns, params)
    subfuns, params = params
  ctx = getattr(getattr(eqn, "ctx", None), "manager", None)
  with ctx if ctx is not None else contextlib.nullcontext():
    out = eqn.primitive.bind(*subfuns, *invals, **params)
  return list(out) if eqn.primitive.multiple_results else [out]


# -- sharding (lpjax.pallas's custom_partitioning rule) -------------------------------------------
def spec_of_hlo_sharding(sharding, mesh):
  """The PartitionSpec over `mesh` of a sharding that XLA chose (a GSPMDSharding, which holds
  only an HLO tiling; a NamedSharding's own spec first); None when there is none, or when the
  tiling spells no PartitionSpec of this mesh."""
  spec = getattr(sharding, "spec", None)
  if spec is not None:
    return spec
  hlo = getattr(sharding, "_hlo_sharding", None)
  if hlo is None or mesh.empty:
    return None
  try:
    return sharding_impls.parse_flatten_op_sharding(hlo, mesh)[0]
  # jax's IndivisibleError is a ValueError; a device order that no mesh axes spell (e.g. the
  # mesh's devices split by a slice of a larger sharded array) fails an assertion of jax's
  # `explode_superdims` or a NotImplementedError, depending on the order
  except (ValueError, AssertionError, NotImplementedError):
    return None
