"""Rules that match no GEMM call site: found, and explained with the nearest site paths.

A `QuantPolicy` rule is a regex searched in each site's path; one that matches no site changes
nothing, silently (a misspelled path, a block index of a scanned stack, a parameter's name
instead of its layer's). `unmatched` finds such rules among those a user gave (a policy's own
keep list legitimately misses in some models: attention names in an MLP); `explain` says, for one
of them, which site paths come nearest (difflib) and why it may have missed:

- a scanned stack of blocks (`nn.scan`, `nnx.scan`, lpjax's LLaMA with model.scan_layers) names
  each of its layers once, for all blocks ("layers/mlp/down_proj", block "scan"): a rule naming
  one block ("layers/3/mlp/down_proj") cannot be honoured there;
- a site's path is its layer's, without the parameter's leaf name ("/kernel", "/bias");
- paths are matched case-sensitively.

Examples:
  >>> from types import SimpleNamespace as S
  >>> sites = [S(path="layers/mlp/down_proj", block="scan"), S(path="lm_head", block="")]
  >>> unmatched([("^layers/3/mlp/down_proj$", "bf16"), ("^lm_head$", "bf16")], sites)
  (('^layers/3/mlp/down_proj$', 'bf16'),)
  >>> print(explain("^layers/3/mlp/down_proj$", sites))   # doctest: +ELLIPSIS
  nearest site paths: layers/mlp/down_proj, lm_head; it names block 3 of the scanned stack...
"""

from __future__ import annotations

import difflib
import re
from typing import Sequence

_NEAREST = 3  # site paths named in a message


def matches(regex: str, path: str) -> bool:
  return re.search(regex, path) is not None


def unmatched(rules: Sequence, sites: Sequence) -> tuple:
  """The rules (regex, recipe) whose regex matches the path of none of `sites`."""
  paths = {s.path for s in sites}
  return tuple(r for r in rules if not any(matches(r[0], p) for p in paths))


def _literal(regex: str) -> str:
  """The plain text of a regex, for distances: anchors and escapes dropped."""
  return re.sub(r"\\(.)", r"\1", regex.lstrip("^").rstrip("$")).replace("(?i)", "")


def nearest(regex: str, paths: Sequence[str], n: int = _NEAREST) -> list[str]:
  """The `n` site paths nearest to `regex`'s text (difflib ratio, best first)."""
  text = _literal(regex)
  unique = sorted(set(paths))
  ranked = sorted(unique, key=lambda p: -difflib.SequenceMatcher(None, text, p).ratio())
  return ranked[:n]


def _with_block(path: str, index: int) -> str:
  head, _, rest = path.partition("/")
  return f"{head}/{index}/{rest}" if rest else f"{head}/{index}"


def explain(regex: str, sites: Sequence) -> str:
  """Why `regex` matches no site, for a message: the nearest site paths and, where one applies,
  the likely cause and its fix."""
  paths = sorted({s.path for s in sites})
  if not paths:
    return "the model has no GEMM call site"
  text = f"nearest site paths: {', '.join(nearest(regex, paths))}"
  scanned = sorted({s.path for s in sites if s.block == "scan"})
  for index in sorted({int(i) for i in re.findall(r"\d+", regex)}):
    hit = next((p for p in scanned if matches(regex, _with_block(p, index))), None)
    if hit is not None:
      return (f"{text}; it names block {index} of the scanned stack that holds {hit!r}: a scanned "
              f"stack's blocks share one path (block 'scan' in the report), so a rule applies to "
              f"all of its blocks or none. Write {'^' + re.escape(hit) + '$'!r} for every block; "
              "to give one block its own recipe unroll the stack (lpjax's LLaMA: "
              "model.scan_layers=False; your own model: a Python loop instead of nn.scan / "
              "nnx.scan), or keep the first / last blocks with keep_first / keep_last "
              "(quant.keep_first, quant.keep_last)")
  blocks = {int(s.block) for s in sites if str(s.block).isdigit()}
  beyond = [i for i in (int(n) for n in re.findall(r"\d+", regex)) if blocks and i > max(blocks)]
  if beyond:
    return f"{text}; it names block {beyond[0]}, and the model's blocks are 0-{max(blocks)}"
  for leaf in ("kernel", "bias", "weight", "scale", "embedding", "w", "b"):
    if any(matches(regex, f"{p}/{leaf}") for p in paths):
      return (f"{text}; a site's path is its layer's, without the parameter's name: drop the "
              f"trailing '/{leaf}'")
  if any(re.search(regex, p, re.IGNORECASE) for p in paths):
    return f"{text}; paths are matched case-sensitively: write the path's own case, or prefix (?i)"
  return text
