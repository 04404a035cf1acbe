"""quantize / dequantize / fake_quant and the QArray container (docs/quant.md).

Examples:
  >>> import jax, jax.numpy as jnp
  >>> x = jnp.array([[0.3, -1.0, 2.5, 6.0] * 8])
  >>> q = quantize(x, "mxfp4")
  >>> q.codes.shape, q.scales.shape, q.codes.dtype, int(q.scales[0, 0])
  ((1, 16), (1, 1), dtype('uint8'), 127)
  >>> dequantize(q)[0, :4].tolist()
  [0.5, -1.0, 2.0, 6.0]
  >>> jax.grad(lambda x: fake_quant(x, "nvfp4").sum())(x)[0, :4].tolist()  # straight-through
  [1.0, 1.0, 1.0, 1.0]
  >>> bool((quantize(x, "mxfp4", impl="pallas").codes == q.codes).all())  # the kernel, same bits
  True
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any

import jax
import jax.numpy as jnp

from lpjax.quant import backends
from lpjax.quant.codec import group_codec as codec
from lpjax.quant.codec import fast_elements as fast
from lpjax.quant.formats import specs as formats
from lpjax.quant.numerics import fp32_bits as fb
from lpjax.quant.formats.layout import GroupLayout
from lpjax.quant.formats.packing import pack_fp4, unpack_fp4
from lpjax.quant.numerics.rng import random_bits as _random_bits


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QArray:
  """A quantized array: codes, block scales, and what is needed to dequantize them."""

  codes: jax.Array  # uint8; 4-bit codes packed two per byte along the blocked axis
  scales: jax.Array  # uint8 e8m0 / ue4m3 bytes, or float32; one per scaling group
  tensor_scale: jax.Array | None  # float32 amax_t for NVFP4 (decode multiplier amax_t / 2688)
  zeros: jax.Array | None  # float32 block minimum for uint4, else None
  fmt: formats.QuantFormat = dataclasses.field(metadata=dict(static=True))
  shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
  axis: int = dataclasses.field(metadata=dict(static=True))  # blocked axis (non-negative)
  dtype: Any = dataclasses.field(metadata=dict(static=True))  # the dtype of the quantized x

  @property
  def nbytes(self) -> int:
    """Bytes of real storage: codes + scales + tensor scale + zeros."""
    parts = [self.codes, self.scales, self.tensor_scale, self.zeros]
    return sum(math.prod(p.shape) * jnp.dtype(p.dtype).itemsize for p in parts if p is not None)

  @property
  def layout(self) -> GroupLayout:
    return GroupLayout.make(self.fmt, self.shape, self.axis)


# Implementations (docs/pallas.md): "xla" is this module; "pallas" is the kernel backend registered
# in `lpjax.quant.backends.KERNELS` (an object with `unsupported(fmt) -> str | None`, why it cannot
# handle fmt, `check_supported(fmt)`, and `quantize` / `dequantize` / `fake_quant` taking this
# module's arguments).
IMPLS = ("auto", "xla", "pallas")


def _check_impl(impl):
  if impl not in IMPLS:
    raise ValueError(f"impl must be one of {', '.join(map(repr, IMPLS))}, got {impl!r}.")


def _auto_uses_kernels() -> bool:
  """impl="auto": the kernels on GPUs (one or several: lpjax.pallas._sharded gives them a
  partitioning rule, so each device quantizes its own shard); XLA elsewhere, and when
  LPJAX_PALLAS_AUTO=0.
  """
  if os.environ.get("LPJAX_PALLAS_AUTO", "1") == "0":
    return False
  return jax.default_backend() == "gpu"


def _kernel_backend(impl, fmt):
  """The registered kernel backend to run, or None for this module's XLA implementation."""
  _check_impl(impl)
  if impl == "xla" or (impl == "auto" and not _auto_uses_kernels()):
    return None
  backend = backends.KERNELS["pallas"]  # loads its provider on first use (lpjax.quant.backends)
  if impl == "auto":
    return None if backend.unsupported(fmt) else backend
  backend.check_supported(fmt)
  return backend


