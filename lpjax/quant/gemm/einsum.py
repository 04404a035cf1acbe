"""Two-operand einsum through the quantized `dot_general` (attention products, projections).

Examples:
  >>> import jax.numpy as jnp
  >>> q, k = jnp.ones((2, 4, 8, 32)), jnp.ones((2, 4, 8, 32))
  >>> einsum("bhqd,bhkd->bhqk", q, k, recipe="mxfp4_naive").shape
  (2, 4, 8, 8)
"""

from __future__ import annotations

import jax.numpy as jnp

from lpjax.quant.gemm.dot_general import dot_general, operand_stats


def parse_einsum(subscripts: str, lhs_ndim: int, rhs_ndim: int):
  if not isinstance(subscripts, str):
    raise TypeError(f"einsum subscripts must be a string like 'bd,df->bf', got {subscripts!r}.")
  spec = subscripts.replace(" ", "")
  bad = sorted(set(c for c in spec.replace("->", "").replace("...", "")
                   if not (c.isalpha() or c == ",")))
  if spec.count("->") > 1 or bad:
    raise ValueError(f"einsum {subscripts!r} is malformed: write 'lhs,rhs->out' with letters for "
                     f"indices (and '...'), e.g. 'bd,df->bf'" +
                     (f"; unexpected {', '.join(map(repr, bad))}." if bad else "."))
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
  stray = sorted(set(out) - set(a) - set(b))
  if stray or len(set(out)) != len(out):
    raise ValueError(f"einsum {subscripts!r}: every output index must appear once and in an "
                     f"operand" + (f"; {', '.join(map(repr, stray))} is in neither." if stray else "."))
  for t, nd in ((a, lhs_ndim), (b, rhs_ndim)):
    if len(t) != nd:
      raise ValueError(f"einsum {subscripts!r}: term {t!r} does not match an operand of rank {nd}.")
    if len(set(t)) != len(t):
      raise NotImplementedError(f"einsum {subscripts!r}: repeated indices within an operand (diagonals).")
  return a, b, out


def _dimension_numbers(a: str, b: str, out: str):
  """(batch indices, dot_general dimension numbers) of the index strings of lhs, rhs, output."""
  batch = [c for c in a if c in b and c in out]
  contract = [c for c in a if c in b and c not in out]
  dims = ((tuple(a.index(c) for c in contract), tuple(b.index(c) for c in contract)),
          (tuple(a.index(c) for c in batch), tuple(b.index(c) for c in batch)))
  return batch, dims


def einsum(subscripts: str, *operands, recipe, key=None, preferred_element_type=None):
  """Two-operand `jnp.einsum` through `dot_general` with `recipe` (the first operand is the lhs).

  Indices in both operands and the output are batch dims, in both operands only contracted,
  in one operand and the output free; an index in one operand only and not in the output is summed
  first (in high precision). Supports '...' but not repeated indices within an operand.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> q, k = jnp.ones((2, 4, 8, 32)), jnp.ones((2, 4, 8, 32))
    >>> jax.jit(lambda q, k: einsum("bhqd,bhkd->bhqk", q, k, recipe="mxfp4_naive"))(q, k).shape
    (2, 4, 8, 8)
  """
  if len(operands) != 2:
    raise ValueError(f"einsum takes exactly two operands, got {len(operands)}.")
  lhs, rhs = (jnp.asarray(o) for o in operands)
  a, b, out = parse_einsum(subscripts, lhs.ndim, rhs.ndim)
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
  batch, dims = _dimension_numbers(a, b, out)
  y = dot_general(lhs, rhs, dims, recipe, key=key, preferred_element_type=preferred_element_type)
  got = batch + [c for c in a if c not in b] + [c for c in b if c not in a]
  if sorted(got) != sorted(out):
    raise ValueError(f"einsum {subscripts!r}: output indices {out!r} do not match the operands.")
  return jnp.transpose(y, tuple(got.index(c) for c in out)) if got != list(out) else y


def einsum_operand_stats(subscripts: str, lhs, rhs, recipe, *, key=None):
  """`operand_stats` of the forward GEMM of `einsum(subscripts, lhs, rhs, recipe=recipe)`."""
  _, dims = _dimension_numbers(*parse_einsum(subscripts, lhs.ndim, rhs.ndim))
  return operand_stats(lhs, rhs, dims, recipe, key=key)
