"""The Pallas kernels: one tile of the 2-D view (`plan.View`) per program.

Every kernel takes a small uint32 `params` vector (PARAMS_* slots: the stochastic-rounding keys'
stream words and NVFP4 per-tensor values) and the tiles of its array operands. Random bits are
`rng.hash_bits(flat index, *rng.stream_words(key))` with the flat index of each element in the
quantized array's own shape, rebuilt from `pl.program_id`, so they do not depend on the tile grid
(docs/quant.md, "Rounding"). The kernels run on the Triton backend of Pallas on GPU (`compiler_params` select it;
JAX's default GPU backend is Mosaic GPU) and in interpret mode anywhere.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lpjax.quant.formats import specs as formats
  >>> from lpjax.pallas import _plan as plan
  >>> x = jnp.linspace(-6.0, 6.0, 64).reshape(2, 32)
  >>> view = plan.make_view(x.shape, 1, 32, ("rows",))
  >>> params = make_params()
  >>> codes, scales = quantize(params, view.to_2d(x), view=view, fmt=formats.get_format("mxfp4"),
  ...                          rounding="nearest_even", scale_mode="floor", interpret=True)
  >>> codes.shape, scales.shape, int(scales[0, 0])
  ((2, 16), (2, 1), 127)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from lpjax.pallas import _tile_codec as tc
from lpjax.quant.numerics import fp32_bits as fb
from lpjax.quant.schemes.hadamard import normalizer as hadamard_normalizer
from lpjax.quant.numerics import rng

U32 = jnp.uint32
I32 = jnp.int32
U8 = jnp.uint8
F32 = jnp.float32
# Slots of the params vector (KEY_ROWS: the stream words (a, m) of the first direction's key,
# KEY_COLS: the second's; FLAT_OFFSET: added to every flat index, the global position of a
# shard's first element).
KEY_ROWS, KEY_COLS, AMAX_T, NV_C_SIG, NV_C_EXP, NV_RECIP, FLAT_OFFSET = 0, 2, 4, 5, 6, 7, 8
N_PARAMS = 16  # a power of two (a Triton block); slots 9.. unused


def make_params(key_rows=None, key_cols=None, amax_t_bits=None, nvfp4=None):
  """The uint32 params vector: keys' stream words (rows, cols), NVFP4 amax_t and per-tensor constants."""
  words = [U32(0)] * N_PARAMS
  for slot, key in ((KEY_ROWS, key_rows), (KEY_COLS, key_cols)):
    if key is not None:
      words[slot], words[slot + 1] = rng.stream_words(key)
  if amax_t_bits is not None:
    words[AMAX_T] = amax_t_bits
  if nvfp4 is not None:
    words[NV_C_SIG], words[NV_C_EXP], words[NV_RECIP] = nvfp4
  return jnp.stack([jnp.asarray(w, U32).reshape(()) for w in words])


def _compiler_params(tile, interpret):
  if interpret:
    return None
  from jax.experimental.pallas import triton as pltriton  # noqa: PLC0415 (GPU only)
  return pltriton.CompilerParams(num_warps=4 if tile[0] * tile[1] <= 4096 else 8, num_stages=1)


def _tile_spec(block):
  return pl.BlockSpec(block, lambda i, j: (i, j))


def _params_spec():
  return pl.BlockSpec((N_PARAMS,), lambda i, j: (0,))


def _call(kernel, view, operands, in_blocks, outs, interpret, name):
  """pallas_call over view.grid; `outs` is a list of (shape, dtype, block)."""
  return pl.pallas_call(
      kernel,
      grid=view.grid,
      in_specs=[_params_spec()] + [_tile_spec(b) if isinstance(b, tuple) else b for b in in_blocks],
      out_specs=[_tile_spec(block) for _, _, block in outs],
      out_shape=[jax.ShapeDtypeStruct(shape, dtype) for shape, dtype, _ in outs],
      interpret=interpret,
      compiler_params=_compiler_params(view.tile, interpret),
      name=name,
  )(*operands)


# --------------------------------------------------------------------------- in-kernel pieces


def _flat_index(view, tile):
  """uint32 flat index (row-major, in the logical (P, M, N) shape) of each element of the tile."""
  tm, tn = tile
  row0 = pl.program_id(0) * tm
  slab = jax.lax.div(row0, I32(view.m_pad))  # tiles never straddle two slabs
  m0 = row0 - slab * view.m_pad
  rows = (m0 + jax.lax.broadcasted_iota(I32, tile, 0)).astype(U32)
  cols = (pl.program_id(1) * tn + jax.lax.broadcasted_iota(I32, tile, 1)).astype(U32)
  base = slab.astype(U32) * U32((view.m * view.n) % 2**32)
  return base + rows * U32(view.n % 2**32) + cols


