"""The Pallas quantizers on 8 (CPU, interpret-mode) devices: same bits as XLA, no gathers.

`lpjax.pallas._sharded` partitions the kernels per shard of the leading axis; these tests run
them under jit on sharded operands and compare every output with the XLA path on the same
operands (stochastic rounding included: the shard offsets its flat indices), then read the
compiled HLO for all-gathers.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from lpjax import quant
from lpjax.quant.codec import qarray as Q
from lpjax.quant.gemm.dot_general import dot_general

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (virtual) devices")

# SR and the NVFP4 tensor scale are what sharding could break; one 8-bit RTN case; axis 0 blocked.
CASES = [("mxfp4", "stochastic", -1), ("nvfp4", "stochastic", -1), ("mxfp8_e4m3", "nearest_even", -1),
         ("nvfp4", "stochastic", 0)]


def mesh():
  return Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "fsdp"))


def put(x, spec):
  return jax.device_put(x, NamedSharding(mesh(), spec))


def gathers(fn, *args):
  return "all-gather" in fn.lower(*args).compile().as_text()


@pytest.mark.parametrize("fmt, rounding, axis", CASES)
@pytest.mark.parametrize("spec", [P("data"), P(("data", "fsdp")), P(None, "fsdp")])
def test_fake_quant_per_shard_is_bit_identical(fmt, rounding, axis, spec):
  x = put(jax.random.normal(jax.random.key(0), (128, 64)) * 3, spec)
  key = jax.random.key(1)
  kw = dict(rounding=rounding, key=key if rounding == "stochastic" else None, axis=axis)
  pallas_fn = jax.jit(lambda x: quant.fake_quant(x, fmt, impl="pallas", **kw))
  xla_fn = jax.jit(lambda x: quant.fake_quant(x, fmt, impl="xla", **kw))
  np.testing.assert_array_equal(np.asarray(pallas_fn(x)), np.asarray(xla_fn(x)))
  # A leading-axis shard of 32 or 16 rows holds whole blocks (axis 0: NVFP4 blocks of 16).
  assert gathers(pallas_fn, x) == (spec == P(None, "fsdp"))


@pytest.mark.parametrize("fmt, rounding", [("mxfp4", "stochastic"), ("nvfp4", "stochastic")])
def test_quantize_per_shard_gives_the_same_qarray(fmt, rounding):
  x = put(jax.random.normal(jax.random.key(2), (64, 4, 96)), P(("data", "fsdp")))
  key = jax.random.key(3)
  q, ref = jax.jit(lambda x: (quant.quantize(x, fmt, rounding=rounding, key=key, impl="pallas"),
                              quant.quantize(x, fmt, rounding=rounding, key=key, impl="xla")))(x)
  np.testing.assert_array_equal(np.asarray(q.codes), np.asarray(ref.codes))
  np.testing.assert_array_equal(np.asarray(q.scales), np.asarray(ref.scales))
  if ref.tensor_scale is not None:
    assert float(q.tensor_scale) == float(ref.tensor_scale)
  f = jax.jit(lambda x: quant.quantize(x, fmt, rounding=rounding, key=key, impl="pallas").codes)
  assert not gathers(f, x)


def test_a_shard_that_would_split_a_block_is_gathered_not_wrong():
  x = put(jax.random.normal(jax.random.key(4), (64, 8)), P("data"))  # 16 rows per shard
  f = jax.jit(lambda x: quant.fake_quant(x, "mxfp4", axis=0, impl="pallas"))  # blocks of 32 rows
  ref = quant.fake_quant(x, "mxfp4", axis=0, impl="xla")
  np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(ref))
  assert gathers(f, x)


def test_auto_gemm_operands_use_the_kernels_per_shard(monkeypatch):
  """impl="auto" as on 8 GPUs: a GEMM's operand quantizers (RHT, SR pre-scale, rounding) run the
  kernels on each shard with the XLA path's bits; the GEMMs then agree to float rounding (the
  partitioner may sum partial products in another order around the kernels' outputs)."""
  from lpjax.quant.gemm import operand as opq
  from lpjax.quant import recipes

  x = put(jax.random.normal(jax.random.key(5), (64, 128)), P("data"))
  w = put(jax.random.normal(jax.random.key(6), (128, 64)) * 0.1, P("fsdp"))
  key = jax.random.key(7)
  dims = (((1,), (0,)), ((), ()))
  op = recipes.get("mxfp4").dgrad.lhs  # SR x3/4 after RHT-32
  signs = opq.hadamard_signs(key, "dgrad", 32)

  def run():
    operand = jax.jit(lambda x: opq.fake(x, op, axis=-1, key=key, signs=signs, block=32))(x)
    grads = jax.jit(jax.grad(lambda x, w: jnp.sum(dot_general(x, w, dims, "nvfp4", key=key) ** 2),
                             argnums=(0, 1)))(x, w)
    return operand, grads

  ref_operand, ref_grads = run()
  calls = []
  real = Q._kernel_backend
  monkeypatch.setattr(Q, "_auto_uses_kernels", lambda: True)
  monkeypatch.setattr(Q, "_kernel_backend", lambda impl, fmt: calls.append(impl) or real(impl, fmt))
  operand, grads = run()
  assert calls  # the kernels ran
  np.testing.assert_array_equal(np.asarray(operand), np.asarray(ref_operand))
  for a, b in zip(grads, ref_grads):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6 * float(jnp.abs(b).max()))
