"""Recipe variants from a string: `"<preset>"` or `"<preset>:key=value,key=value"`.

Every row of an ablation is a preset of `lpjax.quant.recipes` with a few knobs turned, and can be
reproduced from the command line:

    python train.py --config=configs/llama_tiny_mxfp4.py --config.quant.recipe='mxfp4:block_size=16'

`parse(spec)` (also reached through `recipes.get(spec)` and the `quant.recipe` config field)
returns the preset's `GemmRecipe` with the modifiers applied; its `name` is the spec (whitespace
removed). The modifiers, each allowed once:

| key | values | what changes |
|---|---|---|
| gemms | all, fwd, bwd, or a "+"-joined subset of fwd, dgrad, wgrad | the GEMMs not named become high precision (both operands None); bwd = dgrad+wgrad |
| operands | all, or a "+"-joined subset of x, w, dy | the tensors not named stay high precision in every GEMM: x is fwd.lhs and wgrad.lhs, w is fwd.rhs and dgrad.rhs, dy is dgrad.lhs and wgrad.rhs; a GEMM keeps its RHT while one of its operands is quantized |
| grad_rounding | nearest_even, nearest_away, toward_zero, toward_positive, toward_negative, stochastic | the rounding of the gradient operand dY (dgrad.lhs and wgrad.rhs) only; its scale rule and SR pre-scale stay |
| block_size | a positive int (16, 32, 64, ...) | the block (tile edge for 16x16-tiled weights) of every quantized operand |
| scale | e8m0, ue4m3, fp32 | the block-scale format of every quantized operand (docs/numerics.md §2) |
| granularity | block, channel, tensor, fixed | one scale per block, per row of the contraction axis, per tensor, or a fixed one |
| fixed_exponent | an int in [-127, 127] (default 0) | with granularity=fixed: the fixed scale 2**k |
| gemm_impl | auto, xla, pallas | how FP4 GEMMs with both operands quantized run: emulated (xla), the exact FP4 GEMM kernel (pallas), or the kernel where it measured faster (auto, the default; docs/gemm.md) |

Format modifiers (`block_size`, `scale`, `granularity`, `fixed_exponent`) rewrite the
`QuantFormat` of every quantized operand of every GEMM and keep its element format. Their rules:

- `scale=ue4m3` (e2m1 elements only: the ue4m3 path computes NVFP4's scales, docs/numerics.md §5)
  turns on the fp32 per-tensor second level (as NVFP4 and `mxfp4_e4m3scale`: without it an E4M3
  scale cannot go below 2^-9 and gradient blocks flush to zero); a scale other than e8m0 drops the
  e8m0 scale rule (`scale_mode`), and `scale=e8m0` from another scale uses the OCP floor rule.
  The SR pre-scale stays as the preset has it.
- `granularity=channel` and `granularity=tensor` use one fp32 scale from the current amax
  (`fl32(max_elem / amax)`, as the fp8 presets), unless `scale=` is given too;
  `granularity=block` keeps the preset's scale.
- `granularity=fixed` is a scale that does not follow the data: e8m0, one per tensor, always
  2**fixed_exponent (2**0 = 1 by default), so the operand is cast onto the element grid times
  2**k with saturation at the largest element (FP4: values beyond ±6 * 2**k clip,
  |x| <= 0.25 * 2**k round to zero). NaN or Inf still make the tensor NaN (docs/numerics.md §4).
- `block_size` applies to block granularity only (a preset that is per tensor, like fp8, needs
  `granularity=block` too).

Modifiers apply in a fixed order, whatever their order in the spec: gemms, operands, then the format
modifiers, then grad_rounding. A modifier that would change nothing that exists (a high-precision
preset, an SSP quantizer, no quantized gradient operand) is an error, as is an unknown key or value.

Examples:
  >>> r = parse("mxfp4_naive:grad_rounding=toward_zero")
  >>> r.name, r.dgrad.lhs.rounding, r.wgrad.rhs.rounding, r.fwd.lhs.rounding, r.dgrad.rhs.rounding
  ('mxfp4_naive:grad_rounding=toward_zero', 'toward_zero', 'toward_zero', 'nearest_even', 'nearest_even')
  >>> [parse("mxfp4:block_size=16").fwd.lhs.format.block_size, parse("mxfp4").fwd.lhs.format.block_size]
  [16, 32]
  >>> f = parse("mxfp4:scale=ue4m3").dgrad.lhs.format
  >>> f.element.name, f.scale, f.block_size, f.tensor_scale
  ('e2m1', 'ue4m3', 32, True)
  >>> r = parse("mxfp4:gemms=fwd")
  >>> r.fwd.lhs.format.name, r.dgrad.lhs, r.wgrad.rhs
  ('mxfp4', None, None)
  >>> parse("mxfp4:gemms=bwd").fwd.lhs is None, parse("nvfp4:gemms=fwd+wgrad").dgrad.lhs
  (True, None)
  >>> r = parse("mxfp4:operands=dy")  # only the gradient: dgrad.lhs and wgrad.rhs
  >>> r.fwd.lhs, r.fwd.rhs, r.dgrad.rhs, r.wgrad.lhs, r.dgrad.lhs.format.name, r.wgrad.rhs.rounding
  (None, None, None, None, 'mxfp4', 'stochastic')
  >>> f = parse("mxfp4_naive:granularity=tensor").fwd.lhs.format
  >>> f.scale, f.granularity
  ('fp32', 'tensor')
  >>> parse("mxfp4_naive:granularity=channel").wgrad.lhs.format.granularity
  'channel'
  >>> f = parse("mxfp4_naive:granularity=fixed,fixed_exponent=-3").fwd.rhs.format
  >>> f.scale, f.granularity, f.fixed_scale_exponent
  ('e8m0', 'tensor', -3)
  >>> parse("mxfp4:blocksize=16")
  Traceback (most recent call last):
  ...
  ValueError: Recipe spec 'mxfp4:blocksize=16': unknown modifier 'blocksize'. Did you mean 'block_size'? ...
"""

