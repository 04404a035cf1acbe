"""The quantizers on sharded arrays: blocks within shards need no communication.

A regression test for the codec's per-group "opaque zero" (`_materialize.opaque_zero`): it was once
element [0] of the flattened amax (or codes), and XLA all-gathered the whole array to every device
to read it: on the 1B config, activation-sized uint32 gathers (~240 GiB per step per device) in
every backward quantization along the token axis.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from lpjax import quant


def _collectives(f, *args):
  text = jax.jit(f).lower(*args).compile().as_text()
  return re.findall(r"(all-gather|all-to-all|collective-permute)\(", text)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "mxfp8_e4m3"])
@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
@pytest.mark.parametrize("axis", [0, 1], ids=["blocks-along-sharded-rows", "blocks-along-columns"])
def test_quantize_and_dequantize_stay_on_their_shards(fmt, rounding, axis):
  mesh = Mesh(np.array(jax.devices()), ("d",))
  x = jax.random.normal(jax.random.key(0), (8 * 64, 96), jnp.float32)
  xs = jax.device_put(x, NamedSharding(mesh, P("d", None)))
  key = jax.random.key(1) if rounding == "stochastic" else None
  fake = lambda x: quant.fake_quant(x, fmt, axis=axis, rounding=rounding, key=key)
  roundtrip = lambda x: quant.dequantize(quant.quantize(x, fmt, axis=axis, rounding=rounding,
                                                        key=key), jnp.float32)
  for f in (fake, roundtrip):
    assert _collectives(f, xs) == []
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(xs)), np.asarray(jax.jit(f)(x)))
