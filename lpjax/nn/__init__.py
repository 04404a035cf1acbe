"""lpjax.nn: Flax NNX layers that run their matmuls and convolutions through a GEMM recipe,
and the logical-axis hints that let a trainer shard their activations.

Examples:
  >>> import jax.numpy as jnp
  >>> from flax import nnx
  >>> from lpjax import nn, quant
  >>> layer = nn.QDense(32, 8, recipe="mxfp4_naive", rngs=nnx.Rngs(0))
  >>> nnx.jit(lambda m, x: m(x))(layer, jnp.ones((2, 32))).shape
  (2, 8)
"""

from lpjax.nn._layers import QUANTIZED_LAYERS, QConv, QDense, QEinsum, apply_policy
from lpjax.nn._quantize_model import QuantizedLinen, QuantizedModel, quantize_model
from lpjax.nn._sharding_hints import activation_sharding, constrain

__all__ = ["QConv", "QDense", "QEinsum", "QUANTIZED_LAYERS", "QuantizedLinen", "QuantizedModel",
           "activation_sharding", "apply_policy", "constrain", "quantize_model"]
