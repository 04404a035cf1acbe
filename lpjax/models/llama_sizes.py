"""LLaMA model sizes: width, SwiGLU width, heads and blocks by name (no Flax here).

Examples:
  >>> LLAMA_SIZES["1b"]
  LlamaSize(hidden=2048, intermediate=5461, heads=32, layers=24)
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LlamaSize:
  hidden: int  # model width
  intermediate: int  # SwiGLU hidden width
  heads: int  # attention heads (head_dim = hidden / heads)
  layers: int  # transformer blocks


# docs/numerics.md §10 (60m-1b, as in the GaLore / SPAM / Stable-SPAM papers) and smaller CPU sizes.
LLAMA_SIZES = {
    "tiny": LlamaSize(128, 352, 4, 4),
    "9m": LlamaSize(128, 352, 4, 4),
    "20m": LlamaSize(256, 688, 4, 4),
    "35m": LlamaSize(384, 1024, 8, 6),
    "60m": LlamaSize(512, 1376, 8, 8),
    "130m": LlamaSize(768, 2048, 12, 12),
    "350m": LlamaSize(1024, 2736, 16, 24),
    "1b": LlamaSize(2048, 5461, 32, 24),
}
