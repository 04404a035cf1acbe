"""A quantized LLaMA stays causal: the logits of a position never depend on later tokens.

Changing only the tokens from position S on must leave the logits of positions < S unchanged, bit
for bit. S = 40 lies inside a block of 32 along the key axis, where a quantizer that shares
anything across the block (a scale, a Hadamard transform) could carry later tokens back.

Two known leaks are pinned as strict xfails (they fail the property; a fix turns them into
passes, and strict=True then asks for the marker to go):
- `quant.policy=pure` quantizes the attention products: a Hadamard transform (mxfp4's RHT,
  quartet's) or block scales along the key axis of P V mix later keys' values into the rounding of
  earlier ones. A model trained so can learn to read the future (quartet pure runs of
  benchmarks/advisor_vs_defaults.py reach eval loss 2.11 with quantization on and 3.61 with it off).
  The default policy keeps these products in high precision.
- NVFP4's per-tensor scale is the amax of the whole activation tensor, later tokens included: one
  number per tensor and step crosses from the future (NVIDIA's NVFP4 recipe computes it so too).
"""

import jax
import jax.numpy as jnp
import pytest

from lpjax.models import llama
from lpjax.quant import QuantPolicy

CFG = llama.LlamaConfig(vocab_size=64, hidden=64, intermediate=128, heads=2, layers=1,
                        max_seq_len=64)
T, S = 64, 40
TOKENS = jax.random.randint(jax.random.key(0), (1, T), 0, CFG.vocab_size)
CHANGED = TOKENS.at[:, S:].set((TOKENS[:, S:] + 7) % CFG.vocab_size)

_LEAKS_PURE = pytest.mark.xfail(strict=True, reason="quantized attention products mix later keys "
                                "into earlier positions (module docstring)")
_LEAKS_TENSOR_SCALE = pytest.mark.xfail(strict=True, reason="NVFP4's per-tensor amax covers "
                                        "later tokens (module docstring)")


@pytest.mark.parametrize("recipe,pure", [
    ("bf16", False), ("mxfp4", False), ("quartet", False), ("mxfp4_naive", False),
    ("mxfp4_naive", True),
    pytest.param("nvfp4", False, marks=_LEAKS_TENSOR_SCALE),
    pytest.param("mxfp4", True, marks=_LEAKS_PURE),
    pytest.param("quartet", True, marks=_LEAKS_PURE),
])
def test_logits_of_earlier_positions_ignore_later_tokens(recipe, pure):
  policy = QuantPolicy(recipe=recipe, pure=pure, high_precision="bf16")
  graphdef, _ = llama.abstract_model(CFG, policy)
  params = llama.init_params(CFG, jax.random.key(1), policy)
  key = jax.random.key(2)
  before = llama.apply(graphdef, CFG, params, TOKENS, policy, key)
  after = llama.apply(graphdef, CFG, params, CHANGED, policy, key)
  assert bool(jnp.any(before[:, S:] != after[:, S:]))  # the change is seen where it may be
  assert bool(jnp.all(before[:, :S] == after[:, :S])), float(
      jnp.max(jnp.abs(before[:, :S] - after[:, :S])))
