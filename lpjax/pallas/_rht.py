"""Random Hadamard transform fused with quantization (the RHT GEMM operands of docs/numerics.md §7).

`hadamard_quantize(x, fmt, block=g, signs=s, axis=a, ...)` is
`quantize(operand.rotate(x, g, a, s) [* prescale], fmt, axis=a, ...)` in one pass: the rotation
(`(x * signs) @ H_g / sqrt(g)` per block of g along the axis, the axis zero-padded to a multiple of
g) happens on the tile in registers and is never written out. The returned QArray has the rotated
(padded) shape and dtype float32, like the XLA composition.

The rotation is `lpjax.quant.hadamard`'s fast Walsh-Hadamard transform: log2(g) butterfly stages,
each here a float32 dot with a stage matrix (`quant._hadamard.butterfly_stages`) whose columns hold
one exact a + b or a - b and exact zeros, so every backend's summation order gives XLA's values;
then the same fl32(1 / sqrt(g)) and +0 for zeros. So `hadamard_quantize(x)` equals
`quant.quantize(quant.hadamard(x))` bit for bit (checked in interpret mode by the tests). Inf and
NaN inputs give the butterflies' own values too (docs/numerics.md §7, "Non-finite values in the
Hadamard rotation"): a tile holding one takes `_kernels._nonfinite_stage`, which counts infinities
and NaNs with exact integer-valued dots instead of letting 0 * Inf make NaN.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lpjax import quant
  >>> from lpjax.quant.gemm import operand
  >>> x = jax.random.normal(jax.random.key(0), (16, 40))
  >>> signs = quant.random_signs(jax.random.key(1), 16)
  >>> q = hadamard_quantize(x, "nvfp4", block=16, signs=signs)
  >>> q.shape                                    # 40 padded to a multiple of 16
  (16, 48)
  >>> ref = quant.quantize(operand.rotate(x, 16, -1, signs), "nvfp4", impl="xla")
  >>> bool((q.codes == ref.codes).all() and (q.scales == ref.scales).all())
  True
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from lpjax.pallas import _kernels as kernels, _ops as ops, _plan as plan
from lpjax.pallas import _support as sp
from lpjax.quant.schemes.hadamard import butterfly_stages
from lpjax.quant.schemes.hadamard import hadamard as xla_hadamard

F32 = jnp.float32


def _check_block(block: int, signs):
  if not isinstance(block, int) or block < 16 or block & (block - 1):
    raise ValueError(f"The Hadamard kernels need a power-of-two block >= 16 (Triton dots are at "
                     f"least 16 wide), got {block!r}; use lpjax.quant.hadamard for smaller ones.")
  signs = jnp.ones((block,), F32) if signs is None else jnp.asarray(signs, F32)
  if signs.shape != (block,):
    raise ValueError(f"signs must have shape ({block},), got {signs.shape}.")
  # The butterfly stages of lpjax.quant.hadamard, as (log2(block), block, block) matrices.
  return signs, jnp.asarray(butterfly_stages(block))


def _view(shape, axis, block, unit, tile):
  """The kernel view of x for a rotation block `block` and a quantization block `unit`."""
  ndim = len(shape)
  length = math.ceil(shape[axis] / block) * block
  tile = plan.check_tile(tile)
  if axis == ndim - 1:
    return plan.make_view(shape, axis, unit, ("rows",), tile=tile, n_unit=max(block, unit),
                          min_free=16, n_len=length)
  if block % unit:
    raise NotImplementedError(f"Along a non-last axis the Hadamard kernels need the rotation block "
                              f"({block}) to be a multiple of the scaling block ({unit}).")
  caps = (block, (tile or plan.COLS_TILE)[1])
  return plan.make_view(shape, axis, unit, ("cols",), tile=caps, m_unit=block, min_free=16,
                        m_len=length)


def _rotated_shape(shape, axis, block):
  out = list(shape)
  out[axis] = math.ceil(shape[axis] / block) * block
  return tuple(out)


def _prepare(x, block, axis, signs, what):
  x = sp.check_input(x, what)
  axis = sp.normalize_axis(axis, x.shape, "hadamard")
  signs, hm = _check_block(block, signs)
  return x, axis, signs, hm


def hadamard(x, block: int, *, axis: int = -1, signs=None, interpret=None, tile=None):
  """The kernels' RHT of x in float32: `operand.rotate(x, block, axis, signs)`, the axis
  zero-padded to a multiple of `block` (see the module docstring on bit-identity)."""
  x, axis, signs, hm = _prepare(x, block, axis, signs, "hadamard")
  view = _view(x.shape, axis, block, block, tile)
  y2d, _ = kernels.rotate(kernels.make_params(), view.to_2d(sp.kernel_input(x)), view=view,
                          hadamard_stages=hm, signs=signs, interpret=sp.resolve_interpret(interpret))
  return view.from_2d(y2d, view.m, view.n, _rotated_shape(x.shape, axis, block))


def _amax_t_bits(fmt, x2d, view, hm, signs, tensor_amax, prescale, interpret):
  """NVFP4's amax_t of the rotated (pre-scaled) tensor: a rotate-and-reduce pass that writes no
  values, with the same in-kernel rotation as the quantizer, so the two agree exactly."""
  if fmt.scale != "ue4m3" or not fmt.tensor_scale or tensor_amax is not None:
    return None
  (tile_amax,) = kernels.rotate(kernels.make_params(), x2d, view=view, hadamard_stages=hm,
                                signs=signs, interpret=interpret, values=False, prescale=prescale)
  return jnp.max(tile_amax)


def _params(fmt, x2d, view, hm, signs, *, key, rounding, tensor_amax, prescale, interpret):
  amax_t_bits = _amax_t_bits(fmt, x2d, view, hm, signs, tensor_amax, prescale, interpret)
  amax_t_bits, consts = ops.nvfp4_inputs(fmt, None, tensor_amax, amax_t_bits)
  params = kernels.make_params(key_rows=key if rounding == "stochastic" else None,
                               amax_t_bits=amax_t_bits, nvfp4=consts)
  return params, amax_t_bits


def hadamard_quantize(x, fmt, *, block: int, signs=None, axis: int = -1,
                      rounding: str = "nearest_even", scale_mode=None, key=None, tensor_amax=None,
                      prescale: float | None = None, interpret=None, tile=None):
  """quantize(rotate(x) [* prescale]) fused: see the module docstring.

  Args:
    x: float array; `axis` is the GEMM's contraction axis (rotated and blocked).
    fmt, rounding, scale_mode, key, tensor_amax: as `lpjax.quant.quantize`, applied to the rotated
      array (NVFP4's amax_t is that of the rotated array unless `tensor_amax` is given).
    block: the rotation block g (a power of two >= 16).
    signs: float ±1 of shape (block,) (`operand.hadamard_signs`), or None for all +1.
    prescale: the stochastic-rounding pre-scale of an OperandQuant (`sr_prescale`), applied after
      the rotation as `operand._pre` does; None for none.
    interpret, tile: as `lpjax.pallas.quantize`.

  Returns:
    A QArray of the rotated shape (the axis padded to a multiple of `block`), dtype float32.
  """
  x, axis, signs, hm = _prepare(x, block, axis, signs, "hadamard_quantize")
  fmt, scale_mode = sp.check_options(fmt, rounding, scale_mode, key)
  interpret = sp.resolve_interpret(interpret)
  shape = _rotated_shape(x.shape, axis, block)
  view = _view(x.shape, axis, block, fmt.block_size, tile)
  x2d = view.to_2d(sp.kernel_input(x))
  params, amax_t_bits = _params(fmt, x2d, view, hm, signs, key=key, rounding=rounding,
                                tensor_amax=tensor_amax, prescale=prescale, interpret=interpret)
  outs = kernels.quantize(params, x2d, view=view, fmt=fmt, rounding=rounding,
                          scale_mode=scale_mode, interpret=interpret, hadamard_stages=hm,
                          signs=signs, prescale=prescale)
  direction = view.directions[0]
  [(codes, scales)] = ops.unview(outs, view, fmt, shape, {direction: axis})
  return ops.make_qarray(codes, scales, amax_t_bits, fmt, shape, axis, jnp.dtype(F32))


def _fake_impl(x, signs, params, static):
  fmt, axis, block, rounding, scale_mode, prescale, interpret, tile, _ = static
  _, hm = _check_block(block, signs)
  view = _view(x.shape, axis, block, fmt.block_size, tile)
  out = kernels.fake_quant(params, view.to_2d(sp.kernel_input(x)), view=view, fmt=fmt,
                           rounding=rounding, scale_mode=scale_mode, out_dtype=jnp.dtype(F32),
                           interpret=interpret, hadamard_stages=hm, signs=signs,
                           prescale=prescale)
  return view.from_2d(out, view.m, view.n, _rotated_shape(x.shape, axis, block))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _hadamard_fake_quant(x, signs, params, static):
  return _fake_impl(x, signs, params, static)


def _hfq_fwd(x, signs, params, static):
  return _fake_impl(x, signs, params, static), signs


def _hfq_bwd(static, signs, g):
  """Straight-through quantizer: the gradient of the rotation (and pre-scale) alone."""
  _, axis, block, _, _, prescale, _, _, (length, dtype) = static
  if prescale is not None:
    g = g * F32(prescale)
  gx = jax.lax.slice_in_dim(xla_hadamard(g, block, axis=axis, signs=signs, inverse=True), 0,
                            length, axis=axis)
  return gx.astype(dtype), None, None


_hadamard_fake_quant.defvjp(_hfq_fwd, _hfq_bwd)


def hadamard_fake_quant(x, fmt, *, block: int, signs=None, axis: int = -1,
                        rounding: str = "nearest_even", scale_mode=None, key=None,
                        tensor_amax=None, prescale: float | None = None, interpret=None,
                        tile=None) -> jax.Array:
  """fake_quant(rotate(x) [* prescale]) fused, in float32 and of the rotated shape.

  Takes `hadamard_quantize`'s arguments. These are the values `operand.fake` multiplies before it
  divides by the pre-scale and casts. The gradient is the rotation's (straight-through quantizer),
  at the rotated (padded) length; slice it as you slice the output.
  """
  x, axis, signs, hm = _prepare(x, block, axis, signs, "hadamard_fake_quant")
  fmt, scale_mode = sp.check_options(fmt, rounding, scale_mode, key)
  interpret = sp.resolve_interpret(interpret)
  view = _view(x.shape, axis, block, fmt.block_size, tile)
  if tensor_amax is not None:
    tensor_amax = jax.lax.stop_gradient(tensor_amax)
  x2d = view.to_2d(sp.kernel_input(jax.lax.stop_gradient(x)))
  params, _ = _params(fmt, x2d, view, hm, jax.lax.stop_gradient(signs), key=key,
                      rounding=rounding, tensor_amax=tensor_amax, prescale=prescale,
                      interpret=interpret)
  static = (fmt, axis, block, rounding, scale_mode, None if prescale is None else float(prescale),
            interpret, plan.check_tile(tile), (x.shape[axis], x.dtype))
  return _hadamard_fake_quant(x, signs, params, static)