from __future__ import annotations

import dataclasses
import difflib

from lpjax.quant.formats import specs as formats
from lpjax.quant.recipes import presets
from lpjax.quant.recipes.gemm_recipe import GEMMS, REUSE_FWD, GemmQuant, GemmRecipe, OperandQuant

GRANULARITIES = ("block", "channel", "tensor", "fixed")
GEMM_SETS = ("all", "fwd", "bwd", "<gemm>+<gemm>... of fwd, dgrad, wgrad")
# The gradient operand dY: lhs of dgrad (dX = dY W^T), rhs of wgrad (dW = X^T dY); docs/numerics.md §7.
GRAD_OPERANDS = (("dgrad", "lhs"), ("wgrad", "rhs"))
# The tensor each operand of the three GEMMs holds: Y = X W, dX = dY W^T, dW = X^T dY.
TENSORS = {"x": (("fwd", "lhs"), ("wgrad", "lhs")), "w": (("fwd", "rhs"), ("dgrad", "rhs")),
           "dy": GRAD_OPERANDS}


class _Error(ValueError):
  """A problem with one modifier; `parse` prefixes the spec."""


def _parse_gemms(value: str) -> tuple[str, ...]:
  if value == "all":
    return GEMMS
  if value == "bwd":
    return ("dgrad", "wgrad")
  parts = value.split("+")
  if all(p in GEMMS for p in parts) and len(set(parts)) == len(parts):
    return tuple(g for g in GEMMS if g in parts)
  raise _Error(f"gemms={value!r} is not valid; valid: {', '.join(GEMM_SETS)} (e.g. 'fwd+dgrad').")


def _parse_operands(value: str) -> tuple[str, ...]:
  if value == "all":
    return tuple(TENSORS)
  parts = value.split("+")
  if all(p in TENSORS for p in parts) and len(set(parts)) == len(parts):
    return tuple(t for t in TENSORS if t in parts)
  raise _Error(f"operands={value!r} is not valid; valid: all, or a '+'-joined subset of "
               f"{', '.join(TENSORS)} (e.g. 'x+w').")


def _choice(key, valid):
  def parse_value(value):
    if value not in valid:
      close = difflib.get_close_matches(value, valid, n=1)
      hint = f" Did you mean {close[0]!r}?" if close else ""
      raise _Error(f"{key}={value!r} is not valid.{hint} Valid: {', '.join(valid)}.")
    return value
  return parse_value


def _integer(key, low, high, example):
  def parse_value(value):
    try:
      number = int(value)
    except ValueError:
      number = None
    if number is None or not low <= number <= high:
      raise _Error(f"{key}={value!r} is not valid; valid: an integer in [{low}, {high}], e.g. {example}.")
    return number
  return parse_value