def _check_input(x) -> jax.Array:
  dtype = jnp.result_type(x)
  if not jnp.issubdtype(dtype, jnp.floating):
    kind = "complex" if jnp.issubdtype(dtype, jnp.complexfloating) else "non-float"
    raise TypeError(f"quantize needs a float array (bf16, fp16, fp32), got {kind} dtype {dtype}; "
                    "cast it first, e.g. x.astype(jnp.float32).")
  return jnp.asarray(x)


def _options(fmt, rounding, scale_mode, key):
  fmt = formats.get_format(fmt)
  formats.check_rounding(rounding)
  scale_mode = formats.check_scale_mode(fmt, scale_mode)
  if rounding == "stochastic" and key is None:
    raise ValueError("rounding='stochastic' needs an explicit key, e.g. key=jax.random.key(0).")
  if fmt.element.kind == "lut" and rounding != "nearest_even":
    raise ValueError(f"Format {fmt} ({fmt.element.name}) supports rounding='nearest_even' only, "
                     f"got {rounding!r}.")
  return fmt, scale_mode


def _grouped_encode(x, fmt, axis, rounding, scale_mode, rbits, tensor_amax, fast_path=False,
                    want_values=False):
  layout = GroupLayout.make(fmt, x.shape, axis)
  x_bits = fb.to_bits(x.astype(jnp.float32))
  rbits_g = None if rbits is None else layout.group(rbits)
  amax_bits = None
  if tensor_amax is not None:
    amax_bits = fb.to_bits(jnp.asarray(tensor_amax, jnp.float32)) & jnp.uint32(fb.ABS_MASK)
  enc = codec.encode(layout.group(x_bits), fmt, layout.reduce_axes, rounding=rounding,
                     scale_mode=scale_mode, random_bits=rbits_g, tensor_amax_bits=amax_bits,
                     fast_path=fast_path, want_values=want_values)
  return layout, enc


def quantize(x, fmt, *, axis: int = -1, rounding: str = "nearest_even", scale_mode: str | None = None,
             key=None, tensor_amax=None, impl: str = "auto") -> QArray:
  """Quantizes `x` to `fmt` (a preset name or QuantFormat); see docs/quant.md for every rule.

  Args:
    x: float array (bf16, fp16, fp32).
    fmt: format name (`FORMAT_NAMES`) or `QuantFormat`.
    axis: the blocked axis (ignored by per-tensor formats; tiles use the last two axes).
    rounding: one of `ROUNDING_MODES`; "stochastic" needs `key`.
    scale_mode: e8m0 scale rule: "floor" (default), "ceil", "even" or "rceil".
    key: jax.random key for stochastic rounding.
    tensor_amax: NVFP4 only: the tensor amax to use instead of max |x| over finite values.
    impl: "auto" (the Pallas kernel on a single GPU when it handles fmt, else XLA), "xla" or
      "pallas" (the kernel; interpret mode off GPU). All give the same bits (docs/pallas.md).

  Returns:
    A QArray.
  """
  _check_impl(impl)
  x = _check_input(x)
  fmt, scale_mode = _options(fmt, rounding, scale_mode, key)
  backend = _kernel_backend(impl, fmt)
  if backend is not None:
    q = backend.quantize(x, fmt, axis=axis, rounding=rounding, scale_mode=scale_mode, key=key,
                         tensor_amax=tensor_amax)
    if tensor_amax is None or not fmt.tensor_scale:
      return q
    # A NaN / Inf tensor_amax makes every block NaN (docs/numerics.md §5), as the XLA path does.
    bad = ~jnp.isfinite(jnp.asarray(tensor_amax, jnp.float32))
    return dataclasses.replace(q, codes=jnp.where(bad, jnp.zeros_like(q.codes), q.codes),
                               scales=jnp.where(bad, jnp.full_like(q.scales, 0x7F), q.scales))
  if x.size == 0:
    return _empty_qarray(x, fmt, axis)
  rbits = _random_bits(key, x.shape) if rounding == "stochastic" else None
  return _quantize_xla(x, rbits, tensor_amax, fmt=fmt, axis=axis, rounding=rounding,
                       scale_mode=scale_mode, fast_path=fast.use_fast_path(fmt, rounding))


