"""The U-Net's batched init: the values of one flax draw per kernel, bit for bit, in a jitted init
a third the size (one threefry per kernel size instead of one per kernel and per key)."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lpjax.models import unet
from lpjax.models._batched_init import fan_avg_uniform

CFG = unet.unet_tiny(image_size=8, channels=1, param_dtype="bfloat16")
KEY = jax.random.key(3)


def _reference(cfg, key):
  # The old init: the U-Net built with plain flax variance_scaling(1, fan_avg, uniform) kernels,
  # one fold_in and one draw per kernel, as nnx does it.
  model = unet.UNet(cfg, rngs=nnx.Rngs(params=key))
  return nnx.split(model, nnx.Param)[1]


REFERENCE = jax.jit(lambda k: _reference(CFG, k))
INIT = jax.jit(lambda k: unet.init_params(CFG, k))


def test_init_params_equal_the_per_kernel_flax_draws_bit_for_bit_jitted_and_eager():
  want = REFERENCE(KEY)
  for got in (INIT(KEY), unet.init_params(CFG, KEY)):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      assert a.dtype == b.dtype == jnp.bfloat16 and a.shape == b.shape
      np.testing.assert_array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))
  # and the draws are real: kernels differ, zero-initialised convs stay zero
  kernels = [x for p, x in jax.tree.leaves_with_path(want) if "conv1" in jax.tree_util.keystr(p)
             and "kernel" in jax.tree_util.keystr(p)]
  assert len(kernels) > 2 and float(jnp.abs(kernels[0]).max()) > 0


def test_fan_avg_uniform_outside_init_params_is_the_flax_initializer():
  plain = nnx.initializers.variance_scaling(1.0, "fan_avg", "uniform")
  key = jax.random.key(1)
  np.testing.assert_array_equal(fan_avg_uniform()(key, (3, 3, 4, 8)), plain(key, (3, 3, 4, 8)))


def _instructions(jitted):
  hlo = jitted.lower(KEY).compile().as_text()
  return sum(1 for line in hlo.splitlines() if " = " in line)


def test_jitted_init_is_a_fraction_of_the_per_kernel_init():
  # Structural compile cost (load-independent): the compiled init's instruction count. The old
  # init unrolled one threefry per fold_in and per kernel (9680 instructions for this model).
  new, old = _instructions(INIT), _instructions(REFERENCE)
  assert new * 2 < old, (new, old)


def test_a_key_not_from_the_batched_stream_is_refused_not_silently_redrawn():
  from lpjax.models._batched_init import batched_init
  with batched_init(KEY) as (rngs, _):
    rngs.params()
    with np.testing.assert_raises_regex(ValueError, "key just drawn"):
      fan_avg_uniform()(jax.random.key(5), (4, 8), jnp.float32)