# key -> value parser, in the order the keys are listed (application order is fixed in _apply).
MODIFIERS = {
    "gemms": _parse_gemms,
    "operands": _parse_operands,
    "grad_rounding": _choice("grad_rounding", formats.ROUNDING_MODES),
    "block_size": _integer("block_size", 1, 1 << 16, "16, 32 or 64"),
    "scale": _choice("scale", formats.SCALE_FORMATS),
    "granularity": _choice("granularity", GRANULARITIES),
    "fixed_exponent": _integer("fixed_exponent", -127, 127, "0 (scale 1) or -4"),
    "gemm_impl": _choice("gemm_impl", ("auto", "xla", "pallas")),
}
FORMAT_KEYS = ("block_size", "scale", "granularity", "fixed_exponent")


def _ops(recipe: GemmRecipe):
  """(gemm, side, operand) for every operand of the recipe."""
  for gemm in GEMMS:
    g = getattr(recipe, gemm)
    yield gemm, "lhs", g.lhs
    yield gemm, "rhs", g.rhs


def _replace_ops(recipe: GemmRecipe, fn) -> GemmRecipe:
  """The recipe with fn(gemm, side, op) in place of every operand."""
  new = {}
  for gemm in GEMMS:
    g = getattr(recipe, gemm)
    new[gemm] = GemmQuant(lhs=fn(gemm, "lhs", g.lhs), rhs=fn(gemm, "rhs", g.rhs))
  return dataclasses.replace(recipe, **new)


def _quantized(op) -> bool:
  return isinstance(op, OperandQuant)


def _format_name(f: formats.QuantFormat) -> str:
  if f.granularity == "block":
    shape = f"t{f.block_size}x{f.block_size}" if f.tile else f"b{f.block_size}"
  elif f.fixed_scale_exponent is not None:
    shape = f"fixed{f.fixed_scale_exponent}"
  else:
    shape = f.granularity
  return f"{f.element.name}_{f.scale}_{shape}"


def rewrite_format(f: formats.QuantFormat, mods: dict) -> formats.QuantFormat:
  """`f` with the format modifiers of `mods` applied (the rules of the module docstring)."""
  granularity = mods.get("granularity", "tensor" if f.fixed_scale_exponent is not None else f.granularity)
  fixed = granularity == "fixed"
  if "fixed_exponent" in mods and not fixed:
    raise _Error("fixed_exponent needs granularity=fixed.")
  if fixed:
    granularity, default_scale = "tensor", "e8m0"
  elif "granularity" in mods and granularity != "block":
    default_scale = "fp32"
  else:
    default_scale = f.scale
  scale = mods.get("scale", default_scale)
  if scale == "ue4m3" and f.scale != "ue4m3" and f.element.name != "e2m1":
    raise _Error(f"scale=ue4m3 uses NVFP4's scale formulas (block amax mapped onto 6, docs/numerics.md "
                 f"§5), defined for e2m1 elements, not {f.element.name}.")
  if fixed and scale != "e8m0":
    raise _Error(f"granularity=fixed is a power-of-two (e8m0) scale; drop scale={scale}.")
  if "block_size" in mods and granularity != "block":
    raise _Error(f"block_size applies to block granularity; format {f} is per {granularity} "
                 "(add granularity=block).")
  block_size = mods.get("block_size", f.block_size or 32) if granularity == "block" else None
  tensor_scale = (f.tensor_scale if f.scale == "ue4m3" else True) if scale == "ue4m3" else False
  new = formats.QuantFormat(
      element=f.element, scale=scale, block_size=block_size, granularity=granularity,
      tile=f.tile and granularity == "block", tensor_scale=tensor_scale,
      fixed_scale_exponent=mods.get("fixed_exponent", 0) if fixed else None)
  return dataclasses.replace(new, name=_format_name(new))


