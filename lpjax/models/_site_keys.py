"""The random keys of a transformer block's GEMM sites, derived together.

Each quantized layer's key is `QuantPolicy.site_key(step key, its path, block)`; a block derives
those of all its GEMMs in one call (`QuantPolicy.site_keys`: two vectorized hashes per block, not
two per GEMM), the same keys bit for bit.
"""

from __future__ import annotations

from lpjax.quant.monitor import observer as monitor


def block_site_keys(layers, key, block) -> dict:
  """{path: key} of `layers` (a block's GEMM layers): a quantized layer's `site_key`, bit for
  bit; None for a high-precision layer (whose GEMM draws no random bits). {}: each layer derives
  its own (no key, or layers with policies of their own)."""
  policy = layers[0].policy
  if key is None or policy is None or any(layer.policy != policy for layer in layers):
    return {}
  quantized = [layer.path for layer in layers if not layer.active_recipe().is_high_precision]
  keys = dict.fromkeys((layer.path for layer in layers), None)
  keys.update(zip(quantized, policy.site_keys(key, quantized, block)))
  for layer in layers:
    monitor.note_block(layer.path, block)  # as each layer's own site_key does
  return keys


def site(key, block, keys, layer):
  """The key of `layer`'s GEMM: from its block's `keys` (`block_site_keys`), else its own."""
  if layer.path in (keys or {}):
    return keys[layer.path]
  return layer.site_key(key, block)