# The XLA implementations below are jitted with their options static: a model traces each
# (shape, dtype, options) once however many layers and passes (train step, eval, the fp32 eval)
# quantize it. Tracing an exact quantizer is ~50 ms of Python; a U-Net's 350 quantizers traced
# again per program made its first step minutes long. The nested jit costs nothing at run time
# (XLA inlines it) and keeps the arithmetic, hence the bits, unchanged.
_STATIC = ("fmt", "axis", "rounding", "scale_mode", "fast_path")


@functools.partial(jax.jit, static_argnames=_STATIC)
def _quantize_xla(x, rbits, tensor_amax, *, fmt, axis, rounding, scale_mode, fast_path):
  layout, enc = _grouped_encode(x, fmt, axis, rounding, scale_mode, rbits, tensor_amax,
                                fast_path)
  codes, scales, tensor_scale, zeros = _fields(layout, enc, fmt)
  return QArray(codes=codes, scales=scales, tensor_scale=tensor_scale, zeros=zeros, fmt=fmt,
                shape=tuple(x.shape), axis=layout.axis, dtype=x.dtype)


def _fields(layout, enc, fmt, packed: bool = True):
  """(codes, scales, tensor_scale, zeros) of a QArray from an encode; the codes packed two per
  byte for 4-bit elements unless not `packed` (then one uint8 per element, x's shape)."""
  codes = layout.ungroup(enc.codes).astype(jnp.uint8)
  if packed and fmt.element.is_packed:
    codes = pack_fp4(codes, axis=layout.axis)
  scales = layout.scales_out(enc.scales)
  scales = fb.from_bits(scales) if fmt.scale == "fp32" else scales.astype(jnp.uint8)
  tensor_scale = None if enc.tensor_amax_bits is None else fb.from_bits(enc.tensor_amax_bits)
  zeros = None if enc.zeros is None else layout.scales_out(enc.zeros)
  return codes, scales, tensor_scale, zeros


def _empty_qarray(x, fmt, axis) -> QArray:
  """The QArray of an empty x: codes and scales of the usual shapes, with no elements."""
  layout = GroupLayout.make(fmt, x.shape, axis)
  codes = jnp.zeros(x.shape, jnp.uint8)
  if fmt.element.is_packed:
    codes = pack_fp4(codes, axis=layout.axis) if x.ndim else codes
  scale_dtype = jnp.float32 if fmt.scale == "fp32" else jnp.uint8
  scales = jnp.zeros(layout.scale_shape, scale_dtype)
  tensor_scale = jnp.zeros((), jnp.float32) if fmt.tensor_scale else None
  zeros = jnp.zeros(layout.scale_shape, jnp.float32) if fmt.element.kind == "uint" else None
  return QArray(codes=codes, scales=scales, tensor_scale=tensor_scale, zeros=zeros, fmt=fmt,
                shape=tuple(x.shape), axis=layout.axis, dtype=x.dtype)


def dequantize(q: QArray, dtype=jnp.float32, *, impl: str = "auto") -> jax.Array:
  """The values of a QArray (exact in float32, then cast to `dtype`), in the original shape.

  `impl` as in `quantize`.
  """
  _check_impl(impl)
  if not isinstance(q, QArray):
    raise TypeError(f"dequantize needs a QArray (from quantize), got {type(q).__name__}.")
  backend = _kernel_backend(impl, q.fmt)
  if backend is not None:
    return backend.dequantize(q, dtype)
  if math.prod(q.shape) == 0:
    return jnp.zeros(q.shape, dtype)
  return _dequantize_xla(q, dtype=jnp.dtype(dtype),
                         fast_path=fast.use_fast_path(q.fmt, "nearest_even"))


