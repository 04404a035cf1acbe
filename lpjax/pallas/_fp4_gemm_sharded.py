"""The FP4 GEMM kernel under sharding: a partitioning rule, so each device multiplies its own tiles.

A `pallas_call` has no partitioning rule: on several devices XLA would gather both operands and
run the whole GEMM everywhere. `partitioned(op, static)` wraps the kernel GEMM
(`_fp4_gemm.local_matmul`: lhs codes and scales (B, M, ...), rhs (B, N, ...), out (B, M, N)) in
`custom_partitioning`: the output keeps the batch and M sharding of the lhs (the activation's
rows over data / fsdp) and the N sharding of the rhs (a weight split over its output features);
K (the codes' bytes and the scale blocks) is never split, so every block pair is multiplied where
both of its operands lie, and each output element is the same block-order sum as on one device:
the result is bit-identical. A mesh axis used twice (M and N on one axis) keeps the first use.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lpjax import pallas, quant
  >>> a = quant.quantize(jax.random.normal(jax.random.key(0), (16, 64)), "mxfp4")
  >>> y = jax.jit(pallas.fp4_matmul)(a, a)   # one device here: the plain kernel
  >>> y.shape
  (16, 16)
"""

from __future__ import annotations

import functools

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

from lpjax.quant.intercept import jax_compat  # an HLO tiling -> PartitionSpec (jax internals)


def use_partitioning() -> bool:
  """Several devices and not inside `shard_map` (whose arrays are per-device already)."""
  if jax.device_count() == 1:
    return False
  return not getattr(jax.sharding.get_abstract_mesh(), "manual_axes", ())


def _names(entry) -> tuple[str, ...]:
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def _spec(sharding, mesh, ndim: int):
  """The operand's PartitionSpec over `mesh`, or all None where XLA chose a tiling that no
  PartitionSpec of this mesh spells (e.g. a scale axis of 2 blocks split 2 ways while its mesh
  axis has 4 devices): such an operand is then gathered, never mis-read."""
  spec = tuple(jax_compat.spec_of_hlo_sharding(sharding, mesh) or ())
  return spec + (None,) * (ndim - len(spec))


def _output_spec(mesh, a_sharding, b_sharding):
  """(batch, M, N) mesh axes: batch and M from the lhs codes, N from the rhs codes."""
  za, m, _ = _spec(a_sharding, mesh, 3)
  zb, n, _ = _spec(b_sharding, mesh, 3)
  z = za if za == zb else None
  used = set(_names(z))
  if used & set(_names(m)):
    m = None
  used |= set(_names(m))
  if used & set(_names(n)):
    n = None
  return z, m, n


@functools.lru_cache(maxsize=None)
def partitioned(op, static):
  """`op(g, a, sa, b, sb, static) -> (B, M, N)` as a partitioned op (cached per static)."""

  def run(g, a, sa, b, sb):
    return op(g, a, sa, b, sb, static)

  wrapped = custom_partitioning(run)

  def shardings(mesh, z, m, n):
    rep = NamedSharding(mesh, P(None, None))
    lhs = NamedSharding(mesh, P(z, m, None))
    rhs = NamedSharding(mesh, P(z, n, None))
    return (rep, lhs, lhs, rhs, rhs), NamedSharding(mesh, P(z, m, n))

  def partition(mesh, arg_shapes, result_shape):
    z, m, n = _output_spec(mesh, arg_shapes[1].sharding, arg_shapes[3].sharding)
    args, out = shardings(mesh, z, m, n)
    return mesh, run, out, args

  def infer(mesh, arg_shapes, result_shape):
    return shardings(mesh, *_output_spec(mesh, arg_shapes[1].sharding, arg_shapes[3].sharding))[1]

  wrapped.def_partition(partition, infer_sharding_from_operands=infer,
                        sharding_rule="p q, z m c, z m j, z n c, z n j -> z m n",
                        need_replication_factors=("p", "q", "c", "j"),
                        decode_shardings=False)  # parsed by `_spec`, which may give up
  return wrapped
