"""The Pallas quantizers under sharding: a partitioning rule, so XLA runs them per shard.

A `pallas_call` has no partitioning rule: inside `jit` on several devices XLA would gather a
sharded operand around it. `partitioned(kind, static, ...)` wraps a kernel op in
`jax.experimental.custom_partitioning`: when the operand is sharded along its leading axis (the
batch of an activation, FSDP's rows of a weight), each device quantizes its own rows, with the
same bits as the unsharded op:

* the per-tensor values (NVFP4's tensor amax, the key words) are computed before the op on the
  global array (XLA reduces across shards) and passed in `params`;
* stochastic rounding hashes each element's global flat index: a shard of the leading axis is a
  contiguous range of it, so the shard adds its first element's index (`FLAT_OFFSET`);
* blocks must not straddle shards: when the leading axis is itself blocked (the quantized axis,
  or a 16x16 tile's row axis), each shard's length must be a multiple of the block, else that axis
  is gathered.
Any other sharded axis is gathered first (XLA inserts the all-gather), so results never change.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lpjax import quant
  >>> x = jax.random.normal(jax.random.key(0), (8, 64))
  >>> y = jax.jit(lambda x: quant.fake_quant(x, "mxfp4", impl="pallas"))(x)
  >>> bool((y == quant.fake_quant(x, "mxfp4", impl="xla")).all())
  True
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

from lpjax.pallas import _kernels as kernels

U32 = jnp.uint32


def _names(entry) -> tuple[str, ...]:
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def _leading_spec(sharding, shape, blocked_leading: int | None):
  """The mesh axes that may keep sharding the leading axis (None: gather it)."""
  spec = getattr(sharding, "spec", None)
  if not spec or spec[0] is None:
    return None
  names = _names(spec[0])
  shards = math.prod(sharding.mesh.shape[n] for n in names)
  if shape[0] % shards:
    return None
  if blocked_leading and (shape[0] // shards) % blocked_leading:
    return None  # a block would straddle two shards
  return spec[0]


def _shard_index(mesh, names):
  idx = jnp.zeros((), U32)
  for n in names:
    idx = idx * U32(mesh.shape[n]) + jax.lax.axis_index(n).astype(U32)
  return idx


def use_partitioning() -> bool:
  """True when several devices could hold shards (then the kernels go through `partitioned`);
  False inside `shard_map` (the arrays are per-device already)."""
  if jax.device_count() == 1:
    return False
  return not getattr(jax.sharding.get_abstract_mesh(), "manual_axes", ())


@functools.lru_cache(maxsize=None)
def partitioned(op, static, ndim: int, n_out: int, blocked_leading: int | None):
  """`op(x, params, static) -> tuple of n_out arrays` (each of x's rank) as a partitioned op.

  Args:
    op: the kernel op on a whole (or per-shard) array, a module-level function; it must read the
      per-tensor values and the flat-index offset from `params` only.
    static: its hashable static arguments.
    ndim: x's rank.
    n_out: number of outputs.
    blocked_leading: the block length along x's leading axis if that axis is blocked, else None
      (then the outputs must still have x's leading length: fake quantization).
  """
  def run(x, params):
    return op(x, params, static)

  wrapped = custom_partitioning(run)

  def shardings(mesh, spec0):
    rest = [None] * (ndim - 1)
    return NamedSharding(mesh, P(spec0, *rest)), NamedSharding(mesh, P(None))

  def partition(mesh, arg_shapes, result_shape):
    x_shape = arg_shapes[0]
    spec0 = _leading_spec(x_shape.sharding, x_shape.shape, blocked_leading)
    x_sharding, params_sharding = shardings(mesh, spec0)
    local = math.prod(x_shape.shape) // (math.prod(mesh.shape[n] for n in _names(spec0)) or 1)

    def lower(x, params):
      if spec0 is not None:
        offset = _shard_index(mesh, _names(spec0)) * U32(local % 2**32)
        params = params.at[kernels.FLAT_OFFSET].add(offset)
      return run(x, params)

    return mesh, lower, (x_sharding,) * n_out, (x_sharding, params_sharding)

  def infer(mesh, arg_shapes, result_shape):
    x_shape = arg_shapes[0]
    spec0 = _leading_spec(x_shape.sharding, x_shape.shape, blocked_leading)
    return (shardings(mesh, spec0)[0],) * n_out

  # Outputs share x's leading axis (callers only partition ops whose outputs keep its length);
  # every other axis may differ in length (packed codes, scales) and is never sharded.
  factors = [f"d{i}" for i in range(ndim)]
  outs = [["d0"] + [f"o{k}_{i}" for i in range(1, ndim)] for k in range(n_out)]
  rule = f"{' '.join(factors)}, p -> " + ", ".join(" ".join(o) for o in outs)
  replicated = tuple(factors[1:]) + tuple(f for o in outs for f in o[1:])
  wrapped.def_partition(partition, infer_sharding_from_operands=infer, sharding_rule=rule,
                        need_replication_factors=replicated)
  return wrapped
