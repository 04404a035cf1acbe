"""lpjax.quant: low-precision number formats, exact quantizers, and quantized GEMMs.

This is the public API of the package (everything a user calls is listed in `__all__` and in
docs/quant.md and docs/gemm.md). The numerics follow the project's contract, docs/numerics.md.
This package does not import Flax, nor anything of lpjax above it (lpjax.pallas, nn, models,
train), not even by name.

Inside, the layers, each importing only those before it (tests/test_architecture.py):

| layer | what it is |
|---|---|
| `backends` | the registries that higher packages fill: kernel backends, model adapters |
| `numerics/` | exact float32 arithmetic on bit patterns, the stochastic-rounding hash |
| `formats/` | format specs, decode tables, FP4 packing, scaling-group layout |
| `codec/` | QArray, quantize / dequantize, block scales (exact and fast), the fast element path |
| `schemes/` | the papers' quantizers: Hadamard, QuEST, NVFP4 4/6 and MS-EDEN, SSP |
| `recipes/` | GemmRecipe, the presets, the variant grammar (`recipes` is public) |
| `policy` | QuantPolicy: which call site gets which recipe |
| `gemm/` | quantized dot_general / einsum / conv, kernel dispatch, FP4 weight gather |
| `intercept/` | any function's or model's GEMMs through a policy |
| `monitor/` | per-site numerics of the quantized GEMMs, and the precision advisor |
| `export` | the packed weights a policy's forward GEMMs multiply, for serving |

Each sub-package's docstring says what it offers to the rest of lpjax (lpjax.pallas and lpjax.nn
use those modules); the names re-exported here are the API users call.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lpjax import quant
  >>> x = jax.random.normal(jax.random.key(0), (4, 64))
  >>> q = quant.quantize(x, "mxfp4")
  >>> q.codes.shape, q.scales.shape, q.nbytes
  ((4, 32), (4, 2), 136)
  >>> y = quant.fake_quant(x, "nvfp4", rounding="stochastic", key=jax.random.key(1))
  >>> quant.get_recipe("nvfp4").wgrad.hadamard_block
  16
"""

# Formats, quantizers, packing and the Hadamard transform (docs/quant.md).
from lpjax.quant.formats.specs import (
    E8M0_SCALE_MODES,
    ELEMENT_FORMATS,
    FORMAT_NAMES,
    NF4_GRID,
    PRESETS,
    ROUNDING_MODES,
    SCALE_FORMATS,
    ElementFormat,
    QuantFormat,
    get_format,
)
from lpjax.quant.codec.fast_elements import reference_arithmetic
from lpjax.quant.schemes.hadamard import hadamard, hadamard_matrix, random_signs
from lpjax.quant.formats.packing import pack_fp4, unpack_fp4
from lpjax.quant.codec.qarray import QArray, dequantize, fake_quant, quantize, random_bits
from lpjax.quant.schemes.ssp import NAMES as SSP_NAMES
from lpjax.quant.schemes.ssp import quantize_ssp as ssp_fake_quant
from lpjax.quant.formats.tables import decode_table

# Quantized GEMMs / convolutions, recipes and per-layer policies (docs/gemm.md).
from lpjax.quant import recipes
from lpjax.quant.gemm.conv import conv_general_dilated, conv_operand_stats
from lpjax.quant.gemm.einsum import einsum, einsum_operand_stats
from lpjax.quant.gemm.dot_general import dot_general, operand_stats
from lpjax.quant.intercept.entry_points import (collect_sites, quantize_model, quantized, report,
                                    stacked_weights)
from lpjax.quant.intercept.sites import Report, Site
from lpjax.quant.recipes.gemm_recipe import REUSE_FWD, GemmQuant, GemmRecipe, OperandQuant
from lpjax.quant.gemm.operand import fake_quant_operand
from lpjax.quant.policy import DEFAULT_HIGH_PRECISION, QuantPolicy, path_str
from lpjax.quant.gemm.weight_gather import gather_weight, weight_sharding
from lpjax.quant.recipes import NAMES as RECIPE_NAMES
from lpjax.quant.recipes import get as get_recipe
from lpjax.quant.export import PackedWeight, export_weights, weight_recipes

# Where FP4 hurts: per-site numerics and the precision advisor (docs/numerics_monitor.md).
from lpjax.quant.monitor.advisor import Advice, advise
from lpjax.quant.monitor.site_stats import site_stats
from lpjax.quant.monitor.table import SiteStats

SCALE_MODES = E8M0_SCALE_MODES

__all__ = [
    # formats
    "E8M0_SCALE_MODES", "ELEMENT_FORMATS", "FORMAT_NAMES", "NF4_GRID", "PRESETS",
    "ROUNDING_MODES", "SCALE_FORMATS", "SCALE_MODES", "SSP_NAMES", "ElementFormat", "QuantFormat",
    "get_format",
    # quantizers
    "QArray", "decode_table", "dequantize", "fake_quant", "hadamard", "hadamard_matrix",
    "pack_fp4", "quantize", "random_bits", "random_signs", "reference_arithmetic",
    "ssp_fake_quant", "unpack_fp4",
    # GEMMs, recipes and policies
    "DEFAULT_HIGH_PRECISION", "GemmQuant", "GemmRecipe", "OperandQuant", "QuantPolicy",
    "RECIPE_NAMES", "REUSE_FWD", "conv_general_dilated", "conv_operand_stats", "dot_general",
    "einsum", "einsum_operand_stats", "fake_quant_operand", "gather_weight", "get_recipe",
    "operand_stats", "path_str", "recipes", "weight_sharding",
    # any model or function by interception
    "Report", "Site", "collect_sites", "quantize_model", "quantized", "report",
    "stacked_weights",
    # per-site numerics and the precision advisor
    "Advice", "SiteStats", "advise", "site_stats",
    # packed weights for serving
    "PackedWeight", "export_weights", "weight_recipes",
]