def _random_bits(params_ref, slot, view, tile):
  flat = _flat_index(view, tile) + params_ref[FLAT_OFFSET]
  return tc.random_bits(flat, params_ref[slot], params_ref[slot + 1])


def _nvfp4(params_ref, fmt):
  if fmt.scale != "ue4m3":
    return None
  return params_ref[NV_C_SIG], params_ref[NV_C_EXP], params_ref[NV_RECIP]


def _grouped(a, direction, block):
  tm, tn = a.shape
  if direction == "rows":
    return a.reshape(tm, tn // block, block), 2
  return a.reshape(tm // block, block, tn), 1


def _encode(bits, params_ref, *, fmt, direction, rounding, scale_mode, view, key_slot):
  """(codes (tm, tn), scales 2-D, both uint32) of a tile of float32 bits along `direction`."""
  block = fmt.block_size
  rbits = None
  if rounding == "stochastic":
    rbits, _ = _grouped(_random_bits(params_ref, key_slot, view, bits.shape), direction, block)
  grouped, axis = _grouped(bits, direction, block)
  codes, scales = tc.encode(grouped, fmt, axis, rounding=rounding, scale_mode=scale_mode,
                            random_bits=rbits, nvfp4=_nvfp4(params_ref, fmt))
  return codes, scales


def _codes_out(codes, fmt, direction):
  """Grouped uint32 codes -> the tile's uint8 codes (4-bit ones packed along `direction`)."""
  codes2d = codes.reshape(_tile_of(codes, direction))
  if fmt.element.is_packed:
    codes2d = tc.pack_nibbles(codes2d, 1 if direction == "rows" else 0)
  return codes2d.astype(U8)


def _tile_of(grouped, direction):
  s = grouped.shape
  return (s[0], s[1] * s[2]) if direction == "rows" else (s[0] * s[1], s[2])


def _scales_out(scales, direction):
  s = scales.shape
  return scales.reshape((s[0], s[1]) if direction == "rows" else (s[0], s[2])).astype(U8)


def _decode(codes, scales, params_ref, fmt):
  amax = params_ref[AMAX_T] if fmt.tensor_scale else None
  return tc.decode(codes, scales, fmt, amax)


def _stage_dot(v, stage):
  return jnp.dot(v, stage, precision=jax.lax.Precision.HIGHEST)


def _nonfinite_stage(xb, stage):
  """One butterfly stage with IEEE semantics for Inf and NaN, from dots: each output column is
  a + s * b (s = +-1), which a dot cannot give when a or b is not finite (0 * Inf is NaN). The
  finite values go through the dot with the non-finite ones as 0; two small-integer dots count,
  per output, the infinities by effective sign and the NaNs; then, as fl(a + s * b) does: any NaN
  or two opposite infinities give NaN, otherwise an infinity gives itself."""
  bits = fb.to_bits(xb) & U32(fb.ABS_MASK)
  finite = bits < U32(fb.INF_BITS)
  nan = bits > U32(fb.INF_BITS)
  value = _stage_dot(jnp.where(finite, xb, F32(0)), stage)
  signed_inf = jnp.where(finite | nan, F32(0), jnp.where(xb > 0, F32(1), F32(-1)))
  count = jnp.where(finite, F32(0), jnp.where(nan, F32(4), F32(1)))  # infinities + 4 x NaNs
  sign_sum = _stage_dot(signed_inf, stage)  # +-1, +-2 or 0 (no infinity, or opposite ones)
  counts = _stage_dot(count, jnp.abs(stage))
  out_nan = (counts >= 4) | ((counts == 2) & (sign_sum == 0))
  out = jnp.where(sign_sum > 0, F32(np.inf), F32(-np.inf))
  out = jnp.where(out_nan, F32(np.nan), out)
  return jnp.where(counts == 0, value, out)


def _butterfly_stage(xb, stage):
  """xb @ stage, but with the butterflies' own Inf / NaN results (lpjax.quant.hadamard's): the
  plain dot when the tile is finite, `_nonfinite_stage` (three dots) only for a tile holding an
  Inf or NaN, checked before every stage (finite inputs may overflow to Inf in a stage)."""
  worst = jnp.max(fb.to_bits(xb) & U32(fb.ABS_MASK))
  return jax.lax.cond(worst < U32(fb.INF_BITS), _stage_dot, _nonfinite_stage, xb, stage)


def _rotate(x, h_ref, signs_ref, direction, hadamard):
  """The RHT of a tile in float32, as lpjax.quant.hadamard computes it: the butterfly stages (one
  dot each with a stage matrix of h_ref), fl32(1 / sqrt(g)), zeros as +0, per rotation block."""
  n_stages, g = h_ref.shape[0], h_ref.shape[-1]
  tm, tn = x.shape
  signs = signs_ref[...]
  if direction == "rows":
    xb = (x.reshape(tm, tn // g, g) * signs[None, None, :]).reshape(tm * tn // g, g)
  else:  # the tile is one rotation block tall: rotate its columns, as rows like hadamard.py does
    xb = (x * signs[:, None]).T
  for i in range(n_stages):  # one load per stage (Triton has no rule for slicing a value)
    xb = _butterfly_stage(xb, h_ref[i])
  xb = xb * F32(hadamard_normalizer(g, np.float32))
  xb = jnp.where(xb == 0, F32(0), xb)
  y = xb.reshape(tm, tn) if direction == "rows" else xb.T
  prescale = hadamard[1]
  if prescale is not None:  # the SR pre-scale of operand._pre, after the rotation
    y = y * F32(prescale)
  return y


# --------------------------------------------------------------------------- kernels


def _quantize_kernel(params_ref, x_ref, *refs, fmt, directions, rounding, scale_mode, view,
                     hadamard=None):
  out_refs = refs
  if hadamard is not None:
    (h_ref, signs_ref), out_refs = refs[:2], refs[2:]
  x = x_ref[...].astype(F32)
  if hadamard is not None:
    x = _rotate(x, h_ref, signs_ref, directions[0], hadamard)
  bits = fb.to_bits(x)
  for n, direction in enumerate(directions):
    codes_ref, scales_ref = out_refs[2 * n: 2 * n + 2]
    codes, scales = _encode(bits, params_ref, fmt=fmt, direction=direction, rounding=rounding,
                            scale_mode=scale_mode, view=view, key_slot=(KEY_ROWS, KEY_COLS)[n])
    codes_ref[...] = _codes_out(codes, fmt, direction)
    scales_ref[...] = _scales_out(scales, direction)


def _fake_kernel(params_ref, x_ref, *refs, fmt, direction, rounding, scale_mode, view,
                 hadamard=None):
  if hadamard is not None:
    h_ref, signs_ref, out_ref = refs
  else:
    (out_ref,) = refs
  x = x_ref[...].astype(F32)
  if hadamard is not None:
    x = _rotate(x, h_ref, signs_ref, direction, hadamard)
  codes, scales = _encode(fb.to_bits(x), params_ref, fmt=fmt, direction=direction,
                          rounding=rounding, scale_mode=scale_mode, view=view, key_slot=KEY_ROWS)
  out = _decode(codes, scales, params_ref, fmt)
  out_ref[...] = fb.from_bits(out.reshape(_tile_of(out, direction))).astype(out_ref.dtype)


def _dequantize_kernel(params_ref, codes_ref, scales_ref, out_ref, *, fmt, direction):
  codes = codes_ref[...].astype(U32)
  if fmt.element.is_packed:
    codes = tc.unpack_nibbles(codes, 1 if direction == "rows" else 0)
  grouped, _ = _grouped(codes, direction, fmt.block_size)
  scales = scales_ref[...].astype(U32)
  scales = scales[:, :, None] if direction == "rows" else scales[:, None, :]
  out = _decode(grouped, scales, params_ref, fmt)
  out_ref[...] = fb.from_bits(out.reshape(_tile_of(out, direction))).astype(out_ref.dtype)


def _rotate_kernel(params_ref, x_ref, h_ref, signs_ref, *out_refs, direction, hadamard):
  del params_ref
  y = _rotate(x_ref[...].astype(F32), h_ref, signs_ref, direction, hadamard)
  if len(out_refs) == 2:
    out_refs[0][...] = y
  amax_ref = out_refs[-1]
  abs_bits = fb.to_bits(y) & U32(fb.ABS_MASK)
  finite = jnp.where(abs_bits < U32(fb.INF_BITS), abs_bits, U32(0))
  amax_ref[...] = jnp.max(finite).reshape(1, 1)


# --------------------------------------------------------------------------- host-side callers


def _code_dims(fmt, direction, view):
  """(rows, cols) of the 2-D codes, scales arrays and their blocks for one direction."""
  tm, tn = view.tile
  b = fmt.block_size
  pack = 2 if fmt.element.is_packed else 1
  if direction == "rows":
    return ((view.rows, view.n_pad // pack), (tm, tn // pack),
            (view.rows, view.n_pad // b), (tm, tn // b))
  return ((view.rows // pack, view.n_pad), (tm // pack, tn),
          (view.rows // b, view.n_pad), (tm // b, tn))


def _hadamard_inputs(hadamard_stages, signs):
  """hadamard_stages: the butterfly stage matrices, (log2(g), g, g) (quant._hadamard)."""
  stages, g = hadamard_stages.shape[0], hadamard_stages.shape[-1]
  return [hadamard_stages, signs], [pl.BlockSpec((stages, g, g), lambda i, j: (0, 0, 0)),
                                    pl.BlockSpec((g,), lambda i, j: (0,))]


def quantize(params, x2d, *, view, fmt, rounding, scale_mode, interpret, hadamard_stages=None,
             signs=None, prescale=None):
  """Codes and scales (2-D, uint8) of x2d along each of view.directions (a flat list)."""
  outs = []
  for direction in view.directions:
    codes_shape, codes_block, scales_shape, scales_block = _code_dims(fmt, direction, view)
    outs += [(codes_shape, U8, codes_block), (scales_shape, U8, scales_block)]
  operands, blocks = [params, x2d], [view.tile]
  if hadamard_stages is not None:
    extra, extra_blocks = _hadamard_inputs(hadamard_stages, signs)
    operands, blocks = operands + extra, blocks + extra_blocks
  kernel = functools.partial(_quantize_kernel, fmt=fmt, directions=view.directions,
                             rounding=rounding, scale_mode=scale_mode, view=view,
                             hadamard=_rht(hadamard_stages, prescale))
  return _call(kernel, view, operands, blocks, outs, interpret, "lpjax_quantize")


def _rht(hadamard_stages, prescale):
  """The kernels' `hadamard` argument: None (no RHT) or ("rht", pre-scale or None)."""
  return None if hadamard_stages is None else ("rht", None if prescale is None else float(prescale))


def fake_quant(params, x2d, *, view, fmt, rounding, scale_mode, out_dtype, interpret,
               hadamard_stages=None, signs=None, prescale=None):
  """fake-quantized values of x2d along view.directions[0], (rows, n_pad) in out_dtype."""
  operands, blocks = [params, x2d], [view.tile]
  if hadamard_stages is not None:
    extra, extra_blocks = _hadamard_inputs(hadamard_stages, signs)
    operands, blocks = operands + extra, blocks + extra_blocks
  kernel = functools.partial(_fake_kernel, fmt=fmt, direction=view.directions[0],
                             rounding=rounding, scale_mode=scale_mode, view=view,
                             hadamard=_rht(hadamard_stages, prescale))
  outs = [((view.rows, view.n_pad), out_dtype, view.tile)]
  return _call(kernel, view, operands, blocks, outs, interpret, "lpjax_fake_quant")[0]


def dequantize(params, codes2d, scales2d, *, view, fmt, out_dtype, interpret):
  """Values (rows, n_pad) in out_dtype of 2-D codes and scales laid out as `quantize` writes."""
  direction = view.directions[0]
  _, codes_block, _, scales_block = _code_dims(fmt, direction, view)
  kernel = functools.partial(_dequantize_kernel, fmt=fmt, direction=direction)
  outs = [((view.rows, view.n_pad), out_dtype, view.tile)]
  return _call(kernel, view, [params, codes2d, scales2d], [codes_block, scales_block], outs,
               interpret, "lpjax_dequantize")[0]


def rotate(params, x2d, *, view, hadamard_stages, signs, interpret, values=True, prescale=None):
  """[RHT of x2d [* prescale] in float32 (if `values`), per-tile finite amax bits (uint32,
  view.grid)] along view.directions[0]."""
  extra, extra_blocks = _hadamard_inputs(hadamard_stages, signs)
  kernel = functools.partial(_rotate_kernel, direction=view.directions[0],
                             hadamard=_rht(hadamard_stages, prescale))
  outs = [((view.rows, view.n_pad), F32, view.tile)] if values else []
  outs.append((view.grid, U32, (1, 1)))
  return _call(kernel, view, [params, x2d] + extra, [view.tile] + extra_blocks, outs, interpret,
               "lpjax_hadamard")
