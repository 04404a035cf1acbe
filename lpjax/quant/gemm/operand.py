"""One GEMM operand through its recipe: RHT, SR pre-scale, quantize, dequantize; keys; statistics.

`fake(x, op, axis=..., ...)` gives the values a quantized GEMM multiplies (in the compute dtype);
`pack` / `unpack` split the same computation at the packed `QArray`, for the memory-saving
residual mode, and give bit-identical values. Keys are derived deterministically from the layer's
key: `operand_key(key, "dgrad", LHS)` etc., and `hadamard_signs(key, gemm, block)` (shared by both
operands of the GEMM), each one `rng.fold_in(key, 4 * gemm + slot)` (docs/numerics.md §7).

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lpjax.quant.recipes.gemm_recipe import OperandQuant
  >>> x = jax.random.normal(jax.random.key(0), (4, 64))
  >>> op = OperandQuant("mxfp4", hadamard_block=32)
  >>> signs = hadamard_signs(None, "fwd", 32)
  >>> x_hat = jax.jit(lambda x: fake(x, op, axis=-1, key=None, signs=signs))(x)
  >>> x_hat.shape, x_hat.dtype
  ((4, 64), dtype('float32'))
  >>> via_qarray = jax.jit(lambda x: unpack(pack(x, op, axis=-1, key=None, signs=signs), op, x.dtype))
  >>> bool((via_qarray(x) == x_hat).all())
  True
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.quant.schemes import nvfp4 as schemes
from lpjax.quant.numerics import rng
from lpjax.quant.schemes import ssp
from lpjax.quant.schemes.quest import quest
from lpjax.quant.schemes.hadamard import hadamard, random_signs
from lpjax.quant.codec import fast_elements, qarray
from lpjax.quant.codec.qarray import QArray, dequantize, fake_quant, quantize
from lpjax.quant.codec.unpacked import Unpacked, quantize_unpacked
from lpjax.quant.recipes.gemm_recipe import OperandQuant
from lpjax.quant.formats.tables import decode_table

GEMM_IDS = {"fwd": 0, "dgrad": 1, "wgrad": 2}
LHS, RHS = 0, 1
_SIGNS = 2  # fold_in slot of a GEMM's Hadamard signs (operands use 0 and 1)
_DEFAULT_SIGNS_SEED = 0x5EED  # fixed signs when no key is given (a deterministic RHT)


def _tag(gemm: str, slot: int) -> int:
  """The `rng.fold_in` tag of one GEMM's operand (slot LHS / RHS) or RHT signs (_SIGNS)."""
  return 4 * GEMM_IDS[gemm] + slot


def operand_key(key, gemm: str, side: int):
  """The SR key of operand `side` (LHS / RHS) of `gemm`, derived from the layer's key: one
  `rng.fold_in` (a counter hash; Threefry's fold_in compiles to ten kernels a call)."""
  return None if key is None else rng.fold_in(key, _tag(gemm, side))


def hadamard_signs(key, gemm: str, block: int):
  """The ±1 RHT signs of `gemm`, shared by both its operands; fixed signs when key is None."""
  base = jax.random.key(_DEFAULT_SIGNS_SEED) if key is None else key
  return random_signs(rng.fold_in(base, _tag(gemm, _SIGNS)), block)


def operand_streams(key, places) -> list:
  """[the stream of `operand_key(key, gemm, side)` for each (gemm, side) of `places`]: the same
  random bits (`rng.Stream`), every key's derivation and stream words one kernel."""
  return rng.derived_streams(key, [_tag(g, side) for g, side in places])


def rotate(x, block: int, axis: int, signs):
  """RHT of `x` along `axis` in float32 (or wider), zero-padding the axis to a multiple of `block`.

  Both operands of a GEMM are padded alike, so the padded contraction gives the same product.
  """
  x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
  axis = axis % x.ndim
  pad = (-x.shape[axis]) % block
  if pad:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    x = jnp.pad(x, widths)
  return hadamard(x, block, axis=axis, signs=signs)


def _pre(x, op: OperandQuant, axis: int, signs, block: int | None):
  """Everything before rounding: the RHT (if the GEMM has one) and the SR pre-scale."""
  if block:
    x = rotate(x, block, axis, signs)
  if op is not None and op.sr_prescale is not None:
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32)) * np.float32(op.sr_prescale)
  return x


def _post(x_hat, op: OperandQuant, dtype):
  if op.sr_prescale is not None:
    x_hat = x_hat / np.float32(op.sr_prescale)
  return x_hat.astype(dtype)