def _apply(recipe: GemmRecipe, mods: dict) -> GemmRecipe:
  quantized = [(gemm, side, op) for gemm, side, op in _ops(recipe) if _quantized(op)]
  if not quantized:
    raise _Error(f"preset {recipe.name!r} has no quantized operand to modify; start from a "
                 "quantized preset (e.g. mxfp4, nvfp4, mxfp4_naive).")

  if "gemms" in mods:
    if any(op == REUSE_FWD for _, _, op in _ops(recipe)):
      raise _Error(f"gemms cannot be changed on {recipe.name!r}: its backward GEMMs reuse the "
                   "forward's quantized operands (REUSE_FWD).")
    keep = mods["gemms"]
    recipe = dataclasses.replace(recipe, **{g: GemmQuant() for g in GEMMS if g not in keep})
    if recipe.is_high_precision:
      raise _Error(f"gemms={'+'.join(keep)} leaves no quantized operand in this preset.")

  if "operands" in mods:
    if any(op == REUSE_FWD for _, _, op in _ops(recipe)):
      raise _Error(f"operands cannot be changed on {recipe.name!r}: its backward GEMMs reuse the "
                   "forward's quantized operands (REUSE_FWD).")
    kept = {place for t in mods["operands"] for place in TENSORS[t]}
    recipe = _replace_ops(recipe, lambda g, s, op: op if (g, s) in kept else None)
    if recipe.is_high_precision:
      raise _Error(f"operands={'+'.join(mods['operands'])} leaves no quantized operand in this "
                   "recipe (check gemms= too).")

  format_mods = {k: mods[k] for k in FORMAT_KEYS if k in mods}
  if format_mods:
    def rewrite(gemm, side, op):
      if not _quantized(op):
        return op
      if op.is_ssp:
        raise _Error(f"{gemm}.{side} uses the SSP quantizer {op.fmt!r}, which has its own groups "
                     "and scales; format modifiers apply to core formats only.")
      f = rewrite_format(op.format, format_mods)
      scale_mode = op.scale_mode if f.scale == "e8m0" and op.format.scale == "e8m0" else None
      return dataclasses.replace(op, fmt=f, scale_mode=scale_mode)
    recipe = _replace_ops(recipe, rewrite)

  if "grad_rounding" in mods:
    grads = [(g, s) for g, s in GRAD_OPERANDS if _quantized(getattr(getattr(recipe, g), s))]
    if not grads:
      raise _Error("grad_rounding: this recipe has no quantized gradient operand (dY of dgrad or "
                   "wgrad).")
    recipe = _replace_ops(recipe, lambda g, s, op: dataclasses.replace(op, rounding=mods["grad_rounding"])
                          if (g, s) in grads else op)
  if "gemm_impl" in mods:
    recipe = dataclasses.replace(recipe, gemm_impl=mods["gemm_impl"])
  return recipe


def split(spec: str) -> tuple[str, dict[str, str]]:
  """("<preset>", {key: raw value}) of a spec, whitespace removed; checks the syntax and keys."""
  if not isinstance(spec, str):
    raise TypeError(f"A recipe spec is a string, got {type(spec).__name__}.")
  text = "".join(spec.split())
  preset, sep, rest = text.partition(":")
  raw = {}
  if sep:
    if not rest:
      raise ValueError(f"Recipe spec {spec!r}: nothing after ':'; write '<preset>:key=value,...', "
                       "e.g. 'mxfp4:block_size=16', or the preset name alone.")
    for item in rest.split(","):
      key, eq, value = item.partition("=")
      if not eq or not key or not value:
        raise ValueError(f"Recipe spec {spec!r}: {item!r} is not key=value; e.g. "
                         "'mxfp4_naive:grad_rounding=stochastic,block_size=16'.")
      if key not in MODIFIERS:
        close = difflib.get_close_matches(key, list(MODIFIERS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"Recipe spec {spec!r}: unknown modifier {key!r}.{hint} Valid: "
                         f"{', '.join(MODIFIERS)}.")
      if key in raw:
        raise ValueError(f"Recipe spec {spec!r}: modifier {key!r} is given twice.")
      raw[key] = value
  return preset, raw


def parse(spec: str) -> GemmRecipe:
  """The GemmRecipe of `spec` ("<preset>" or "<preset>:key=value,..."); its name is the spec."""
  preset, raw = split(spec)
  base = presets.preset(preset)  # raises ValueError naming the presets
  if not raw:
    return base
  name = "".join(spec.split())
  try:
    mods = {key: MODIFIERS[key](value) for key, value in raw.items()}
    recipe = _apply(base, mods)
  except _Error as e:
    raise ValueError(f"Recipe spec {spec!r}: {e}") from None
  except ValueError as e:  # a combination the recipe dataclasses reject
    raise ValueError(f"Recipe spec {spec!r} gives an invalid recipe: {e}") from e
  return dataclasses.replace(recipe, name=name)
