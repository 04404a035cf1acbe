"""quantize / dequantize / fake_quant / double_quantize through the Pallas kernels.

Each returns what `lpjax.quant` returns for the same arguments, bit for bit (codes, scale bytes,
tensor scale, values; stochastic rounding included). `interpret=None` compiles the kernels with
Triton on a GPU and runs them in Pallas interpret mode elsewhere (slow; for tests and debugging).

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lpjax import quant
  >>> x = jax.random.normal(jax.random.key(0), (8, 64))
  >>> q = quantize(x, "mxfp4", rounding="stochastic", key=jax.random.key(1))
  >>> ref = quant.quantize(x, "mxfp4", rounding="stochastic", key=jax.random.key(1), impl="xla")
  >>> bool((q.codes == ref.codes).all() and (q.scales == ref.scales).all())
  True
  >>> rows, cols = double_quantize(x, "nvfp4")
  >>> rows.scales.shape, cols.scales.shape   # blocks of 16 along axis -1 and along axis -2
  ((8, 4), (1, 64))
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from lpjax.pallas import _kernels as kernels, _plan as plan, _sharded as sharded
from lpjax.pallas import _support as sp
from lpjax.pallas import _tile_codec as tc
from lpjax.quant.numerics import fp32_bits as fb
from lpjax.quant.codec import scales_exact as sc
from lpjax.quant.codec.qarray import QArray

U32 = jnp.uint32


def nvfp4_inputs(fmt, x=None, tensor_amax=None, amax_t_bits=None):
  """(amax_t bits or None, per-tensor constants or None) of a ue4m3 format (docs/numerics.md §5)."""
  if fmt.scale != "ue4m3":
    return None, None
  if fmt.tensor_scale and amax_t_bits is None:
    if tensor_amax is not None:
      amax_t_bits = fb.to_bits(jnp.asarray(tensor_amax, jnp.float32)) & U32(fb.ABS_MASK)
    else:
      amax_t_bits = sc.finite_tensor_amax_bits(fb.to_bits(x.astype(jnp.float32)) & U32(fb.ABS_MASK))
  if not fmt.tensor_scale:
    amax_t_bits = None
  consts = tc.nvfp4_tensor_constants(U32(0) if amax_t_bits is None else amax_t_bits,
                                     fmt.tensor_scale)
  return amax_t_bits, consts


def _out_shape(shape, axis, n):
  out = list(shape)
  out[axis] = n
  return tuple(out)


def unview(outputs, view, fmt, shape, axis_by_direction):
  """2-D kernel outputs [codes, scales] per direction -> [(codes, scales)] in the public layout."""
  pack = 2 if fmt.element.is_packed else 1
  b = fmt.block_size
  result = []
  for n, direction in enumerate(view.directions):
    codes2d, scales2d = outputs[2 * n], outputs[2 * n + 1]
    axis = axis_by_direction[direction]
    if direction == "rows":
      nc, ns = math.ceil(view.n / pack), math.ceil(view.n / b)
      codes = view.from_2d(codes2d, view.m, nc, _out_shape(shape, axis, nc))
      scales = view.from_2d(scales2d, view.m, ns, _out_shape(shape, axis, ns))
    else:
      mc, ms = math.ceil(view.m / pack), math.ceil(view.m / b)
      codes = view.from_2d(codes2d, mc, view.n, _out_shape(shape, axis, mc))
      scales = view.from_2d(scales2d, ms, view.n, _out_shape(shape, axis, ms))
    result.append((codes, scales))
  return result


def make_qarray(codes, scales, amax_t_bits, fmt, shape, axis, dtype):
  tensor_scale = fb.from_bits(amax_t_bits) if fmt.tensor_scale else None
  return QArray(codes=codes, scales=scales, tensor_scale=tensor_scale, zeros=None, fmt=fmt,
                shape=tuple(shape), axis=axis, dtype=dtype)


def quantize(x, fmt, *, axis: int = -1, rounding: str = "nearest_even", scale_mode=None,
             key=None, tensor_amax=None, interpret=None, tile=None) -> QArray:
  """`lpjax.quant.quantize` (same arguments, same bits) in one kernel pass over x.

  Args:
    x, fmt, axis, rounding, scale_mode, key, tensor_amax: as `lpjax.quant.quantize`.
    interpret: None (GPU: compile; elsewhere: interpret), True or False.
    tile: optional caps (rows, columns) of the kernel tile of the 2-D view (`plan`).
  """
  x = sp.check_input(x)
  fmt, scale_mode = sp.check_options(fmt, rounding, scale_mode, key)
  axis = sp.normalize_axis(axis, x.shape, fmt)
  amax_t_bits, consts = nvfp4_inputs(fmt, x, tensor_amax)
  params = kernels.make_params(key_rows=key if rounding == "stochastic" else None,
                               amax_t_bits=amax_t_bits, nvfp4=consts)
  static = (fmt, axis, rounding, scale_mode, sp.resolve_interpret(interpret), plan.check_tile(tile))
  if sharded.use_partitioning() and _leading_block(fmt, axis, x.ndim) is None:
    codes, scales = sharded.partitioned(_quantize_local, static, x.ndim, 2, None)(x, params)
  else:
    codes, scales = _quantize_local(x, params, static)
  return make_qarray(codes, scales, amax_t_bits, fmt, x.shape, axis, x.dtype)


def _quantize_local(x, params, static):
  fmt, axis, rounding, scale_mode, interpret, tile = static
  direction = "rows" if axis == x.ndim - 1 else "cols"
  view = plan.make_view(x.shape, axis, fmt.block_size, (direction,), tile=tile)
  outs = kernels.quantize(params, view.to_2d(sp.kernel_input(x)), view=view, fmt=fmt,
                          rounding=rounding, scale_mode=scale_mode, interpret=interpret)
  [(codes, scales)] = unview(outs, view, fmt, x.shape, {direction: axis})
  return codes, scales


def double_quantize(x, fmt, *, rounding: str = "nearest_even", scale_mode=None, key=None,
                    col_key=None, tensor_amax=None, interpret=None, tile=None):
  """Quantizes x along axis -1 and along axis -2 in one read of x (the backward pass's operands).

  Returns (quantize(x, fmt, axis=-1, key=key, ...), quantize(x, fmt, axis=-2, key=col_key, ...)),
  bit-identical to those two calls; `col_key` defaults to `key`. NVFP4 uses one tensor amax for
  both. x needs rank >= 2; leading axes are batch axes.
  """
  x = sp.check_input(x, "double_quantize")
  fmt, scale_mode = sp.check_options(fmt, rounding, scale_mode, key)
  col_key = key if col_key is None else col_key
  if x.ndim < 2:
    raise ValueError(f"double_quantize needs an array of rank >= 2, got shape {x.shape}.")
  sp.normalize_axis(-1, x.shape, fmt)
  view = plan.make_view(x.shape, x.ndim - 1, fmt.block_size, ("rows", "cols"), tile=tile)
  amax_t_bits, consts = nvfp4_inputs(fmt, x, tensor_amax)
  sr = rounding == "stochastic"
  params = kernels.make_params(key_rows=key if sr else None, key_cols=col_key if sr else None,
                               amax_t_bits=amax_t_bits, nvfp4=consts)
  outs = kernels.quantize(params, view.to_2d(sp.kernel_input(x)), view=view, fmt=fmt,
                          rounding=rounding, scale_mode=scale_mode,
                          interpret=sp.resolve_interpret(interpret))
  axes = {"rows": x.ndim - 1, "cols": x.ndim - 2}
  (rc, rs), (cc, cs) = unview(outs, view, fmt, x.shape, axes)
  return (make_qarray(rc, rs, amax_t_bits, fmt, x.shape, axes["rows"], x.dtype),
          make_qarray(cc, cs, amax_t_bits, fmt, x.shape, axes["cols"], x.dtype))


def dequantize(q: QArray, dtype=jnp.float32, *, interpret=None, tile=None) -> jax.Array:
  """`lpjax.quant.dequantize` (the same values, bit for bit) in one kernel pass."""
  if not isinstance(q, QArray):
    raise TypeError(f"dequantize needs a QArray (from quantize), got {type(q).__name__}.")
  fmt = sp.check_supported(q.fmt)
  direction = "rows" if q.axis == len(q.shape) - 1 else "cols"
  view = plan.make_view(q.shape, q.axis, fmt.block_size, (direction,), tile=tile)
  pack = 2 if fmt.element.is_packed else 1
  b = fmt.block_size
  if direction == "rows":
    codes = view.pad_2d(q.codes, view.m, math.ceil(view.n / pack), view.m_pad, view.n_pad // pack)
    scales = view.pad_2d(q.scales, view.m, math.ceil(view.n / b), view.m_pad, view.n_pad // b)
  else:
    codes = view.pad_2d(q.codes, math.ceil(view.m / pack), view.n, view.m_pad // pack, view.n_pad)
    scales = view.pad_2d(q.scales, math.ceil(view.m / b), view.n, view.m_pad // b, view.n_pad)
  amax_t_bits = None if q.tensor_scale is None else fb.to_bits(q.tensor_scale)
  params = kernels.make_params(amax_t_bits=amax_t_bits)
  out = kernels.dequantize(params, codes, scales, view=view, fmt=fmt, out_dtype=jnp.dtype(dtype),
                           interpret=sp.resolve_interpret(interpret))
  return view.from_2d(out, view.m, view.n, q.shape)


def _fake_local(x, params, static):
  fmt, axis, rounding, scale_mode, interpret, tile = static
  direction = "rows" if axis == x.ndim - 1 else "cols"
  view = plan.make_view(x.shape, axis, fmt.block_size, (direction,), tile=tile)
  out = kernels.fake_quant(params, view.to_2d(sp.kernel_input(x)), view=view, fmt=fmt,
                           rounding=rounding, scale_mode=scale_mode, out_dtype=x.dtype,
                           interpret=interpret)
  return (view.from_2d(out, view.m, view.n, x.shape),)


def _leading_block(fmt, axis: int, ndim: int):
  """The block length along axis 0 if the quantizer blocks it (else None)."""
  return fmt.block_size if axis == 0 or (fmt.tile and ndim == 2) else None


def _fake_impl(x, params, static):
  fmt, axis = static[:2]
  if sharded.use_partitioning():
    op = sharded.partitioned(_fake_local, static, x.ndim, 1, _leading_block(fmt, axis, x.ndim))
    return op(x, params)[0]
  return _fake_local(x, params, static)[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _fake_quant(x, params, static):
  return _fake_impl(x, params, static)


def _fake_quant_fwd(x, params, static):
  return _fake_impl(x, params, static), None


def _fake_quant_bwd(static, _, g):
  del static
  return g, None  # straight-through estimator, as lpjax.quant.fake_quant


_fake_quant.defvjp(_fake_quant_fwd, _fake_quant_bwd)


def fake_quant(x, fmt, *, axis: int = -1, rounding: str = "nearest_even", scale_mode=None,
               key=None, tensor_amax=None, interpret=None, tile=None) -> jax.Array:
  """`lpjax.quant.fake_quant` (same bits, straight-through gradient) in one fused kernel."""
  x = sp.check_input(x, "fake_quant")
  fmt, scale_mode = sp.check_options(fmt, rounding, scale_mode, key)
  axis = sp.normalize_axis(axis, x.shape, fmt)
  if tensor_amax is not None:
    tensor_amax = jax.lax.stop_gradient(tensor_amax)
  amax_t_bits, consts = nvfp4_inputs(fmt, jax.lax.stop_gradient(x), tensor_amax)
  params = kernels.make_params(key_rows=key if rounding == "stochastic" else None,
                               amax_t_bits=amax_t_bits, nvfp4=consts)
  static = (fmt, axis, rounding, scale_mode, sp.resolve_interpret(interpret), plan.check_tile(tile))
  return _fake_quant(x, params, static)
