"""lpjax.quant: low-precision number formats, exact quantizers and the random Hadamard transform.

The numerics follow the project's numerics contract (NUMERICS.md) and docs/quant.md. This package
does not import Flax.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lpjax import quant
  >>> x = jax.random.normal(jax.random.key(0), (4, 64))
  >>> q = quant.quantize(x, "mxfp4")
  >>> q.codes.shape, q.scales.shape, q.nbytes
  ((4, 32), (4, 2), 136)
  >>> y = quant.fake_quant(x, "nvfp4", rounding="stochastic", key=jax.random.key(1))
"""

from lpjax.quant.formats import (
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
from lpjax.quant.hadamard import hadamard, hadamard_matrix, random_signs
from lpjax.quant.packing import pack_fp4, unpack_fp4
from lpjax.quant.quantize import QArray, dequantize, fake_quant, quantize, random_bits
from lpjax.quant.tables import decode_table

SCALE_MODES = E8M0_SCALE_MODES

__all__ = [
    "E8M0_SCALE_MODES", "ELEMENT_FORMATS", "FORMAT_NAMES", "NF4_GRID", "PRESETS", "ROUNDING_MODES",
    "SCALE_FORMATS", "SCALE_MODES", "ElementFormat", "QArray", "QuantFormat", "decode_table",
    "dequantize", "fake_quant", "get_format", "hadamard", "hadamard_matrix", "pack_fp4",
    "quantize", "random_bits", "random_signs", "unpack_fp4",
]

# Quantized GEMMs / convolutions, recipes, policies and schedules (docs/gemm.md).
from lpjax.quant import recipes, ssp  # noqa: E402
from lpjax.quant.conv import conv_general_dilated  # noqa: E402
from lpjax.quant.gemm import dot_general, einsum, operand_stats  # noqa: E402
from lpjax.quant.policy import QuantPolicy, recipe_override  # noqa: E402
from lpjax.quant.recipe import REUSE_FWD, GemmQuant, GemmRecipe, OperandQuant  # noqa: E402
from lpjax.quant.schedule import PrecisionSchedule, ScheduleState  # noqa: E402

__all__ += [
    "GemmQuant", "GemmRecipe", "OperandQuant", "PrecisionSchedule", "QuantPolicy", "REUSE_FWD",
    "ScheduleState", "conv_general_dilated", "dot_general", "einsum", "operand_stats",
    "recipe_override", "recipes", "ssp",
]