@functools.partial(jax.jit, static_argnames=("dtype", "fast_path"))
def _dequantize_xla(q, *, dtype, fast_path):
  layout = q.layout
  codes = q.codes
  if q.fmt.element.is_packed:
    codes = unpack_fp4(codes, q.shape[layout.axis] if q.shape else 1, axis=layout.axis)
  scales = q.scales
  scales = fb.to_bits(scales) if q.fmt.scale == "fp32" else scales.astype(jnp.uint32)
  amax_bits = None if q.tensor_scale is None else fb.to_bits(q.tensor_scale)
  zeros = None if q.zeros is None else layout.scales_in(q.zeros)
  out = codec.decode(layout.group(codes.astype(jnp.uint32)), layout.scales_in(scales), q.fmt,
                     tensor_amax_bits=amax_bits, zeros=zeros, fast_path=fast_path)
  return fb.from_bits(layout.ungroup(out)).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _fake_quant(x, rbits, tensor_amax, fmt, axis, rounding, scale_mode, fast_path):
  return _fake_quant_xla(x, rbits, tensor_amax, fmt=fmt, axis=axis, rounding=rounding,
                         scale_mode=scale_mode, fast_path=fast_path)


@functools.partial(jax.jit, static_argnames=_STATIC)
def _fake_quant_xla(x, rbits, tensor_amax, *, fmt, axis, rounding, scale_mode, fast_path):
  layout, enc = _grouped_encode(x, fmt, axis, rounding, scale_mode, rbits, tensor_amax,
                                fast_path, want_values=True)
  return fb.from_bits(layout.ungroup(_value_bits(enc, fmt))).astype(x.dtype)


def _value_bits(enc, fmt):
  """float32 bits of the dequantized values of an encode made with want_values (grouped view)."""
  if enc.values is not None:  # the fast path dequantizes as it goes
    return enc.values
  return codec.decode(enc.codes, enc.scales, fmt, tensor_amax_bits=enc.tensor_amax_bits,
                      zeros=enc.zeros)


def _fake_quant_fwd(x, rbits, tensor_amax, fmt, axis, rounding, scale_mode, fast_path):
  return _fake_quant(x, rbits, tensor_amax, fmt, axis, rounding, scale_mode, fast_path), None


def _fake_quant_bwd(fmt, axis, rounding, scale_mode, fast_path, _, g):
  del fmt, axis, rounding, scale_mode, fast_path
  return g, None, None  # straight-through estimator


_fake_quant.defvjp(_fake_quant_fwd, _fake_quant_bwd)


def fake_quant(x, fmt, *, axis: int = -1, rounding: str = "nearest_even",
               scale_mode: str | None = None, key=None, tensor_amax=None,
               impl: str = "auto") -> jax.Array:
  """dequantize(quantize(x, ...)) in x's dtype, with an identity (straight-through) gradient.

  Takes the same arguments as `quantize` (`impl` included); skips the nibble packing.
  """
  _check_impl(impl)
  x = _check_input(x)
  fmt, scale_mode = _options(fmt, rounding, scale_mode, key)
  backend = _kernel_backend(impl, fmt)
  if backend is not None:
    y = backend.fake_quant(x, fmt, axis=axis, rounding=rounding, scale_mode=scale_mode,
                           key=key, tensor_amax=tensor_amax)
    if tensor_amax is None or not fmt.tensor_scale:
      return y
    bad = ~jnp.isfinite(jax.lax.stop_gradient(jnp.asarray(tensor_amax, jnp.float32)))
    return jnp.where(bad, jnp.full_like(y, jnp.nan), y)  # every block NaN, as on the XLA path
  if x.size == 0:
    GroupLayout.make(fmt, x.shape, axis)  # the same checks of the axis as a non-empty x
    return x
  rbits = _random_bits(key, x.shape) if rounding == "stochastic" else None
  if tensor_amax is not None:
    tensor_amax = jax.lax.stop_gradient(jnp.asarray(tensor_amax, jnp.float32))
  return _fake_quant(x, rbits, tensor_amax, fmt, axis, rounding, scale_mode,
                     fast.use_fast_path(fmt, rounding))


def random_bits(key, shape) -> jax.Array:
  """The uint32 bits stochastic rounding uses for an array of `shape` (see lpjax.quant.numerics.rng)."""
  return _random_bits(key, shape)
