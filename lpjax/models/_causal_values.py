"""A causal attention-values product P V whose quantization never reads later keys.

A quantizer of P V's forward shares something across consecutive keys (the contraction axis): a
block scale over `block_size` keys, an RHT over `hadamard_block` keys. Quantized as one GEMM, the
output of query i then depends, through the rounding of its own block of keys, on the values of
the keys after i in that block: a causal LM could learn to read the future through it (a model
trained with `quant.policy=pure` does).

`causal_values` splits the product by key blocks of that span: each query multiplies the blocks
before its own block through the quantized layer (every key there is earlier than the query, so
every block scale and transform is of earlier keys only), and its own block (the keys up to the
query; P is zero after it) in float32. That float32 part is span / length of the dense product's
FLOPs (25% at 128 tokens with 32-key blocks, 1.6% at 2048), but it holds the attention mass of
each query's nearest keys, often a large share: a "quantized" attention-values product is that
much less quantized than one GEMM would be (the FLOP counts of `lpjax.quant.site_stats` and
`advise` count the quantized call only). What stays shared is a per-tensor scale (NVFP4's second
level, FP8's per-tensor amax): one number from the whole tensor, as NVIDIA's NVFP4 recipe computes
it; a quantizer that scales over the whole key axis (per-channel, SSP grids) gets no split, since
no block is causal there (`key_span` is None).

Examples:
  >>> from lpjax import quant
  >>> key_span(quant.get_recipe("mxfp4")), key_span(quant.get_recipe("nvfp4"))
  (32, 16)
  >>> key_span(quant.get_recipe("bf16")), key_span(quant.get_recipe("fp8"))
  (0, None)
"""

from __future__ import annotations

import jax.numpy as jnp

from lpjax.quant import OperandQuant


def key_span(recipe) -> int | None:
  """How many consecutive keys (the contraction axis) one forward quantizer of `recipe` shares
  a scale or a transform across: the largest block of its quantized operands; 0 when the forward
  quantizes nothing; None when a quantizer spans the whole axis (per-channel or per-tensor
  granularity, SSP grids)."""
  span = 0
  for op in recipe.fwd.operands():
    if not isinstance(op, OperandQuant):
      continue
    fmt = op.format
    if fmt is None or fmt.granularity != "block":
      return None
    span = max(span, fmt.block_size, op.hadamard_block or 0)
  return span


def causal_values(layer, probs, v, *, key, span: int):
  """einsum("bhqk,bkhd->bqhd", probs, v) for causal `probs` (zero after each query), through the
  QEinsum `layer` for the key blocks of `span` before each query's block and in float32 for the
  query's own block; in the layer's output dtype."""
  length = probs.shape[-1]
  blocks = jnp.arange(length) // span
  own = blocks[:, None] == blocks[None, :]  # (query, key): the query's own key block
  earlier = layer(jnp.where(own, jnp.zeros((), probs.dtype), probs), v, key=key)
  diagonal = jnp.einsum("bhqk,bkhd->bqhd", jnp.where(own, probs, 0).astype(jnp.float32),
                        v.astype(jnp.float32))
  return (earlier.astype(jnp.float32) + diagonal).astype(earlier.dtype)
