"""lpjax.nn: Flax NNX layers that run their matmuls and convolutions through a GEMM recipe.

Examples:
  >>> import jax.numpy as jnp
  >>> from flax import nnx
  >>> from lpjax import nn, quant
  >>> layer = nn.QDense(32, 8, recipe="mxfp4_naive", rngs=nnx.Rngs(0))
  >>> nnx.jit(lambda m, x: m(x))(layer, jnp.ones((2, 32))).shape
  (2, 8)
"""

from lpjax.nn.layers import QUANTIZED_LAYERS, QConv, QDense, QEinsum, apply_policy

__all__ = ["QConv", "QDense", "QEinsum", "QUANTIZED_LAYERS", "apply_policy"]
