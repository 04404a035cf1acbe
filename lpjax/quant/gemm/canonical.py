"""A `dot_general`'s operands brought to the canonical GEMM form of `lpjax.quant.gemm.dot_general`.

Batch dims -> B, free dims -> M / N, contracting dims -> K, each group flattened in the order
given; malformed dimension numbers get a ValueError that names them.

Examples:
  >>> import jax.numpy as jnp
  >>> lhs3, rhs3, out_shape, batched = canonical(jnp.ones((2, 3, 4)), jnp.ones((4, 5)),
  ...                                            (((2,), (0,)), ((), ())))
  >>> lhs3.shape, rhs3.shape, out_shape, batched
  ((6, 4), (4, 5), (2, 3, 5), False)
"""

from __future__ import annotations

import math

import jax.numpy as jnp


def checked_dims(dimension_numbers, lhs_ndim: int, rhs_ndim: int):
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


def canonical(lhs, rhs, dimension_numbers):
  """(lhs3 (B?, M, K), rhs3 (B?, K, N), the dot_general output shape, whether there is a batch)."""
  lc, rc, lb, rb = checked_dims(dimension_numbers, lhs.ndim, rhs.ndim)
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
