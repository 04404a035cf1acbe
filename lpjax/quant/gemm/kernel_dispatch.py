"""Which of a recipe's GEMMs run on the exact FP4 GEMM kernel, and the call into it.

`GemmRecipe.gemm_impl` chooses per recipe:

* "xla": every GEMM is emulated (dequantize, cast to the compute dtype, float32-accumulating dot);
* "pallas": every *eligible* GEMM runs `lpjax.pallas.fp4_matmul` on the packed operands (Triton on a
  GPU, Pallas interpret mode elsewhere); the others stay emulated;
* "auto" (default): "pallas" where `MEASURED_FASTER` lists this GPU's compute capability and the
  format, else "xla". The table is empty (no GPU measurement yet), so "auto" is today's path.

Eligible: both operands of the GEMM are plain block quantizers (not high precision, not SSP, no
`scheme`, not `REUSE_FWD`) of FP4 formats that pair block for block (MXFP4 with MXFP4, NVFP4 1x16
with NVFP4 1x16 or 16x16 tiles). Blocks run along every GEMM's contraction (docs/numerics.md §7),
so that is every pass of such a recipe: the forward, and dgrad / wgrad where both backward
operands are quantized. The kernels are the "pallas" entry of `lpjax.quant.backends.KERNELS`,
loaded on the first kernel GEMM, never at import time.

Examples:
  >>> import dataclasses
  >>> from lpjax.quant import recipes
  >>> r = dataclasses.replace(recipes.get("mxfp4_naive"), gemm_impl="pallas")
  >>> [use_kernel(r, g) for g in ("fwd", "dgrad", "wgrad")]
  [True, True, True]
  >>> use_kernel(recipes.get("mxfp4_naive"), "fwd")   # "auto": nothing measured yet
  False
  >>> use_kernel(dataclasses.replace(recipes.get("ssp_fp4"), gemm_impl="pallas"), "fwd")
  False
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.quant import backends
from lpjax.quant.recipes.gemm_recipe import OperandQuant

GEMM_IMPLS = ("auto", "xla", "pallas")

# Compute capability ("9.0") -> format names whose kernel GEMM measured faster than the emulated
# GEMM there (benchmarks/speed/fp4_gemm.py). Empty: not measured (no GPU yet), so "auto" never picks it.
MEASURED_FASTER: dict[str, tuple[str, ...]] = {}


def _backend():
  return backends.KERNELS["pallas"]  # loads its provider on first use (lpjax.quant.backends)


def _plain(op) -> bool:
  return isinstance(op, OperandQuant) and not op.is_ssp and op.scheme is None


def _measured_faster(fmt) -> bool:
  if os.environ.get("LPJAX_PALLAS_AUTO", "1") == "0" or jax.default_backend() != "gpu":
    return False
  cc = getattr(jax.devices()[0], "compute_capability", None)
  return fmt.name in MEASURED_FASTER.get(str(cc), ())


def use_kernel(recipe, gemm: str) -> bool:
  """Whether `gemm` ("fwd", "dgrad", "wgrad") of `recipe` runs on the FP4 GEMM kernel."""
  impl = getattr(recipe, "gemm_impl", "auto")
  lhs, rhs = getattr(recipe, gemm).operands()
  if impl == "xla" or not (_plain(lhs) and _plain(rhs)):
    return False
  if impl == "auto" and not _measured_faster(lhs.format):
    return False
  backend = _backend()
  return (backend.fp4_gemm_reason(lhs.format) is None and backend.fp4_gemm_reason(rhs.format) is None
          and backend.fp4_gemm_compatible(lhs.format, rhs.format))


def matmul(a, b, recipe, gemm: str):
  """a @ b^T (float32) of the packed operands of `gemm`, both blocked along their last axis.

  Undoes the SR pre-scales as the emulated path does (it divides each operand; here the product
  is divided once by their product, an exact float32 number).
  """
  out = _backend().fp4_matmul(a, b, out_dtype=jnp.float32)
  scale = 1.0
  for op in getattr(recipe, gemm).operands():
    scale *= op.sr_prescale or 1.0
  return out if scale == 1.0 else out / np.float32(scale)
