"""Which layer gets which GEMM recipe: regexes over module paths (no Flax here).

A path is the layer's position in the model, "/"-joined ("layers/3/mlp/up_proj"; a tuple of keys
is joined for you). `QuantPolicy.recipe_for(path)` decides, in this order:

1. unless `pure`: a path matching one of `keep_high_precision` (embeddings, the LM head, norms,
   the attention score and value products) -> `high_precision`;
2. unless `pure`: a block index (`block_pattern`) among the first `keep_first_blocks` or the last
   `keep_last_blocks` of `num_blocks` -> `high_precision`;
3. the first of `rules` (regex, recipe) whose regex matches (re.search) -> that recipe;
4. otherwise -> `recipe`.

Steps 3-4 may be replaced wholesale by `recipe_override(name)` (the precision schedule's switch):
inside the context every layer the policy would quantize gets `name` instead.

Attention products are recognised by name: models call the score product (Q K^T) "attn_scores"
(or "qk") and the value product (P V) "attn_values" (or "pv").

Examples:
  >>> p = QuantPolicy(recipe="mxfp4", keep_last_blocks=1, num_blocks=4)
  >>> p.recipe_for("layers/0/mlp/up").name, p.recipe_for("embed").name, p.recipe_for("layers/3/attn/q").name
  ('mxfp4', 'bf16', 'bf16')
  >>> p.recipe_for(("layers", 1, "attn", "attn_scores")).name
  'bf16'
  >>> with recipe_override("bf16"):
  ...   p.recipe_for("layers/0/mlp/up").name
  'bf16'
  >>> QuantPolicy(recipe="mxfp4", pure=True).recipe_for("lm_head").name
  'mxfp4'
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import re
from typing import Sequence, Union

from lpjax.quant.recipe import GemmRecipe

RecipeLike = Union[str, GemmRecipe]

# Layers every published FP4 recipe keeps in high precision (NUMERICS.md §7).
DEFAULT_HIGH_PRECISION = (
    r"(^|/)[^/]*embed[^/]*(/|$)",  # token / position embeddings (embed, embedding, embed_tokens, wte)
    r"(^|/)(wte|wpe)(/|$)",
    r"(^|/)(lm_head|head|unembed|logits|output_proj)(/|$)",  # the LM head / classifier
    r"norm",  # RMSNorm / LayerNorm scales (no GEMM, listed for completeness)
    r"(^|/)(attn_scores|attn_values|qk|pv)(/|$)",  # attention score and value products
)
# A block index in a path: "layers/3", "blocks.3", "layer_3", "h/3".
DEFAULT_BLOCK_PATTERN = r"(?:^|/)(?:layers|blocks|block|layer|h)[/._]?(\d+)(?:[/._]|$)"

_OVERRIDE: contextvars.ContextVar[RecipeLike | None] = contextvars.ContextVar("lpjax_recipe_override",
                                                                              default=None)


@contextlib.contextmanager
def recipe_override(recipe: RecipeLike | None):
  """Inside the context, every layer a policy would quantize uses `recipe` (None: no override).

  Read when a model is traced: make the override a static argument of the jitted step so jit
  compiles once per distinct recipe (see `lpjax.quant.schedule`).
  """
  token = _OVERRIDE.set(recipe)
  try:
    yield
  finally:
    _OVERRIDE.reset(token)


def current_override() -> RecipeLike | None:
  return _OVERRIDE.get()


def path_str(path) -> str:
  """("layers", 3, "mlp") -> "layers/3/mlp"; strings pass through."""
  if isinstance(path, str):
    return path
  return "/".join(str(getattr(p, "key", getattr(p, "idx", p))) for p in path)


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantPolicy:
  """Per-layer recipes by regex over module paths (first match wins; see the module docstring)."""

  recipe: RecipeLike = "bf16"  # recipe of every quantizable layer no rule matches
  rules: tuple[tuple[str, RecipeLike], ...] = ()  # (regex, recipe), checked in order after the keeps
  high_precision: RecipeLike = "bf16"  # recipe of the layers kept in high precision
  keep_high_precision: tuple[str, ...] = DEFAULT_HIGH_PRECISION  # regexes of always-hp layers
  keep_first_blocks: int = 0  # this many first blocks stay in high precision
  keep_last_blocks: int = 0  # this many last blocks stay in high precision (needs num_blocks)
  num_blocks: int | None = None  # number of blocks of the model
  block_pattern: str = DEFAULT_BLOCK_PATTERN  # regex with one group: the block index of a path
  pure: bool = False  # quantize everything: no keep_high_precision, no kept blocks

  def __post_init__(self):
    object.__setattr__(self, "rules", tuple((str(p), r) for p, r in self.rules))
    object.__setattr__(self, "keep_high_precision", tuple(self.keep_high_precision))
    for pattern in [p for p, _ in self.rules] + list(self.keep_high_precision) + [self.block_pattern]:
      re.compile(pattern)  # fail early on a bad regex
    if self.keep_last_blocks and self.num_blocks is None:
      raise ValueError("keep_last_blocks needs num_blocks (the number of blocks of the model).")
    if self.keep_first_blocks < 0 or self.keep_last_blocks < 0:
      raise ValueError("keep_first_blocks and keep_last_blocks must be >= 0.")

  def kept_high_precision(self, path) -> bool:
    """True when the policy keeps the layer at `path` in high precision (steps 1-2)."""
    if self.pure:
      return False
    path = path_str(path)
    if any(re.search(p, path) for p in self.keep_high_precision):
      return True
    m = re.search(self.block_pattern, path)
    if m and (self.keep_first_blocks or self.keep_last_blocks):
      i = int(m.group(1))
      if i < self.keep_first_blocks:
        return True
      if self.keep_last_blocks and i >= self.num_blocks - self.keep_last_blocks:
        return True
    return False

  def recipe_for(self, path) -> GemmRecipe:
    """The GemmRecipe of the layer at `path` (a "/"-joined string or a tuple of keys)."""
    return _resolve(self._choice(path_str(path), current_override()))

  def _choice(self, path: str, override) -> RecipeLike:
    if self.kept_high_precision(path):
      return self.high_precision
    if override is not None:
      return override
    for pattern, recipe in self.rules:
      if re.search(pattern, path):
        return recipe
    return self.recipe

  def describe(self, paths: Sequence) -> str:
    """A table 'path -> recipe' (e.g. to log once at the start of training)."""
    rows = [(path_str(p), str(self.recipe_for(p))) for p in paths]
    width = max([len(p) for p, _ in rows] + [4])
    return "\n".join(f"{p:<{width}}  {r}" for p, r in rows)


@functools.lru_cache(maxsize=None)
def _resolve_name(name: str) -> GemmRecipe:
  from lpjax.quant import recipes

  return recipes.get(name)


def _resolve(recipe: RecipeLike) -> GemmRecipe:
  return recipe if isinstance(recipe, GemmRecipe) else _resolve_name(recipe)
