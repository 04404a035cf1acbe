"""Preset GEMM recipes from the literature: `get(name)` and `NAMES` (public: `lpjax.quant.recipes`).

Stands on `formats` and `schemes`. Modules: `gemm_recipe` (`GemmRecipe`, `GemmQuant`,
`OperandQuant`: recipes as data), `presets` (one builder per preset below), `variants` (the
"<preset>:key=value" grammar, docs/gemm.md).

| name | fwd (X, W) | dgrad (dY, W) | wgrad (X, dY) | source |
|---|---|---|---|---|
| fp32 | fp32 | fp32 | fp32 | baseline |
| bf16 | bf16 | bf16 | bf16 | mixed precision (Micikevicius et al. 2018) |
| fp8 | e4m3, e4m3 tensor | e5m2, e4m3 | e4m3, e5m2 | TE Float8CurrentScaling(HYBRID) |
| mxfp8 | MXFP8 e4m3 (rceil) | same | same | TE MXFP8BlockScaling; Mishra et al. 2025 |
| mxfp4 | MXFP4 RTN + RHT-32 | MXFP4 SR x3/4 (rceil) + RHT-32 | same | Quartet (Castro et al. 2025) |
| quartet | QuEST MXFP4 (RMS scale, trust mask) + H-32 | MXFP4 SR x3/4 + RHT-32 of dY and fwd Q(W) | same, fwd Q(X) | Quartet (Castro et al. 2025) |
| mxfp4_bwd | bf16 | MXFP4 SR x3/4 (rceil) + RHT-64 | same | Tseng et al. 2025 |
| nvfp4 | NVFP4 1x16, W 16x16 | dY SR, W 16x16 | RHT-16, dY SR | NVIDIA NVFP4 paper 2025 |
| mxfp4_e4m3scale | e2m1 / ue4m3 @32 RTN + RHT-32 | SR + RHT-32 | same | E4M3-vs-E8M0 ablation |
| mxfp4_naive | MXFP4 RTN | MXFP4 RTN | MXFP4 RTN | naive baseline |
| nvfp4_4over6 | nvfp4 with Four over Six block scales | same | same | Cook et al. 2025 |
| quartet2 | NVFP4 1x16 4/6 RTN (ties away) | MS-EDEN + RHT-128, W from fwd Q(W) | MS-EDEN + RHT-128, X from fwd Q(X) | Quartet II 2026 |
| nvfp4_bwd_ms_eden | bf16 | MS-EDEN + RHT-128 | same | Quartet II 2026 (backward only) |
| ssp_fp4 | SSP FP4 g256 top-2 | bf16 dY, fwd Q(W) | fwd Q(X), bf16 dY | Stable-SPAM paper |
| ssp_int4 | int4 X, uint4 W g256 | bf16 dY, fwd Q(W) | fwd Q(X), bf16 dY | Stable-SPAM paper |

Besides the presets, "auto" (`presets.AUTO`, not in `NAMES`) is the "as given" recipe: no
quantization and no cast, each GEMM on its operands' own dtype (the original program's GEMM).
It is `QuantPolicy`'s default `high_precision`, so a kept layer never runs below the model's own
dtype.

Every quantized preset computes in bf16 (fake-quantized operands cast to bf16, fp32 accumulation)
and keeps high-precision residuals; use `dataclasses.replace(get(name), residuals="quantized")` for
the memory-saving path.

Examples:
  >>> r = get("nvfp4")
  >>> r.fwd.rhs.fmt, r.dgrad.lhs.rounding, r.wgrad.hadamard_block, r.fwd.hadamard_block
  ('nvfp4_16x16', 'stochastic', 16, None)
  >>> "mxfp4_bwd" in NAMES
  True
  >>> get("mxfp4:block_size=16").fwd.lhs.format.block_size   # a variant (lpjax.quant.recipes.variants)
  16
"""

from __future__ import annotations

from lpjax.quant.recipes import presets, variants
from lpjax.quant.recipes.gemm_recipe import GemmRecipe
from lpjax.quant.recipes.presets import _BUILDERS, BF16, NAMES  # noqa: F401 (the module's table)

# What the rest of lpjax uses (docs/api.md): `get`, `NAMES`; the dataclasses live in
# `gemm_recipe`, the builders in `presets`, the "<preset>:key=value" grammar in `variants`.
_VARIANTS: dict[str, GemmRecipe] = {}


def get(name: str) -> GemmRecipe:
  """The preset recipe `name` (one of `NAMES`, or "auto": the operands as given), or a variant "<preset>:key=value,..." (see
  docs/gemm.md, "Recipe variants"); a GemmRecipe passes through unchanged. This is lpjax's one
  recipe resolver: QuantPolicy, dot_general and the config validation all call it."""
  if isinstance(name, GemmRecipe):
    return name
  if not isinstance(name, str):
    raise TypeError(f"A recipe is a GemmRecipe or a preset name ({', '.join(NAMES)}), got "
                    f"{type(name).__name__} {name!r}.")
  if ":" in name:
    if name not in _VARIANTS:
      _VARIANTS[name] = variants.parse(name)
    return _VARIANTS[name]
  return presets.preset(name)
