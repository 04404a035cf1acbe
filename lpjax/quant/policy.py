"""Which layer gets which GEMM recipe: one `QuantPolicy` object, from the config to the GEMM.

A path is the layer's position in the model, "/"-joined ("layers/3/mlp/up_proj"; a tuple of keys
is joined for you). `QuantPolicy.recipe_for(path)` decides, in this order:

1. unless `pure`: a path matching one of `keep_high_precision` (embeddings, the LM head, norms,
   the attention score and value products, plus what the model adds: its first and last layers)
   -> `high_precision`, or the layer's own recipe (steps 3-4) when that one is unquantized and
   at least as precise (`kept_recipe`: a kept layer never runs below the recipe asked for, so under
   "fp32" every layer runs fp32). The default `high_precision` is "auto": a kept GEMM runs on
   its operands as given (fp32 operands: fp32, bf16: bf16), the original program's GEMM, so a
   kept layer never runs below the model's own dtype either; "bf16" casts kept GEMMs to bf16
   (what lpjax's trainer asks for: `quant.high_precision_recipe`);
2. unless `pure`: a block index (`block_pattern`) among the first `keep_first_blocks` or the last
   `keep_last_blocks` of `num_blocks` (or the last `keep_last_fraction` of them, the NVIDIA NVFP4
   recipe's ~15%) -> `high_precision` (as in step 1);
3. the first of `rules` (regex, recipe) whose regex matches (re.search) -> that recipe;
4. otherwise -> `recipe`.

The name is resolved to a `GemmRecipe` by `lpjax.quant.recipes.get` (the one resolver), and
`residuals` (if set) replaces the residual mode of the recipes of the quantized (not kept) layers,
and `forward_only` drops their backward quantization (the "QAF" finish of Chmiel et al. 2025, FP4
All the Way: FP4 forward, high-precision backward).

A training loop builds one policy from its settings (`QuantPolicy.from_settings`), a model
completes it with its architecture (`for_model`: its number of blocks and the layers it always
keeps), and a precision schedule switches recipes by handing the model another policy:
`with_recipe(name)` replaces steps 3-4 and leaves the kept layers alone, except that a kept layer
never runs below an unquantized recipe the run asks for (`kept_recipe`: under "fp32", the
trainer's full-precision evaluation, every layer runs fp32).

Attention products are recognised by name: models call the score product (Q K^T) "attn_scores"
(or "qk") and the value product (P V) "attn_values" (or "pv"); the interception names any other
product of two activations "act_product" (kept in high precision too: no published FP4 recipe
quantizes a GEMM without a weight).

Examples:
  >>> p = QuantPolicy.from_settings("mxfp4", keep_last=1).for_model(num_blocks=4)
  >>> p.recipe_for("layers/0/mlp/up").name, p.recipe_for("embed").name, p.recipe_for("layers/3/attn/q").name
  ('mxfp4', 'auto', 'auto')
  >>> p.recipe_for(("layers", 1, "attn", "attn_scores")).compute_dtype is None   # as given
  True
  >>> QuantPolicy(recipe="mxfp4", high_precision="bf16").recipe_for("lm_head").name
  'bf16'
  >>> p.with_recipe("bf16").recipe_for("layers/0/mlp/up").name
  'bf16'
  >>> QuantPolicy(recipe="mxfp4", pure=True).recipe_for("lm_head").name
  'mxfp4'
  >>> QuantPolicy.from_settings("mxfp4", residuals="quantized").recipe_for("layers/0/up").residuals
  'quantized'
  >>> nv = QuantPolicy.from_settings("nvfp4", keep_last_fraction=0.15,
  ...                                high_precision="bf16").for_model(num_blocks=16)
  >>> nv.kept_last_blocks, nv.recipe_for("layers/13/mlp").name, nv.recipe_for("layers/14/mlp").name
  (2, 'nvfp4', 'bf16')
  >>> qaf = dataclasses.replace(nv, forward_only=True).recipe_for("layers/0/mlp")
  >>> qaf.fwd.lhs.fmt, qaf.dgrad.lhs, qaf.wgrad.rhs
  ('nvfp4', None, None)
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from typing import Sequence, Union

import jax

from lpjax.quant import recipes
from lpjax.quant.numerics import threefry
from lpjax.quant.recipes.gemm_recipe import RESIDUAL_MODES, GemmRecipe, forward_only, with_residuals
# how precise a recipe is, and the recipe a kept layer runs (defined beside GemmRecipe)
from lpjax.quant.recipes.gemm_recipe import kept_recipe, precision_rank  # noqa: F401

RecipeLike = Union[str, GemmRecipe]

# Layers every published FP4 recipe keeps in high precision (docs/numerics.md §7).
# Case-insensitive, and linen's auto-names count ("Embed_0", "LM_Head", "head_1"). The interception
# also keeps, whatever their names, a GEMM whose weight a gather looks rows up in (an embedding
# table, so an embedding product or a tied head).
DEFAULT_HIGH_PRECISION = (
    r"(?i)(^|/)[^/]*embed[^/]*(/|$)",  # token / position embeddings (embed, Embed_0, embed_tokens)
    r"(?i)(^|/)(wte|wpe)(_\d+)?(/|$)",
    r"(?i)(^|/)(lm_head|head|unembed|logits|output_proj)(_\d+)?(/|$)",  # the LM head / classifier
    r"(?i)norm",  # RMSNorm / LayerNorm scales (no GEMM, listed for completeness)
    # products of two activations: attention's score and value products, and any other one
    # ("act_product": an MoE's dispatch / combine, a Gram matrix), as the interception names them
    r"(?i)(^|/)(attn_scores|attn_values|qk|pv|act_product)(/|$)",
)
# A block index in a path: "layers/3", "blocks.3", "layer_3", "h/3".
DEFAULT_BLOCK_PATTERN = r"(?:^|/)(?:layers|blocks|block|layer|h)[/._]?(\d+)(?:[/._]|$)"

def path_str(path) -> str:
  """("layers", 3, "mlp") -> "layers/3/mlp"; strings pass through."""
  if isinstance(path, str):
    return path
  return "/".join(str(getattr(p, "key", getattr(p, "idx", p))) for p in path)


def param_path(path) -> str:
  """A parameter's path as every lpjax surface names it (the interception's sites, `report`,
  `site_stats`, `advise`, rules, the monitor, `export_weights`): its keys "/"-joined (`path_str`;
  a pytree key path is taken too), without a linen variables dict's "params" collection (the
  `m.apply({"params": ...})` a loss may call) and without an NNX Variable's value attribute. So
  one layer has one name whichever way its weights reach lpjax (`quantize_model`, `quantized` on
  a raw `m.apply`, `nnx.state`, a factory model).

  Examples:
    >>> param_path("params/layers_0/up/kernel"), param_path(("up", "kernel"))
    ('layers_0/up/kernel', 'up/kernel')
  """
  if isinstance(path, str):
    names = path.split("/")
  else:
    keys = list(path)
    last = keys[-1] if keys else None
    if (last is not None and not hasattr(last, "key") and not hasattr(last, "idx")
        and getattr(last, "name", None) in ("value", "raw_value")):
      keys = keys[:-1]  # an NNX Variable's value: the path is the variable's
    names = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in keys]
  if len(names) > 1 and names[0] == "params":
    names = names[1:]
  return "/".join(names)


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantPolicy:
  """Per-layer recipes by regex over module paths (first match wins; see the module docstring)."""

  recipe: RecipeLike = "bf16"  # recipe of every quantizable layer no rule matches
  rules: tuple[tuple[str, RecipeLike], ...] = ()  # (regex, recipe), checked in order after the keeps
  high_precision: RecipeLike = "auto"  # recipe of the kept layers; "auto": operands as given
  keep_high_precision: tuple[str, ...] = DEFAULT_HIGH_PRECISION  # regexes of always-hp layers
  keep_first_blocks: int = 0  # this many first blocks stay in high precision
  keep_last_blocks: int = 0  # this many last blocks stay in high precision (needs num_blocks)
  keep_last_fraction: float = 0.0  # or this fraction of the blocks, rounded, >= 1 if > 0 (NVIDIA: 0.15)
  num_blocks: int | None = None  # number of blocks of the model
  block_pattern: str = DEFAULT_BLOCK_PATTERN  # regex with one group: the block index of a path
  pure: bool = False  # quantize everything: no keep_high_precision, no kept blocks
  block_paths: tuple[str, ...] = ()  # regexes, block i = the i-th; if set, replaces block_pattern
  residuals: str = ""  # "" = each recipe's own; else the residual mode of the quantized layers
  forward_only: bool = False  # quantized layers keep only their forward quantization (QAF finish)

  @classmethod
  def from_settings(cls, recipe: RecipeLike = "bf16", *, high_precision: RecipeLike = "auto",
                    pure: bool = False, keep_first: int = 0, keep_last: int = 0,
                    keep_last_fraction: float = 0.0, residuals: str = "",
                    **fields) -> "QuantPolicy":
    """The policy of a training run's quantization settings (the `quant.*` config keys).

    recipe: the recipe of every quantized layer; high_precision: the recipe of the kept layers
    ("auto": each kept GEMM on its operands as given, never below the model's dtype; "bf16":
    cast to bf16, as lpjax's trainer runs its own models);
    pure: quantize the kept layers too; keep_first / keep_last: blocks kept in high precision
    (the model supplies the number of blocks, see `for_model`); keep_last_fraction: the last
    fraction of the blocks kept (the larger of the two counts wins); residuals: "" (the recipe's),
    "high_precision" or "quantized" (FP4-packed GEMM operands saved for the backward pass).
    Other QuantPolicy fields may be given by keyword.
    """
    return cls(recipe=recipe, high_precision=high_precision, pure=pure,
               keep_first_blocks=keep_first, keep_last_blocks=keep_last,
               keep_last_fraction=keep_last_fraction, residuals=residuals, **fields)

  def __post_init__(self):
    object.__setattr__(self, "rules", tuple((str(p), r) for p, r in self.rules))
    object.__setattr__(self, "keep_high_precision", tuple(self.keep_high_precision))
    object.__setattr__(self, "block_paths", tuple(self.block_paths))
    problems = self._problems()
    if problems:
      raise ValueError("Invalid QuantPolicy: " + "; ".join(problems) + ".")

  def _problems(self) -> list[str]:
    """Everything wrong with this policy's fields (checked at construction, reported at once)."""
    problems = []
    for i, rule in enumerate(self.rules):
      problems += _regex_problem(f"rules[{i}] {rule[0]!r}", rule[0])
      problems += _recipe_problem(f"rules[{i}] ({rule[0]!r}) recipe", rule[1])
    for i, p in enumerate(self.keep_high_precision):
      problems += _regex_problem(f"keep_high_precision[{i}]", p)
    problems += _regex_problem("block_pattern", self.block_pattern)
    if not self.block_paths and not problems and re.compile(self.block_pattern).groups < 1:
      problems.append(f"block_pattern {self.block_pattern!r} needs one group (the block index)")
    for i, p in enumerate(self.block_paths):
      problems += _regex_problem(f"block_paths[{i}]", p)
    problems += _recipe_problem("recipe", self.recipe)
    problems += _recipe_problem("high_precision", self.high_precision)
    if not (isinstance(self.keep_first_blocks, int) and isinstance(self.keep_last_blocks, int)
            and self.keep_first_blocks >= 0 and self.keep_last_blocks >= 0):
      problems.append("keep_first_blocks and keep_last_blocks must be >= 0 "
                      f"(got {self.keep_first_blocks!r}, {self.keep_last_blocks!r})")
    if not (isinstance(self.keep_last_fraction, (int, float))
            and 0.0 <= self.keep_last_fraction < 1.0):
      problems.append(f"keep_last_fraction must be in [0, 1), got {self.keep_last_fraction!r}")
    if self.residuals and self.residuals not in RESIDUAL_MODES:
      problems.append(f"residuals must be '' (each recipe's own) or one of {RESIDUAL_MODES}, "
                      f"got {self.residuals!r}")
    return problems

  def for_model(self, *, num_blocks: int | None = None, keep_high_precision: Sequence[str] = (),
                block_paths: Sequence[str] = ()) -> "QuantPolicy":
    """This policy completed by a model: its blocks and the layers it always keeps.

    Models call this when they are built (e.g. a ResNet adds its stem, a U-Net its input and
    output convs). `num_blocks` is what `keep_last` counts back from; a model whose block paths
    carry no index in forward order (a U-Net's encoder, middle and decoder levels) lists one
    regex per block in `block_paths` instead.
    """
    keeps = self.keep_high_precision + tuple(p for p in keep_high_precision
                                             if p not in self.keep_high_precision)
    block_paths = tuple(block_paths) or self.block_paths
    if block_paths:
      num_blocks = len(block_paths)
    return dataclasses.replace(self, num_blocks=num_blocks if num_blocks is not None
                               else self.num_blocks, keep_high_precision=keeps,
                               block_paths=block_paths)

  def with_recipe(self, recipe: RecipeLike | None) -> "QuantPolicy":
    """Every layer this policy quantizes runs `recipe` instead; kept layers stay (None: self).

    This is how a precision schedule switches recipes (warm-up, finish, fallback).
    """
    if recipe is None:
      return self
    return dataclasses.replace(self, recipe=recipe, rules=())

  @property
  def varies_by_block(self) -> bool:
    """True when blocks of one model get different recipes (so they cannot share one scan)."""
    return not self.pure and bool(self.keep_first_blocks or self.keep_last_blocks
                                  or self.keep_last_fraction)

  @property
  def kept_last_blocks(self) -> int:
    """How many last blocks stay in high precision: keep_last_blocks or the fraction's count."""
    n = self.keep_last_blocks
    if self.keep_last_fraction and self.num_blocks is not None:
      n = max(n, max(1, round(self.keep_last_fraction * self.num_blocks)))
    return n

  def kept_high_precision(self, path, *, block: int | None = None) -> bool:
    """True when the policy keeps the layer at `path` in high precision (steps 1-2).

    `block`: the layer's block index when the path does not carry it (a layer of a scanned
    stack of blocks, whose path names the stack once); None reads it from the path.
    """
    if self.pure:
      return False
    path = path_str(path)
    if any(re.search(p, path) for p in self.keep_high_precision):
      return True
    keep_last = self.keep_last_blocks or self.keep_last_fraction
    i = None
    if self.keep_first_blocks or keep_last:
      i = block if block is not None else self.block_index(path)
    if i is not None:
      if keep_last and self.num_blocks is None:
        raise ValueError("keep_last_blocks / keep_last_fraction need num_blocks (the number of "
                         "blocks of the model); models fill it in with "
                         "QuantPolicy.for_model(num_blocks=...).")
      if i < self.keep_first_blocks:
        return True
      if keep_last and i >= self.num_blocks - self.kept_last_blocks:
        return True
    return False

  def block_index(self, path) -> int | None:
    """The index of the block that holds the layer at `path` (None: outside every block)."""
    path = path_str(path)
    if self.block_paths:
      return next((i for i, p in enumerate(self.block_paths) if re.search(p, path)), None)
    m = re.search(self.block_pattern, path)
    return int(m.group(1)) if m else None

  def canonical_path(self, path) -> str:
    """`path` without its block index ("layers/3/mlp/up" -> "layers/mlp/up"): the name that a
    layer shares with its copies in the other blocks, and that a scanned stack of blocks gives it.

    Examples:
      >>> QuantPolicy().canonical_path("layers/3/mlp/up"), QuantPolicy().canonical_path("lm_head")
      ('layers/mlp/up', 'lm_head')
    """
    path = path_str(path)
    if self.block_paths:
      return path
    m = re.search(self.block_pattern, path)
    if m is None:
      return path
    return re.sub(r"//+", "/", path[:m.start(1)] + path[m.end(1):]).strip("/")

  def site_key(self, key, path, block=None):
    """The random key of the GEMM at `path` in block `block` (an int, a traced index, or None:
    read from the path) for one step's `key`: `key` folded with a hash of the canonical path,
    then with the block index. lpjax's layers and the interception (`quantized`,
    `quantize_model`) both derive their stochastic-rounding and RHT keys this way, so a model
    gets the same bits whichever way its GEMMs are quantized, scanned or unrolled, and no two
    sites share bits. None when `key` is None.

    Examples:
      >>> import jax
      >>> p, k = QuantPolicy(), jax.random.key(0)
      >>> bool((jax.random.key_data(p.site_key(k, "layers/2/mlp/up"))
      ...       == jax.random.key_data(p.site_key(k, "layers/mlp/up", block=2))).all())
      True
    """
    if key is None:
      return None
    path = path_str(path)
    if block is None:
      block = self.block_index(path)
    key = threefry.fold_in(key, zlib.crc32(self.canonical_path(path).encode()) & 0x7FFFFFFF)
    return key if block is None else threefry.fold_in(key, block)

  def site_keys(self, key, paths: Sequence, block=None) -> list:
    """`site_key(key, path, block)` of each of `paths`, bit for bit, derived together: each of the
    two folds is one vectorized Threefry hash over all the paths (not one per path), so a block's
    GEMMs cost the compiled step two small hashes, not two per GEMM. A list (None when `key` is).

    Examples:
      >>> import jax
      >>> p, k = QuantPolicy(), jax.random.key(0)
      >>> paths = ["layers/2/mlp/up", "layers/2/attn/q", "lm_head"]
      >>> together = p.site_keys(k, paths)
      >>> all(bool((jax.random.key_data(a) == jax.random.key_data(p.site_key(k, q))).all())
      ...     for a, q in zip(together, paths))
      True
    """
    paths = [path_str(q) for q in paths]
    if key is None:
      return [None] * len(paths)
    blocks = [self.block_index(q) if block is None else block for q in paths]
    crcs = [zlib.crc32(self.canonical_path(q).encode()) & 0x7FFFFFFF for q in paths]
    if len(paths) < 2 or not threefry.is_threefry_key(key):
      return [self.site_key(key, q, b) for q, b in zip(paths, blocks)]
    keys = list(threefry.fold_in_each(key, crcs))
    with_block = [i for i, b in enumerate(blocks) if b is not None]
    if with_block:
      folded = threefry.fold_in_each([keys[i] for i in with_block], [blocks[i] for i in with_block])
      for i, k in zip(with_block, folded):
        keys[i] = k
    return keys

  def recipe_for(self, path, *, block: int | None = None) -> GemmRecipe:
    """The GemmRecipe of the layer at `path` (a "/"-joined string or a tuple of keys); `block`
    as in `kept_high_precision`."""
    path = path_str(path)
    own = recipes.get(self._rule_or_default(path))
    if self.kept_high_precision(path, block=block):
      return kept_recipe(recipes.get(self.high_precision), own)
    recipe = own
    if self.residuals and not recipe.is_high_precision and recipe.residuals != self.residuals:
      recipe = with_residuals(recipe, self.residuals)
    if self.forward_only and not recipe.is_high_precision:
      recipe = forward_only(recipe)
    return recipe

  def own_recipe(self, path) -> GemmRecipe:
    """The recipe of the layer at `path` before any keep (steps 3-4): its rule's, or `recipe`.

    Examples:
      >>> QuantPolicy(recipe="mxfp4").own_recipe("lm_head").name
      'mxfp4'
    """
    return recipes.get(self._rule_or_default(path_str(path)))

  def kept_recipe_for(self, path) -> GemmRecipe:
    """The recipe the layer at `path` runs when something keeps it in high precision (the
    policy, or the interception: an embedding table, a contraction too short for the recipe):
    `kept_recipe` of `high_precision` and the layer's own recipe."""
    path = path_str(path)
    return kept_recipe(recipes.get(self.high_precision), recipes.get(self._rule_or_default(path)))

  def _rule_or_default(self, path: str) -> RecipeLike:
    for pattern, recipe in self.rules:
      if re.search(pattern, path):
        return recipe
    return self.recipe

  def describe(self, paths: Sequence) -> str:
    """A table 'path -> recipe' (e.g. to log once at the start of training)."""
    rows = [(path_str(p), str(self.recipe_for(p))) for p in paths]
    width = max([len(p) for p, _ in rows] + [4])
    return "\n".join(f"{p:<{width}}  {r}" for p, r in rows)


def _regex_problem(what: str, pattern) -> list[str]:
  try:
    re.compile(pattern)
  except (re.error, TypeError) as e:
    return [f"{what}: bad regex {pattern!r} ({e})"]
  return []


def _recipe_problem(what: str, recipe) -> list[str]:
  try:
    recipes.get(recipe)
  except (ValueError, TypeError, KeyError) as e:
    return [f"{what}: {e}".rstrip(".")]
  return []
