"""`quant.rules`: per-path recipes of a training run, written as one config string.

The grammar: entries separated by ";", each `REGEX->RECIPE` (split at the entry's last "->";
spaces around an entry, its regex and its recipe are dropped; an empty entry is skipped). RECIPE
is what `quant.recipe` takes: a preset name or a variant "<preset>:key=value,..." (variants hold
"=", ":" and ",", never ";" or "->"). REGEX is searched (`re.search`) in a layer's path; a ";"
inside a regex is written `\\x3b`. The rules become `QuantPolicy.rules`, in order: the first
rule whose regex matches a layer gives its recipe, after the policy's keeps (embeddings, head,
kept blocks stay in high precision whatever the rules say).

Paths are the policy's: "layers/3/mlp/down_proj" for an unrolled LLaMA; a scanned LLaMA
(model.scan_layers, the default) names each layer once for all its blocks, "layers/mlp/down_proj",
so a rule there applies to every block, and a rule naming one block cannot be honoured. A rule
that matches no GEMM site of the model is a ConfigError at start-up (`check_rules_match`), naming
the nearest site paths; <workdir>/quant_report.txt lists every site and what it ran.

    python train.py --config=configs/llama_tiny_mxfp4.py \\
        --config.quant.rules='^layers/mlp/down_proj$->bf16;^layers/attn/o_proj$->mxfp8'

Examples:
  >>> parse_rules("^layers/mlp/down_proj$->bf16; attn/(q|k)_proj->mxfp4:block_size=16")
  (('^layers/mlp/down_proj$', 'bf16'), ('attn/(q|k)_proj', 'mxfp4:block_size=16'))
  >>> format_rules(parse_rules("a->bf16;b->mxfp8")), parse_rules("")
  ('a->bf16;b->mxfp8', ())
  >>> parse_rules("down_proj=bf16")
  Traceback (most recent call last):
  ...
  ValueError: quant.rules entry 1 'down_proj=bf16' has no '->': write each entry as REGEX->RECIPE, entries separated by ';' (e.g. '^layers/mlp/down_proj$->bf16;^lm_head$->mxfp8').
"""

from __future__ import annotations

import re

SEPARATOR = ";"  # between entries
ARROW = "->"  # between an entry's regex and its recipe
EXAMPLE = "^layers/mlp/down_proj$->bf16;^lm_head$->mxfp8"


def parse_rules(text: str) -> tuple[tuple[str, str], ...]:
  """((regex, recipe), ...) of a `quant.rules` string; ValueError names a malformed entry (no
  "->", an empty regex or recipe). Regexes and recipes are checked by `rule_problems`."""
  if not isinstance(text, str):
    raise ValueError(f"quant.rules must be a string 'REGEX->RECIPE;...', got {text!r}.")
  rules = []
  for i, entry in enumerate(text.split(SEPARATOR), 1):
    entry = entry.strip()
    if not entry:
      continue
    regex, arrow, recipe = entry.rpartition(ARROW)
    regex, recipe = regex.strip(), recipe.strip()
    if not arrow:
      raise ValueError(f"quant.rules entry {i} {entry!r} has no '{ARROW}': write each entry as "
                       f"REGEX{ARROW}RECIPE, entries separated by '{SEPARATOR}' (e.g. "
                       f"{EXAMPLE!r}).")
    if not regex or not recipe:
      raise ValueError(f"quant.rules entry {i} {entry!r} has an empty "
                       f"{'regex' if not regex else 'recipe'}: write REGEX{ARROW}RECIPE (e.g. "
                       f"{EXAMPLE!r}).")
    rules.append((regex, recipe))
  return tuple(rules)


def format_rules(rules) -> str:
  """The `quant.rules` string of ((regex, recipe name), ...): `parse_rules`'s inverse."""
  entries = []
  for regex, recipe in rules:
    if not isinstance(recipe, str):
      raise ValueError(f"A rule's recipe must be a name to be written in quant.rules, got "
                       f"{recipe!r} for {regex!r}.")
    regex = regex.replace(SEPARATOR, r"\x3b")  # the same regex, without the separator
    if regex != regex.strip() or ARROW in recipe or SEPARATOR in recipe:
      raise ValueError(f"The rule ({regex!r}, {recipe!r}) cannot be written in quant.rules "
                       "(spaces around its regex, or '->' / ';' in its recipe).")
    entries.append(f"{regex}{ARROW}{recipe}")
  return SEPARATOR.join(entries)


def rule_problems(text: str, canonical_recipe) -> tuple[list[str], tuple]:
  """(problems, rules with canonical recipe names) of a `quant.rules` string: each problem names
  its entry and the fix. `canonical_recipe(name)` -> the recipe name lpjax knows, or None."""
  try:
    rules = parse_rules(text)
  except ValueError as e:
    return [str(e)], ()
  problems, out = [], []
  for i, (regex, recipe) in enumerate(rules, 1):
    entry = f"quant.rules entry {i} '{regex}{ARROW}{recipe}'"
    try:
      re.compile(regex)
    except re.error as e:
      problems.append(f"{entry}: bad regex {regex!r} ({e}); fix the regex (Python `re` syntax, "
                      "searched in the layer's path, e.g. '^layers/mlp/down_proj$').")
    name = canonical_recipe(recipe)
    if name is None:
      from lpjax.quant import recipes  # noqa: PLC0415

      problems.append(f"{entry}: unknown recipe {recipe!r}; valid: {', '.join(recipes.NAMES)} "
                      "(in any case), or a variant '<preset>:key=value,...' such as "
                      "'mxfp4:block_size=16'.")
    out.append((regex, name or recipe))
  return problems, tuple(out)


def check_rules_match(text: str, report) -> None:
  """A ConfigError naming each `quant.rules` entry that matches no site of `report` (the run's
  `lpjax.quant.Report`; None: nothing to check), with the nearest site paths and, for a block of
  a scanned stack, why it cannot be honoured and the fix. Only the user's rules are checked: the
  policy's own keep list legitimately misses in some models."""
  if report is None:
    return
  from lpjax.quant.intercept import rule_check  # noqa: PLC0415
  from lpjax.train.schema._config_schema import ConfigError  # noqa: PLC0415

  problems = []
  for i, (regex, recipe) in enumerate(parse_rules(text), 1):
    if rule_check.unmatched(((regex, recipe),), report.sites):
      problems.append(f"quant.rules entry {i} '{regex}{ARROW}{recipe}' matches no GEMM site of "
                      f"this model, so it would change nothing: "
                      f"{rule_check.explain(regex, report.sites)}")
  if problems:
    raise ConfigError("; ".join(problems) + ". Fix or drop the entry (quant_report.txt of a run "
                      "lists every site path).")

