"""lpjax.pallas: Pallas GPU kernels for the quantization hot paths, bit-identical to lpjax.quant.

Importing this package registers the kernels as `impl="pallas"` of `lpjax.quant.quantize`,
`dequantize` and `fake_quant` (`impl="auto"` picks them on a single GPU). The kernels compile with
Triton on NVIDIA GPUs (A100, H100/H200, Blackwell) and run in Pallas interpret mode elsewhere, so
every function here also works, slowly, on a CPU. See docs/pallas.md. `fp4_matmul` /
`fp4_dot_general` multiply two MXFP4 / NVFP4 QArrays with exact integer dots per scale block
(the `gemm_impl="pallas"` GEMMs of lpjax.quant; docs/gemm.md).

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lpjax import pallas, quant
  >>> x = jax.random.normal(jax.random.key(0), (16, 64), jnp.bfloat16)
  >>> y = pallas.fake_quant(x, "nvfp4")
  >>> bool((y == quant.fake_quant(x, "nvfp4", impl="xla")).all()), y.dtype
  (True, dtype(bfloat16))
  >>> pallas.SUPPORTED_FORMATS[:2]
  ('mxfp4', 'mxfp6_e2m3')
"""

import types

from lpjax.pallas import _native as native
from lpjax.pallas._fp4_gemm import (block_partials as fp4_block_partials, fp4_dot_general,
                                    fp4_matmul)
from lpjax.pallas._fp4_gemm import compatible as _fp4_compatible
from lpjax.pallas._fp4_gemm import gemm_format_reason as fp4_gemm_reason
from lpjax.pallas._native import NATIVE_FORMATS, native_gemm_supported, native_matmul
from lpjax.pallas._ops import dequantize, double_quantize, fake_quant, quantize
from lpjax.pallas._rht import hadamard, hadamard_fake_quant, hadamard_quantize
from lpjax.pallas._support import SUPPORTED_FORMATS, check_supported, unsupported_reason
from lpjax.quant import backends as _backends

__all__ = [
    "NATIVE_FORMATS", "SUPPORTED_FORMATS", "check_supported", "dequantize", "double_quantize",
    "fake_quant", "fp4_block_partials", "fp4_dot_general", "fp4_gemm_reason", "fp4_matmul",
    "hadamard", "hadamard_fake_quant", "hadamard_quantize", "native",
    "native_gemm_supported", "native_matmul", "quantize", "unsupported_reason",
]

# The "pallas" kernel backend of lpjax.quant (lpjax.quant.backends.KERNELS; declared at `import lpjax`).
_backends.KERNELS.register("pallas", types.SimpleNamespace(
    unsupported=unsupported_reason, check_supported=check_supported, quantize=quantize,
    dequantize=dequantize, fake_quant=fake_quant, fp4_matmul=fp4_matmul,
    fp4_gemm_reason=fp4_gemm_reason, fp4_gemm_compatible=_fp4_compatible))
