"""Blackwell-native block-scaled GEMMs (NVFP4, MXFP8) on lpjax's own quantized operands.

On GPUs of compute capability >= 10 the tensor cores multiply NVFP4 and MXFP8 operands directly.
`native_matmul(lhs, rhs)` hands two QArrays (quantized by lpjax, so the codes and scales follow
docs/numerics.md) to `jax.nn.scaled_matmul`, the block-scaled GEMM under `jax.nn.scaled_dot_general`;
only the accumulation differs from the emulated path (dequantize, then a float32 GEMM), so the two
agree to float32 round-off, which the tests check where a Blackwell GPU is present.
(`jax.nn.scaled_dot_general` itself quantizes with JAX's own rules, e.g. a user-given NVFP4 global
scale: that is a different quantizer (docs/numerics.md §5), so lpjax does not route through it.)
Elsewhere the gate is False and `native_matmul` falls back to the emulated GEMM, or raises when
`fallback=False`.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lpjax import quant
  >>> a = quant.quantize(jax.random.normal(jax.random.key(0), (32, 64)), "mxfp8_e4m3")
  >>> b = quant.quantize(jax.random.normal(jax.random.key(1), (16, 64)), "mxfp8_e4m3")
  >>> native_gemm_supported("mxfp8_e4m3")   # no Blackwell GPU here
  False
  >>> native_matmul(a, b).shape              # the emulated fallback: a @ b.T
  (32, 16)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lpjax.quant.formats import specs as formats
from lpjax.quant.formats import tables
from lpjax.quant.formats.packing import unpack_fp4
from lpjax.quant.codec.qarray import QArray, dequantize

NATIVE_FORMATS = ("nvfp4", "mxfp8_e4m3", "mxfp8_e5m2")
_ELEMENT_DTYPES = {"e4m3": jnp.float8_e4m3fn, "e5m2": jnp.float8_e5m2}
_NVFP4_GLOBAL = 1.0 / 2688.0  # amax_t / (448 * 6): the decode multiplier of docs/numerics.md §5


def compute_capability(device=None) -> float | None:
  """The CUDA compute capability of `device` (default: the first device), None off NVIDIA GPUs."""
  device = jax.devices()[0] if device is None else device
  if device.platform != "gpu":
    return None
  value = getattr(device, "compute_capability", None)
  try:
    return float(value)
  except (TypeError, ValueError):
    return None


def native_gemm_supported(fmt, device=None) -> bool:
  """Whether `fmt` has a native block-scaled GEMM on `device` (Blackwell, compute capability >= 10)."""
  fmt = formats.get_format(fmt)
  if fmt.name not in NATIVE_FORMATS or fmt != formats.PRESETS[fmt.name]:
    return False
  cc = compute_capability(device)
  return cc is not None and cc >= 10.0


def _check_operand(q, side):
  if not isinstance(q, QArray):
    raise TypeError(f"native_matmul: {side} must be a QArray, got {type(q).__name__}.")
  if len(q.shape) not in (2, 3) or q.axis != len(q.shape) - 1:
    raise ValueError(f"native_matmul: {side} must be quantized along its last (contraction) axis, "
                     f"rank 2 or 3; got shape {q.shape}, axis {q.axis}.")
  if q.shape[-1] % q.fmt.block_size:
    raise ValueError(f"native_matmul: the contraction length {q.shape[-1]} of {side} must be a "
                     f"multiple of the block size {q.fmt.block_size}.")


def scaled_operands(q: QArray):
  """(data, block scales, global scale) of a QArray in `jax.nn.scaled_matmul`'s types.

  data * scales (repeated over each block) * global equals dequantize(q): exactly for MXFP8,
  to float32 round-off for NVFP4 (whose decode multiplies s_b * amax_t first).
  """
  name = q.fmt.element.name
  if q.fmt.scale == "e8m0":
    data = jax.lax.bitcast_convert_type(q.codes, _ELEMENT_DTYPES[name])
    scales = jax.lax.bitcast_convert_type(q.scales, jnp.float8_e8m0fnu)
    return data, scales, jnp.float32(1.0)
  codes = unpack_fp4(q.codes, q.shape[-1], axis=-1)
  data = jnp.asarray(tables.decode_table("e2m1"))[codes.astype(jnp.int32)].astype(jnp.float4_e2m1fn)
  scales = jax.lax.bitcast_convert_type(q.scales, jnp.float8_e4m3fn)
  amax = q.tensor_scale
  global_scale = jnp.where(amax == 0, jnp.float32(1.0), amax * jnp.float32(_NVFP4_GLOBAL))
  return data, scales, global_scale


def emulated_matmul(lhs: QArray, rhs: QArray, preferred_element_type=jnp.float32, *,
                    impl: str = "xla"):
  """lhs @ rhs^T over the last axes from the dequantized operands (a float32 GEMM).

  The operands are dequantized by lpjax.quant's XLA path (`impl="xla"`, the default), not by
  `impl="auto"`, which is the Pallas kernels on a GPU: this is the reference the native GEMM and
  the FP4 GEMM kernel are checked against, so it must not go through a kernel under test.
  """
  a = dequantize(lhs, jnp.float32, impl=impl)
  b = dequantize(rhs, jnp.float32, impl=impl)
  spec = "mk,nk->mn" if a.ndim == 2 else "bmk,bnk->bmn"
  out = jnp.einsum(spec, a, b, precision=jax.lax.Precision.HIGHEST)
  return out.astype(preferred_element_type)


def native_matmul(lhs: QArray, rhs: QArray, *, preferred_element_type=jnp.float32,
                  fallback: bool = True):
  """lhs @ rhs^T (contracting both last axes) of two QArrays in the same native format.

  Args:
    lhs: QArray of shape (M, K) or (B, M, K), quantized along K.
    rhs: QArray of shape (N, K) or (B, N, K), quantized along K.
    preferred_element_type: output dtype.
    fallback: when the device or format has no native GEMM, compute the emulated GEMM (True) or
      raise NotImplementedError (False).

  Returns:
    (M, N) or (B, M, N).
  """
  _check_operand(lhs, "lhs")
  _check_operand(rhs, "rhs")
  if lhs.fmt != rhs.fmt or len(lhs.shape) != len(rhs.shape):
    raise ValueError(f"native_matmul needs operands of one format and rank; got {lhs.fmt} "
                     f"{lhs.shape} and {rhs.fmt} {rhs.shape}.")
  if not native_gemm_supported(lhs.fmt):
    if fallback:
      return emulated_matmul(lhs, rhs, preferred_element_type)
    cc = compute_capability()
    where = f"compute capability {cc}" if cc is not None else f"platform {jax.devices()[0].platform}"
    raise NotImplementedError(
        f"No native block-scaled GEMM for {lhs.fmt} here ({where}): it needs one of "
        f"{', '.join(NATIVE_FORMATS)} on an NVIDIA GPU of compute capability >= 10 (Blackwell). "
        "Pass fallback=True for the emulated GEMM.")
  a, sa, ga = scaled_operands(lhs)
  b, sb, gb = scaled_operands(rhs)
  squeeze = a.ndim == 2
  if squeeze:
    a, sa, b, sb = a[None], sa[None], b[None], sb[None]
  out = jax.nn.scaled_matmul(a, b, sa, sb, preferred_element_type=jnp.float32)
  out = out * (ga * gb)
  return (out[0] if squeeze else out).astype(preferred_element_type)
