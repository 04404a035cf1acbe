"""FP4 weight all-gather (`quant.weight_sharding`, `dot_general(rhs_axes=)`) on 8 CPU devices.

The property: with the option on, a GEMM whose weight is sharded over fsdp gives the bits of the
plain program (forward values, dX and dW), and the compiled program gathers the weight as uint8
codes + scales instead of a float copy.
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from lpjax import quant
from lpjax.train.step import _sharding as shd

K, N, M = 512, 256, 64
DN = (((1,), (0,)), ((), ()))


def _setup(w_spec):
  mesh = shd.make_mesh(1, 8, 1)
  x = jax.random.normal(jax.random.key(0), (M, K), jnp.float32).astype(jnp.bfloat16)
  w = jax.random.normal(jax.random.key(1), (K, N), jnp.float32) * 0.02
  x = jax.device_put(x, NamedSharding(mesh, P("fsdp", None)))
  w = jax.device_put(w, NamedSharding(mesh, w_spec))
  return mesh, x, w


def _loss(mesh, recipe, axes):
  def loss(w, x, key, on):
    with quant.weight_sharding(shd.weight_resolver(mesh) if on else None):
      y = quant.dot_general(x, w.astype(jnp.bfloat16), DN, recipe, key=key, rhs_axes=axes)
    return jnp.sum(y.astype(jnp.float32) * jnp.cos(y.astype(jnp.float32))), y
  return loss


def _grad_fn(mesh, recipe, axes):
  grad = jax.value_and_grad(_loss(mesh, recipe, axes), argnums=(0, 1), has_aux=True)
  return jax.jit(grad, static_argnums=3)


def _all_gathers(text):
  """[(dtype, element count)] of the all-gathers in compiled HLO text."""
  out = []
  for dtype, dims in re.findall(r"= \(?(\w+)\[([\d,]*)\][^=]*? all-gather\(", text):
    out.append((dtype, int(np.prod([int(d) for d in dims.split(",") if d]))))
  return out


MXFP4_PACKED_RESIDUALS = dataclasses.replace(quant.get_recipe("mxfp4"), residuals="quantized")


@pytest.mark.parametrize("recipe", ["mxfp4", "nvfp4", MXFP4_PACKED_RESIDUALS],
                         ids=["mxfp4", "nvfp4", "mxfp4-packed-residuals"])
@pytest.mark.parametrize("axes,w_spec", [(("embed", "mlp"), P("fsdp", None)),
                                         (("mlp", "embed"), P(None, "fsdp"))],
                         ids=["K-sharded", "N-sharded"])
def test_quantized_gather_keeps_the_bits_and_gathers_codes(recipe, axes, w_spec):
  mesh, x, w = _setup(w_spec)
  f = _grad_fn(mesh, recipe, axes)
  key = jax.random.key(2)
  (_, y_off), (dw_off, dx_off) = f(w, x, key, False)
  (_, y_on), (dw_on, dx_on) = f(w, x, key, True)
  np.testing.assert_array_equal(np.asarray(y_on), np.asarray(y_off))
  np.testing.assert_array_equal(np.asarray(dx_on), np.asarray(dx_off))
  np.testing.assert_array_equal(np.asarray(dw_on), np.asarray(dw_off))

  # The forward program's gathers. (In the backward of these toy shapes XLA's partitioner
  # decodes the dgrad weight's codes on each shard and gathers the float32 values; on the 1B
  # LLaMA every forward and backward weight gather is uint8: benchmarks/memory/weight_gather.py.)
  fwd = jax.jit(lambda w, x, key, on: _loss(mesh, recipe, axes)(w, x, key, on)[1],
                static_argnums=3)
  gathers_off = _all_gathers(fwd.lower(w, x, key, False).compile().as_text())
  gathers_on = _all_gathers(fwd.lower(w, x, key, True).compile().as_text())
  weight_sized = lambda gathers, dtypes: [g for g in gathers if g[0] in dtypes and g[1] >= K * N // 2]
  # plain: the weight crosses the mesh in a float type (for the N-sharded weight and a small
  # batch XLA may gather X instead); gathered: as packed FP4 codes (K*N/2 bytes)
  if w_spec == P("fsdp", None):
    assert weight_sized(gathers_off, ("f32", "bf16"))
  assert not weight_sized(gathers_on, ("f32", "bf16", "u32", "s32"))
  assert ("u8", K * N // 2) in gathers_on


def test_nothing_changes_without_the_context_or_the_axes():
  mesh, x, w = _setup(P("fsdp", None))
  plain = jax.jit(lambda x, w: quant.dot_general(x, w, DN, "mxfp4_naive"))
  with quant.weight_sharding(shd.weight_resolver(mesh)):
    unnamed = jax.jit(lambda x, w: quant.dot_general(x, w, DN, "mxfp4_naive"))
    text = unnamed.lower(x, w).compile().as_text()
  assert not any(g[0] == "u8" for g in _all_gathers(text))  # no axes: XLA's own choice
  np.testing.assert_array_equal(np.asarray(unnamed(x, w)), np.asarray(plain(x, w)))


@pytest.mark.parametrize("rhs_shape,dn", [((4, 64, 8), (((1,), (1,)), ((), ()))),
                                          ((8, 64), (((1,), (1,)), ((), ())))])
def test_rhs_axes_needs_a_k_by_n_weight(rhs_shape, dn):
  x = jnp.ones((4, 64))
  with pytest.raises(ValueError, match=r"2-D weight \(K, N\)"):
    quant.dot_general(x, jnp.ones(rhs_shape), dn, "mxfp4_naive", rhs_axes=("embed", "mlp"))


def test_weight_resolver_drops_only_the_fsdp_axis():
  mesh = shd.make_mesh(data=2, fsdp=2, tensor=2)
  resolve = shd.weight_resolver(mesh)
  assert resolve(("embed", "mlp"), (64, 32), False).spec == P("fsdp", "tensor")
  assert resolve(("embed", "mlp"), (64, 32), True).spec == P(None, "tensor")  # still over tensor
  assert resolve(("mlp", "embed"), (64, 3), True).spec == P("tensor", None)
  assert shd._without(("data", "fsdp"), "fsdp") == "data"
  assert shd._without(("data", "fsdp", "tensor"), "fsdp") == ("data", "tensor")
