"""Per-group values computed once: the XLA:CPU fusion workaround the codecs share.

XLA fuses cheap elementwise producers into each consumer and recomputes them there; for the
quantizers' per-group (and per-tensor) values that would repeat their work for every element, and
compile it again in every fusion that reads them.
"""

from __future__ import annotations

import jax.numpy as jnp

from lpjax.quant.numerics import fp32_bits as fb

U32 = jnp.uint32


def materialize(values, opaque_zero):
  """Returns uint32 per-group `values` unchanged, computed once per group instead of per element.

  XLA fuses cheap elementwise producers into the per-element consumer of a broadcast and recomputes
  them for every element (an optimization_barrier is gone by fusion time on XLA:CPU). Division is
  "expensive" to XLA's fusion heuristics and is never duplicated that way, so each value is divided
  by 1: a divisor derived from `opaque_zero` (0 at run time) so that it cannot be constant-folded.
  `opaque_zero` (from the function of that name) is per group too, never one element of the array:
  a scalar taken from element [0] of a sharded array made XLA all-gather the whole array to every
  device. For a per-tensor value it is a scalar from that tensor's own per-tensor bits.
  """
  one = U32(1) - opaque_zero.astype(U32)
  out = []
  for v in values:
    if v.dtype == jnp.float32:
      out.append(fb.from_bits(fb.to_bits(v) // one))
    elif v.dtype == jnp.bool_:
      out.append((v.astype(U32) // one) != 0)
    else:
      out.append(v.astype(U32) // one)
  return tuple(out)


def opaque_zero(group_bits):
  """0 per group at run time, opaque to XLA: the sign bit of uint32 bits known to be absolute
  values (amax bits) or bytes (scales); elementwise, so it stays on each device's shard."""
  return (group_bits.astype(U32) & U32(fb.ABS_MASK)) >> 31