def _quantize_kwargs(op: OperandQuant, axis: int, key):
  if op.stochastic and key is None:
    raise ValueError(f"Operand quantizer {op} uses stochastic rounding and needs a key: pass "
                     "key=jax.random.key(...) to dot_general (or an 'quant' RNG stream to the layer).")
  return dict(axis=axis, rounding=op.rounding, scale_mode=op.scale_mode,
              key=key if op.stochastic else None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _scheme_fake(xs, key, op: OperandQuant, axis: int, block: int | None):
  """A scheme's fake quantization along `axis`, with a straight-through gradient (QuEST's trust
  mask is applied by the GEMM's backward, `lpjax.quant.gemm.dot_general`)."""
  if op.stochastic and key is None:
    raise ValueError(f"Operand quantizer {op} rounds stochastically and needs a key: pass "
                     "key=jax.random.key(...) to dot_general (or a 'quant' RNG stream to the layer).")
  dtype = xs.dtype
  x = jnp.moveaxis(xs.astype(jnp.float32), axis, -1)
  if op.scheme == "four_over_six":
    y = schemes.four_over_six(x, tile=op.format.tile, rounding=op.rounding, key=key)
  elif op.scheme == "quest":
    y = quest(x, op.format.block_size)[0]
  else:
    if block != op.hadamard_block:
      raise ValueError(f"scheme='ms_eden' runs after its GEMM's Hadamard transform of block "
                       f"{op.hadamard_block}; got block={block}.")
    y = schemes.ms_eden(x, group=op.hadamard_block, key=key)
  return jnp.moveaxis(y, -1, axis).astype(jnp.promote_types(dtype, jnp.float32))


def _scheme_fake_fwd(xs, key, op, axis, block):
  return _scheme_fake(xs, key, op, axis, block), None


def _scheme_fake_bwd(op, axis, block, _, g):
  return g, None


_scheme_fake.defvjp(_scheme_fake_fwd, _scheme_fake_bwd)


def fake(x, op, *, axis: int, key, signs=None, block: int | None = None, dtype=None):
  """The GEMM-ready values of operand `x`: RHT (block) -> pre-scale -> fake-quantize -> unscale.

  Args:
    x: the operand, its contraction axis at `axis`.
    op: an OperandQuant, or None for a high-precision operand (then only the RHT applies).
    axis: the contraction axis (the blocked axis).
    key: SR key of this operand (`operand_key`); needed when op rounds stochastically.
    signs: the GEMM's RHT signs (`hadamard_signs`), when block is set.
    block: the GEMM's Hadamard block (`GemmQuant.hadamard_block`), or None.
    dtype: output dtype (the recipe's compute dtype); None keeps x's dtype.

  Returns:
    An array of x's shape (the axis padded to a multiple of `block`) in `dtype`.
  """
  dtype = jnp.dtype(x.dtype if dtype is None else dtype)
  if op is None and not block:
    return x.astype(dtype)
  return _fake(x, key, signs, op=op, axis=axis, block=block, dtype=dtype,
               context=(qarray._auto_uses_kernels(), fast_elements.reference_active()))


# `fake` is jitted with its options static, so that a model traces each operand quantizer
# (RHT, pre-scale, quantizer, unscale) once per (shape, dtype, options), however many GEMM sites
# and passes apply it: each further site is a cache hit, a call that XLA inlines (the same
# arithmetic, the same bits). Tracing them anew at every site was most of an FP4 step's trace.
# `context` is what the trace reads besides its arguments: whether impl="auto" runs the kernels
# (the backend, LPJAX_PALLAS_AUTO) and whether `reference_arithmetic()` is on. It is part of the
# cache key, so a cached trace never keeps a dispatch or an element path that no longer holds.
@functools.partial(jax.jit, static_argnames=("op", "axis", "block", "dtype", "context"))
def _fake(x, key, signs, *, op, axis: int, block, dtype, context: tuple):
  del context  # a cache key only (see above)
  xs = _pre(x, op, axis, signs, block)
  if op is None:
    return xs.astype(dtype)
  if op.is_ssp:
    return _post(ssp.quantize_ssp(xs, op.fmt, axis=axis), op, dtype)
  if op.scheme:
    return _post(_scheme_fake(xs, key, op, axis % xs.ndim, block), op, dtype)
  return _post(fake_quant(xs, op.fmt, **_quantize_kwargs(op, axis, key)), op, dtype)


def pack(x, op: OperandQuant, *, axis: int, key, signs=None, block: int | None = None):
  """Like `fake` but stops at the packed QArray (SSP and scheme quantizers: the fake-quantized
  array)."""
  xs = _pre(x, op, axis, signs, block)
  if op.is_ssp:
    return ssp.quantize_ssp(xs, op.fmt, axis=axis)
  if op.scheme:
    return _scheme_fake(xs, key, op, axis % xs.ndim, block)
  return quantize(xs, op.fmt, **_quantize_kwargs(op, axis, key))


def unpack(q, op: OperandQuant, dtype):
  """The values `fake` would give, from what `pack` returned."""
  if isinstance(q, QArray):
    return _post(dequantize(q, q.dtype), op, dtype)
  return _post(q, op, dtype)


def quantize_view(x, op: OperandQuant, *, axis: int, key, signs=None, block: int | None = None):
  """What the quantizer of `op` sees and gives, for measuring it (never used by the GEMM itself).

  Returns (xs, x_hat, q): the quantizer's float32 input (after the RHT and the pre-scale, under
  stop_gradient), its dequantized output in float32 (the values `fake` gives, before unscaling),
  and the quantization's codes and scales, unpacked (`unpacked.Unpacked`; None for SSP and scheme
  quantizers, which keep no codes and scales).
  """
  xs = jax.lax.stop_gradient(_pre(x, op, axis, signs, block)).astype(jnp.float32)
  q = None
  if op.is_ssp:  # scaled by the absmax of what they round: these grids cannot saturate
    x_hat = ssp.quantize_ssp(xs, op.fmt, axis=axis).astype(jnp.float32)
  elif op.scheme:  # scales chosen per block (QuEST: clipping is its trust mask): not tracked
    x_hat = _scheme_fake(xs, key, op, axis % xs.ndim, block).astype(jnp.float32)
  else:
    q = quantize_unpacked(xs, op.fmt, **_quantize_kwargs(op, axis, key))
    x_hat = q.values
  return xs, x_hat, q


def fake_seen(x, op: OperandQuant, *, axis: int, key, signs=None, block: int | None = None,
              dtype=None, pack: bool = False):
  """(`fake(...)`, or `pack(...)` if `pack`; and `quantize_view(...)`'s (xs, x_hat, q)) from one
  quantization, for a core format (not SSP, not a scheme): the GEMM multiplies what the monitor
  measures, bit for bit `fake`'s values (one encode gives the codes, the scales and the values:
  `unpacked.quantize_unpacked`, no nibble packing and no second decode unless `pack`)."""
  dtype = x.dtype if dtype is None else dtype
  xs = _pre(x, op, axis, signs, block)
  q = jax.lax.stop_gradient(quantize_unpacked(xs, op.fmt, **_quantize_kwargs(op, axis, key)))
  view = (jax.lax.stop_gradient(xs).astype(jnp.float32), q.values, q)
  return (q.packed() if pack else _post(q.values.astype(xs.dtype), op, dtype)), view


def stats(x, op: OperandQuant, *, axis: int, key, signs=None, block: int | None = None):
  """Numerics statistics of quantizing `x` with `op` (never used by the computation itself).

  Returns a dict of float32 scalars, measured on the quantizer's input (after the RHT and the
  pre-scale) and its dequantized output:
    amax: max |x|;
    frac_saturated: fraction of elements clipped at the element format's largest code
      (the block maximum of an OCP floor-scaled block can exceed it by up to 25%);
    frac_flushed: fraction of non-zero elements that quantize to zero;
    snr_db: 10 log10(sum x^2 / sum (x - q(x))^2) (inf when exact).
  """
  xs, x_hat, q = quantize_view(x, op, axis=axis, key=key, signs=signs, block=block)
  saturated = jnp.zeros(xs.shape, bool) if q is None else saturated_mask(xs, x_hat, q)
  err = jnp.sum(jnp.square(xs - x_hat))
  power = jnp.sum(jnp.square(xs))
  snr = jnp.where(err > 0, 10.0 * jnp.log10(power / jnp.where(err > 0, err, 1.0)), jnp.inf)
  return dict(
      amax=jnp.max(jnp.abs(xs)) if xs.size else jnp.float32(0),
      frac_saturated=jnp.mean(saturated.astype(jnp.float32)),
      frac_flushed=jnp.mean(((xs != 0) & (x_hat == 0)).astype(jnp.float32)),
      snr_db=snr.astype(jnp.float32),
  )


def saturated_mask(xs, x_hat, q: Unpacked):
  """Elements whose code is the largest magnitude and whose input lay beyond it (clipped)."""
  element = q.fmt.element
  if element.kind == "uint":  # min/max scaling maps the group range onto the codes: no clipping
    return jnp.zeros(xs.shape, bool)
  at_max = functools.reduce(jnp.logical_or, (q.codes == c for c in _max_codes(element)))
  # Beyond by more than fp32 round-off of the scale (per-tensor fp32 scales are not exact).
  return at_max & (jnp.abs(xs) > jnp.abs(x_hat) * (1 + 2.0**-12)) & (x_hat != 0)


@functools.lru_cache(maxsize=None)
def _max_codes(element) -> tuple:
  """The element codes of the largest magnitude (+- max_value): compared with, not looked up."""
  table = np.abs(decode_table(element))
  return tuple(np.uint8(c) for c in np.flatnonzero(table == element.max_value))


def fake_quant_operand(x, op: OperandQuant, *, axis: int = -1, key=None):
  """`x` through the quantizer of `op` (pre-scale, fake-quantize, unscale), without the GEMM's
  Hadamard transform: e.g. a "pure" FP4 model's embedding table as its LM head's weight quantizer.

  Examples:
    >>> import jax.numpy as jnp
    >>> from lpjax.quant import OperandQuant
    >>> fake_quant_operand(jnp.array([[0.3, 1.1, -2.9, 6.5]]), OperandQuant("mxfp4")).tolist()
    [[0.5, 1.0, -3.0, 6.0]]
  """
  return fake(x, op, axis=axis, key=key)
