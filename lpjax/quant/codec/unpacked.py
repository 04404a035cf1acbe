"""One quantization with nothing packed: the element codes (one per element), the scales and the
dequantized values from one encode (`quantize_unpacked`), for readers of the codes beside the
values: the monitor's operand statistics read the GEMM's own quantization this way
(docs/numerics_monitor.md), with no nibble packing and no second decode.

Examples:
  >>> import jax.numpy as jnp
  >>> from lpjax.quant.codec import qarray as qa
  >>> u = quantize_unpacked(jnp.array([[0.3, -1.0, 2.5, 6.0] * 8]), "mxfp4")
  >>> u.codes[0, :4].tolist(), u.values[0, :4].tolist()   # the codes of 0.5, -1, 2, 6
  ([1, 10, 4, 7], [0.5, -1.0, 2.0, 6.0])
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from lpjax.quant.codec import fast_elements as fast
from lpjax.quant.codec import qarray as qa
from lpjax.quant.formats import specs as formats
from lpjax.quant.formats.layout import GroupLayout
from lpjax.quant.formats.packing import pack_fp4, unpack_fp4
from lpjax.quant.numerics import fp32_bits as fb
from lpjax.quant.numerics.materialize import materialize, opaque_zero


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Unpacked:
  """One quantization with nothing packed: what `quantize` packs and what `fake_quant` gives, from
  one encode (`quantize_unpacked`), for reading the codes and scales beside the values."""

  codes: jax.Array  # uint8 element codes, one per element, in x's shape (not packed)
  scales: jax.Array  # as QArray.scales: one per scaling group
  tensor_scale: jax.Array | None  # as QArray.tensor_scale
  zeros: jax.Array | None  # as QArray.zeros
  values: jax.Array  # float32 dequantized values in x's shape: fake_quant's, before its cast
  amax_bits: jax.Array  # uint32 bits of max |x| of each scaling group, in the scales' layout
  fmt: formats.QuantFormat = dataclasses.field(metadata=dict(static=True))
  shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
  axis: int = dataclasses.field(metadata=dict(static=True))  # blocked axis (non-negative)
  dtype: Any = dataclasses.field(metadata=dict(static=True))  # the dtype of the quantized x

  @property
  def layout(self) -> GroupLayout:
    return GroupLayout.make(self.fmt, self.shape, self.axis)

  def packed(self) -> qa.QArray:
    """The QArray `quantize` gives (the codes packed two per byte for 4-bit elements)."""
    codes = self.codes
    if self.fmt.element.is_packed and codes.ndim:
      codes = pack_fp4(codes, axis=self.axis)
    return qa.QArray(codes=codes, scales=self.scales, tensor_scale=self.tensor_scale,
                     zeros=self.zeros, fmt=self.fmt, shape=self.shape, axis=self.axis,
                     dtype=self.dtype)


def quantize_unpacked(x, fmt, *, axis: int = -1, rounding: str = "nearest_even",
                      scale_mode: str | None = None, key=None, tensor_amax=None,
                      impl: str = "auto") -> Unpacked:
  """`quantize` and `fake_quant` of `x` (the same arguments) from one encode, nothing packed: an
  `Unpacked` with the element codes, the scales and the dequantized values (bit for bit
  `fake_quant`'s in float32, and `unpack_fp4` of `quantize`'s codes). Not differentiable.

  Examples:
    >>> import jax.numpy as jnp
    >>> x = jnp.array([[0.3, -1.0, 2.5, 6.0] * 8])
    >>> u = quantize_unpacked(x, "mxfp4")
    >>> u.codes.shape, u.codes[0, :4].tolist(), u.values[0, :4].tolist()
    ((1, 32), [1, 10, 4, 7], [0.5, -1.0, 2.0, 6.0])
    >>> bool((u.packed().codes == qa.quantize(x, "mxfp4").codes).all()), hex(int(u.amax_bits[0, 0]))
    (True, '0x40c00000')
  """
  qa._check_impl(impl)
  x = qa._check_input(x)
  fmt, scale_mode = qa._options(fmt, rounding, scale_mode, key)
  if qa._kernel_backend(impl, fmt) is not None or x.size == 0:  # the kernel's QArray, unpacked
    q = qa.quantize(x, fmt, axis=axis, rounding=rounding, scale_mode=scale_mode, key=key,
                    tensor_amax=tensor_amax, impl=impl)
    return _unpacked_of(x, q, impl)
  rbits = qa.random_bits(key, x.shape) if rounding == "stochastic" else None
  return _quantize_unpacked_xla(x, rbits, tensor_amax, fmt=fmt, axis=axis, rounding=rounding,
                                scale_mode=scale_mode, fast_path=fast.use_fast_path(fmt, rounding))


@functools.partial(jax.jit, static_argnames=qa._STATIC)
def _quantize_unpacked_xla(x, rbits, tensor_amax, *, fmt, axis, rounding, scale_mode, fast_path):
  layout, enc = qa._grouped_encode(x, fmt, axis, rounding, scale_mode, rbits, tensor_amax,
                                   fast_path, want_values=True)
  # the values and codes side by side, computed once (`materialize`): XLA would otherwise repeat
  # the whole element pass in each of their readers (the GEMM and every statistic)
  both = jnp.stack([qa._value_bits(enc, fmt), enc.codes.astype(jnp.uint32)], -1)
  (both,) = materialize((both,), opaque_zero(enc.amax_bits)[..., None])
  enc = dataclasses.replace(enc, codes=both[..., 1])
  codes, scales, tensor_scale, zeros = qa._fields(layout, enc, fmt, packed=False)
  values = fb.from_bits(layout.ungroup(both[..., 0]))
  return Unpacked(codes=codes, scales=scales, tensor_scale=tensor_scale, zeros=zeros,
                  values=values, amax_bits=layout.scales_out(enc.amax_bits), fmt=fmt,
                  shape=tuple(x.shape), axis=layout.axis, dtype=x.dtype)


def _unpacked_of(x, q: qa.QArray, impl: str) -> Unpacked:
  """The `Unpacked` of a QArray of x (a kernel's, or an empty x's)."""
  layout = q.layout
  codes = q.codes
  if q.fmt.element.is_packed and codes.ndim:
    codes = unpack_fp4(codes, q.shape[layout.axis], axis=layout.axis)
  abs_bits = fb.to_bits(x.astype(jnp.float32)) & jnp.uint32(fb.ABS_MASK)
  amax = jnp.max(layout.group(abs_bits), axis=layout.reduce_axes, keepdims=True,
                 initial=jnp.uint32(0))
  values = qa.dequantize(q, jnp.float32, impl=impl)
  return Unpacked(codes=codes, scales=q.scales, tensor_scale=q.tensor_scale, zeros=q.zeros,
                  values=values, amax_bits=layout.scales_out(amax),
                  fmt=q.fmt, shape=q.shape, axis=q.axis, dtype=q.dtype)
