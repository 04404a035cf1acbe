"""The FP4 GEMM kernel on 8 (CPU, interpret-mode) devices: same bits as one device, no gathers.

`lpjax.pallas._fp4_gemm_sharded` partitions the kernel over the lhs's batch / M shards and the
rhs's N shards (K is never split); inside `shard_map` the kernel runs on each device's arrays.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from lpjax import pallas, quant
from lpjax.quant import recipes

from tests.pallas.fp4_gemm_reference import np_sequential, quantized

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (virtual) devices")


def mesh():
  return Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "fsdp"))


def put(tree, spec):
  """Shards every array of rank >= 2 (codes, scales) with `spec`."""
  s = NamedSharding(mesh(), spec)
  return jax.tree.map(lambda x: jax.device_put(x, s) if x.ndim >= 2 else x, tree)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("a_spec,b_spec,out_spec", [
    (P("data"), P("fsdp"), P("data", "fsdp")),  # activation rows x weight output features
    (P(("data", "fsdp")), P(None), P(("data", "fsdp"), None)),
    (P("fsdp"), P("fsdp"), P("fsdp", None)),  # one axis twice: M keeps it, N is gathered
    (P(None, "fsdp"), P(None), P(None, None)),  # K split: gathered, never multiplied in halves
])
def test_per_shard_is_bit_identical(fmt, a_spec, b_spec, out_spec):
  qa, qb = quantized((64, 128), fmt, 1, exponents=(-12, 12)), quantized((32, 128), fmt, 2)
  fn = jax.jit(pallas.fp4_matmul)
  y = fn(put(qa, a_spec), put(qb, b_spec))
  np.testing.assert_array_equal(np.asarray(y), np_sequential(qa, qb))
  pad = lambda spec: tuple(spec) + (None,) * (2 - len(spec))
  assert pad(y.sharding.spec) == pad(out_spec)
  gathers = "all-gather" in fn.lower(put(qa, a_spec), put(qb, b_spec)).compile().as_text()
  assert gathers == (a_spec == P(None, "fsdp") or (a_spec, b_spec) == (P("fsdp"), P("fsdp")))


def test_inside_shard_map_each_device_multiplies_its_rows():
  qa, qb = quantized((64, 96), "mxfp4", 3), quantized((32, 96), "mxfp4", 4)

  @functools.partial(jax.shard_map, mesh=mesh(), in_specs=(P(("data", "fsdp")), P()),
                     out_specs=P(("data", "fsdp")), check_vma=False)
  def per_device(a, b):
    return pallas.fp4_matmul(a, b)

  y = jax.jit(per_device)(put(qa, P(("data", "fsdp"))), qb)
  np.testing.assert_array_equal(np.asarray(y), np_sequential(qa, qb))


def test_gemm_path_data_parallel_equals_one_device():
  recipe = dataclasses.replace(recipes.get("mxfp4"), gemm_impl="pallas")
  x = jax.random.normal(jax.random.key(5), (64, 96))
  w = jax.random.normal(jax.random.key(6), (96, 32))
  key = jax.random.key(7)
  loss = lambda x, w: (quant.dot_general(x, w, (((1,), (0,)), ((), ())), recipe, key=key)
                       * jnp.arange(32.0)).sum()
  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
  sharded = step(jax.device_put(x, NamedSharding(mesh(), P(("data", "fsdp")))), w)
  single = step(x, w)  # x on one device
  for s, o in zip(jax.tree.leaves(sharded), jax.tree.leaves(single)):
    np.testing.assert_array_equal(np.asarray(s), np.asarray(o))
