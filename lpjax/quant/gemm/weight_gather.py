"""FP4 weight all-gather: a sharded weight is quantized on its shards and gathered as codes + scales.

Under FSDP every device holds a slice of each weight, and XLA all-gathers the whole weight before a
GEMM. A quantized GEMM only multiplies the weight's quantization, so gathering the high-precision
values is wasted bandwidth: MXFP4 codes and E8M0 scales are 4.25 bits per element against bf16's
16. Within `weight_sharding(resolver)`, a GEMM given the logical axes of its weight
(`dot_general(..., rhs_axes=...)`, `lpjax.nn.QDense(kernel_axes=...)`) quantizes the weight
where it lies, pins the packed codes and block scales to the weight's own sharding, and then to
the gathered layout, so the all-gather moves bytes of codes. The values are bit-identical to
gathering first and quantizing after: the program computes the same function (only where each
piece runs changes), blocks never straddle shards when a shard's length along the blocked axis
is a multiple of the block (otherwise the resolver leaves that axis replicated and XLA gathers
first), and NVFP4's tensor amax is a max over the whole weight, which XLA computes as an
all-reduce of the shards' maxima. Formats without packed codes (SSP, the NVFP4 schemes) keep
XLA's own choice.

The resolver maps (logical_axes, shape, gathered) to a `jax.sharding.Sharding` or None (leave
the array to XLA): the trainer's (`lpjax.train.step._sharding.weight_resolver`) gives the parameter's
sharding, and with gathered=True the same without the FSDP mesh axes. It is also asked where a 2-D
activation operand's quantization lives, with axes ("batch", None) or (None, "batch") (rows =
tokens), so that blocks along the token axis are quantized where the rows are.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lpjax.quant import dot_general
  >>> seen = []
  >>> def resolver(axes, shape, gathered):
  ...   seen.append((axes, shape, gathered))
  ...   return None  # leave the layout to XLA
  >>> x, w = jnp.ones((4, 64)), jnp.ones((64, 8))
  >>> with weight_sharding(resolver):
  ...   y = dot_general(x, w, (((1,), (0,)), ((), ())), "mxfp4_naive", rhs_axes=("embed", "mlp"))
  >>> seen[:2]  # the forward's W^T (N, K), then X (M, K) with its rows over the batch
  [(('mlp', 'embed'), (8, 64), False), (('batch', None), (4, 64), False)]
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Optional, Sequence

import jax

from lpjax.quant.gemm import operand as opq
from lpjax.quant.recipes.gemm_recipe import OperandQuant
from lpjax.quant.codec.qarray import QArray

# resolver(logical_axes, shape, gathered) -> a jax.sharding.Sharding, or None to leave it alone
WeightResolver = Callable[[Sequence[Optional[str]], tuple, bool], Optional[jax.sharding.Sharding]]

_RESOLVER: contextvars.ContextVar[Optional[WeightResolver]] = contextvars.ContextVar(
    "lpjax_weight_sharding", default=None)


@contextlib.contextmanager
def weight_sharding(resolver: Optional[WeightResolver]):
  """Within the block, GEMMs given their weight's logical axes gather it quantized (None: off)."""
  token = _RESOLVER.set(resolver)
  try:
    yield
  finally:
    _RESOLVER.reset(token)


def active(axes, shape, fmt, rotation_block: int | None = None) -> bool:
  """True when an operand of `shape` with logical axes `axes` (None: unknown), quantized along
  its last axis in `fmt` (None: not quantized) after an RHT of `rotation_block`, is to be pinned
  to its shards: a resolver is set and no shard splits a block (or an RHT group). Where one
  would, the layout is left to XLA (pinning never changes values, only where they are computed).
  """
  resolver = _RESOLVER.get()
  if axes is None or resolver is None or (fmt is not None and fmt.granularity != "block"):
    return False
  sharding = resolver(tuple(axes), tuple(shape), False)
  if sharding is None:
    return False
  extent = [1] * len(shape)
  extent[-1] = max(fmt.block_size if fmt is not None else 1, rotation_block or 1)
  if fmt is not None and fmt.tile:
    extent[-2] = fmt.block_size
  local = sharding.shard_shape(tuple(shape))
  return all(n == g or n % e == 0 for n, g, e in zip(local, shape, extent))


def _pin(a, axes, gathered: bool):
  """`a` constrained to the resolver's layout for these axes (left alone where it gives none)."""
  if a is None or a.ndim != len(axes):
    return a
  sharding = _RESOLVER.get()(tuple(axes), tuple(a.shape), gathered)
  return a if sharding is None else jax.lax.with_sharding_constraint(a, sharding)


def pin(y, axes, *, gathered: bool):
  """Values or a QArray with logical axes `axes` pinned to their sharding (or gathered layout)."""
  if isinstance(y, QArray):
    return pin_qarray(y, axes, gathered=gathered)
  return y if (_RESOLVER.get() is None or axes is None) else _pin(y, axes, gathered)


def gather_weight(w, axes):
  """Weight `w` with logical axes `axes`, all-gathered here under `weight_sharding` (unchanged
  without a resolver, or where it gives no layout).

  For code that slices a high-precision weight inside a loop (the vocabulary-chunked LM head):
  gathered once before the loop, its slices need no gather of their own; sliced first, every
  iteration would gather its slice again, and again in a rematerialized backward pass.

  Examples:
    >>> import jax.numpy as jnp
    >>> w = jnp.ones((4, 6))
    >>> gather_weight(w, ("embed", "vocab")) is w  # no weight_sharding: nothing to gather
    True
  """
  return pin(w, axes, gathered=True)


def pin_qarray(q, axes, *, gathered: bool):
  """The codes and block scales of QArray `q` (a weight with logical axes `axes`) pinned to the
  weight's sharding (gathered=False) or to its gathered layout; other values pass through."""
  if not isinstance(q, QArray) or _RESOLVER.get() is None or axes is None:
    return q
  return QArray(codes=_pin(q.codes, axes, gathered), scales=_pin(q.scales, axes, gathered),
                tensor_scale=q.tensor_scale, zeros=_pin(q.zeros, axes, gathered), fmt=q.fmt,
                shape=q.shape, axis=q.axis, dtype=q.dtype)


def fake_gathered(x, op: OperandQuant, axes, *, dtype, **kw):
  """`opq.fake(x, op, dtype=dtype, **kw)` with the packed codes gathered instead of the values.

  x is a weight operand with logical axes `axes` (in x's own layout). Returns None where the
  quantizer has no packed form (SSP, schemes): the caller then uses `opq.fake`.
  """
  if op is None or op.is_ssp or op.scheme:  # nothing packed to gather
    return None
  q = pin_qarray(opq.pack(x, op, **kw), axes, gathered=False)
  return opq.unpack(pin_qarray(q, axes, gathered=True), op, dtype)
