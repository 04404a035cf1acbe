"""The operands of the three passes (fwd, dgrad, wgrad) of the quantized GEMM `dot_general`.

For each pass and side this module gives the operand in the layout the GEMM multiplies it in:
quantized from the high-precision values by the recipe's operand quantizer (`pass_operand`,
`fwd_operand`), the forward's quantized operand again where the recipe reuses it (`reuse`), or
unpacked from a residual that `residuals="quantized"` packed in the forward pass (`residual`,
`residual_axes`, `unpacked`). A blocked axis is moved last when there is per-block work along it
(`to_last`); under `weight_sharding` an operand keeps its quantization on its shards and a weight
is gathered as codes and scales (`lpjax.quant.gemm.weight_gather`). QuEST's backward masks and
rotates a pass's gradient back (`through_trust_mask`). `as_key` and `gemm_signs` give the keys
and random Hadamard signs the passes are quantized with.

Examples:
  >>> import jax.numpy as jnp
  >>> from lpjax.quant import recipes
  >>> recipe = recipes.get("mxfp4_naive")
  >>> w, axis = fwd_operand(jnp.ones((64, 32)), RHS, None, recipe)  # W (K, N), blocked along K
  >>> w.shape, axis   # quantized as W^T (N, K): the blocked axis last
  ((32, 64), -1)
  >>> pass_operand(jnp.ones((64, 32)), "dgrad", RHS, -1, None, recipe)[0].shape  # along N
  (64, 32)
"""

from __future__ import annotations

import contextvars

import jax
import jax.numpy as jnp

from lpjax.quant.gemm import operand as opq
from lpjax.quant.gemm import weight_gather as wg
from lpjax.quant.schemes.hadamard import hadamard
from lpjax.quant.schemes.quest import quest, quest_with_mask
from lpjax.quant.gemm.operand import LHS, RHS
from lpjax.quant.recipes.gemm_recipe import REUSE_FWD, GemmRecipe, OperandQuant


# The monitor's operand hook (`lpjax.quant.monitor.observer`), set around the fwd / bwd rules of
# one measured GEMM: None (always, outside a measurement), or `seen(gemm, side, op, view)`, called
# for each operand this module quantizes with a core format (not SSP, not a scheme), with `view`
# = (xs, x_hat, q) as `operand.quantize_view` gives them, from the one quantization the GEMM
# multiplies (`operand.fake_seen`: one encode, its codes unpacked, `unpacked.Unpacked`): the
# statistics read it, no operand is quantized twice.
OPERAND_OBSERVER: contextvars.ContextVar = contextvars.ContextVar("lpjax_operand_observer",
                                                                  default=None)


def as_key(key):
  """Accepts a typed key (jax.random.key) or a raw uint32[2] key (jax.random.PRNGKey)."""
  if key is None:
    return None
  key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return key
  return jax.random.wrap_key_data(key)


def gemm_signs(key, recipe: GemmRecipe, gemm: str, memo: dict | None = None):
  """(random Hadamard signs or None, Hadamard block or None) that `gemm` of `recipe` applies to
  both its operands, from the layer's key (QuEST's forward: a fixed transform, no signs).

  `memo`: a dict kept for one pass of one GEMM call (one `key`): the signs are derived once and
  shared by both operands (and by the backward's re-quantizations of the forward's operands),
  instead of one traced derivation per operand (the same bits, fewer equations to compile).
  """
  if memo is not None and gemm in memo:
    return memo[gemm]
  block = getattr(recipe, gemm).hadamard_block
  if gemm == "fwd" and recipe.trust_masked:
    out = None, block  # QuEST: a fixed Hadamard transform, no random signs (Quartet)
  else:
    out = (opq.hadamard_signs(key, gemm, block) if block else None), block
  if memo is not None:
    memo[gemm] = out
  return out


def operand_key(key, op, gemm: str, side: int, memo: dict | None = None):
  """The SR key of operand `side` of `gemm` (`operand.operand_key`), or None where its quantizer
  draws no random bits (high precision or round to nearest: no scheme uses a key then, nor does
  the quantizer): not derived at all. From `memo`, the stream `derive_pass_keys` derived."""
  if not isinstance(op, OperandQuant) or not op.stochastic:
    return None
  if memo is not None and ("stream", gemm, side) in memo:
    return memo[("stream", gemm, side)]
  return opq.operand_key(key, gemm, side)


def _streams_its_bits(op) -> bool:
  """Whether operand quantizer `op` uses its key for random bits only (a core format's SR: a
  `rng.Stream` serves it); a scheme derives keys of its own from it."""
  return isinstance(op, OperandQuant) and op.stochastic and not op.scheme and not op.is_ssp


def derive_pass_keys(key, recipe: GemmRecipe, gemms, memo: dict, skip=()):
  """Derives, into `memo`, the SR streams of the stochastic operands of the passes `gemms` of one
  GEMM call as one kernel (`operand.operand_streams`), where each key was a kernel of its own: the
  same bits (`operand_key` reads them from `memo`). `skip`: (gemm, side) places not quantized
  here (the backward's operands kept as quantized residuals)."""
  if key is None:
    return
  places = [(gemm, side) for gemm in gemms for side in (LHS, RHS)
            if _streams_its_bits(getattr(recipe, gemm).operands()[side])
            and (gemm, side) not in skip and ("stream", gemm, side) not in memo]
  if len(places) > 1:
    for place, stream in zip(places, opq.operand_streams(key, places)):
      memo[("stream",) + place] = stream


def through_trust_mask(g, x, side: int, key, recipe: GemmRecipe, memo: dict | None = None):
  """QuEST's backward: gradient g of the rotated, quantized operand -> gradient of `x`.

  g is dX (M, Kp) for side LHS or dW (Kp, N) for RHS, in the forward's rotated domain (the
  backward GEMMs multiplied the forward's Q(X) / Q(W)); it is zeroed where the forward clipped
  (the trust mask, recomputed from x), rotated back along K and cropped to x's K.
  """
  signs, block = gemm_signs(key, recipe, "fwd", memo)
  op = recipe.fwd.operands()[side]
  xk, _ = to_last(x, -1 if side == LHS else -2, True)  # X (M, K) / W^T (N, K)
  if memo is not None:  # the forward's Q(x) of this backward computed it already: its mask
    mask = _quest_once(x, xk, side, op, signs, block, memo)[1]
  else:
    mask = quest(opq.rotate(xk, block, -1, signs), op.format.block_size)[1]
  k_axis = -1 if side == LHS else -2
  if side == RHS:
    mask = jnp.swapaxes(mask, -1, -2)
  g = hadamard(jnp.where(mask, g, jnp.zeros((), g.dtype)), block, axis=k_axis, signs=signs,
               inverse=True)
  return jax.lax.slice_in_dim(g, 0, x.shape[k_axis], axis=g.ndim + k_axis)


def to_last(x, axis: int, work: bool):
  """Moves the contraction axis last when there is per-block work to do along it.

  The transposed copy is the "column-wise" operand of TransformerEngine, and the layout in which
  stochastic rounding draws its bits. The quantizers and the RHT run as fast along an inner axis
  (in place, lpjax.quant.formats.layout), but the GEMMs do not: XLA:CPU's bf16 dot with both
  contraction axes last measured 1.8 ms for the MLP's wgrad shape against 14 ms contracting the
  leading axes, more than the transposes cost. Untouched operands keep their layout.
  """
  if work and axis % x.ndim != x.ndim - 1:
    return jnp.swapaxes(x, axis, -1), -1
  return x, axis


def _quantized(x, op, axes, weight: bool, recipe: GemmRecipe, *, pack: bool, place=None, **kw):
  """opq.pack (a QArray) or opq.fake (values) of an operand, pinned to its shards.

  Under `weight_sharding` (the trainer's FSDP step), an operand with logical axes `axes` (in x's
  layout) keeps its quantization on its own shards: an activation's rows stay split over the
  batch, and a weight (`weight`) is quantized on its shards and, unless packed as a residual,
  gathered as codes and scales (`lpjax.quant.gemm.weight_gather`); a high-precision weight is
  gathered in the compute dtype. `place`: (gemm, side) of this quantizer, for OPERAND_OBSERVER.
  """
  seen = OPERAND_OBSERVER.get() if place is not None else None

  def plain():
    if seen is not None and op is not None and not op.is_ssp and not op.scheme:
      out, view = opq.fake_seen(x, op, pack=pack, dtype=recipe.compute_dtype, **kw)
      seen(*place, op, view)
      return out
    return (opq.pack(x, op, **kw) if (pack and op is not None) else
            opq.fake(x, op, dtype=recipe.compute_dtype, **kw))
  if (op is not None and op.format is None) or not wg.active(
      axes, x.shape, op.format if op is not None else None, kw.get("block")):
    return plain()
  if weight and not pack:
    if op is None:  # high precision: gather the input (the compute dtype), then the RHT if any
      x = wg.pin(wg.pin(x, axes, gathered=False), axes, gathered=True)
      return opq.fake(x, None, dtype=recipe.compute_dtype, **kw)
    y = wg.fake_gathered(x, op, axes, dtype=recipe.compute_dtype, **kw)
    if y is not None:
      return y
  return wg.pin(plain(), axes, gathered=False)


def _layout_axes(x, gemm: str, side: int, w_axes, moved: bool):
  """(logical axes of operand x in its quantization layout, whether it is the weight).

  The weight (RHS of fwd and dgrad) has the axes its layer gave (`rhs_axes`); a 2-D activation
  (X or dY, rows = tokens) has its rows over "batch"; anything else has none.
  """
  if gemm in ("fwd", "dgrad") and side == RHS:
    return _swapped(w_axes, moved), True
  if x.ndim != 2:
    return None, False
  return ((None, "batch") if moved else ("batch", None)), False


def _swapped(w_axes, moved: bool):
  """W's logical axes after `to_last` (W is 2-D when it has axes): reversed if it was moved."""
  return tuple(reversed(w_axes)) if (moved and w_axes is not None) else w_axes


def fwd_operand(x, side: int, key, recipe: GemmRecipe, *, pack: bool = False, w_axes=None,
                memo: dict | None = None):
  """Operand `side` of the forward GEMM: (values or QArray, contraction axis). `memo`: see
  `gemm_signs`."""
  op = recipe.fwd.operands()[side]
  signs, block = gemm_signs(key, recipe, "fwd", memo)
  given = x
  x, axis = to_last(x, -1 if side == LHS else -2, op is not None or bool(block))
  kw = dict(axis=axis, key=operand_key(key, op, "fwd", side, memo), signs=signs, block=block)
  axes, weight = _layout_axes(x, "fwd", side, w_axes, side == RHS and axis == -1)
  if (memo is not None and not pack and recipe.trust_masked and op.sr_prescale is None
      and not wg.active(axes, x.shape, op.format, block)):  # QuEST: values and mask at once
    values, _ = _quest_once(given, x, side, op, signs, block, memo)
    return values.astype(recipe.compute_dtype or x.dtype), axis
  return _quantized(x, op, axes, weight, recipe, pack=pack, place=("fwd", side), **kw), axis


def _quest_once(given, xk, side: int, op, signs, block, memo: dict):
  """QuEST's (values, trust mask) of forward operand `side` (`given`; `xk`: its K axis last,
  `to_last`), computed once per GEMM call and `memo`: Quartet's backward takes the forward's Q(X)
  and Q(W) (from_fwd) and their trust masks from one RHT and one QuEST of each, bit for bit
  `opq.fake`'s values and `through_trust_mask`'s mask (which computed both again)."""
  entry = memo.get(("quest", side))
  if entry is None or entry[0] is not given:
    xs = opq.rotate(xk, block, -1, signs) if block else xk
    entry = memo[("quest", side)] = (given, quest_with_mask(xs, op.format.block_size))
  return entry[1]


def pass_operand(x, gemm: str, side: int, axis: int, key, recipe: GemmRecipe, *,
                 pack: bool = False, w_axes=None, memo: dict | None = None):
  """Operand `side` of `gemm` from high precision: (values, or a QArray if `pack`; its axis).
  `memo`: see `gemm_signs`."""
  op = getattr(recipe, gemm).operands()[side]
  if op == REUSE_FWD:
    x, axis = reuse(x, side, axis, key, recipe, pack=pack, w_axes=w_axes, memo=memo)
    if pack:
      return x, axis
    op, w_axes = None, None  # the forward's values, gathered already
  elif isinstance(op, OperandQuant) and op.from_fwd:  # re-quantize the forward's Q(X) / Q(W)
    x, axis = reuse(x, side, axis, key, recipe, w_axes=w_axes, memo=memo)
    w_axes = None  # gathered already
  elif op is None and recipe.trust_masked and (gemm, side) in (("dgrad", RHS), ("wgrad", LHS)):
    x, axis = reuse(x, side, axis, key, recipe, w_axes=w_axes, memo=memo)  # QuEST: rotated
    w_axes = None
  signs, block = gemm_signs(key, recipe, gemm, memo)
  before = axis % x.ndim
  x, axis = to_last(x, axis, op is not None or bool(block))
  kw = dict(axis=axis, key=operand_key(key, op, gemm, side, memo), signs=signs, block=block)
  axes, weight = _layout_axes(x, gemm, side, w_axes, axis % x.ndim != before)
  return _quantized(x, op, axes, weight, recipe, pack=pack, place=(gemm, side), **kw), axis


def reuse(x, side: int, axis: int, key, recipe: GemmRecipe, *, pack: bool = False, w_axes=None,
          memo: dict | None = None):
  """REUSE_FWD: the forward's fake-quantized X (LHS) or W (RHS), and where `axis` went."""
  y, fwd_axis = fwd_operand(x, side, key, recipe, pack=pack, w_axes=w_axes, memo=memo)
  moved = fwd_axis != (-1 if side == LHS else -2)  # the forward swapped the last two axes
  if moved:
    axis = {-1: -2, -2: -1}[axis]
  return y, axis


def unpacked(res, axis: int, gemm: str, side: int, key, recipe: GemmRecipe, w_axes=None,
             pack: bool = False, memo: dict | None = None):
  """The backward operand from a residual kept by `residual` (QArray or high precision).

  A packed weight residual (kept on its shards) is gathered as codes before it is unpacked
  (`pack`: not unpacked, for the FP4 GEMM kernel, `kernel_dispatch`).
  """
  op = getattr(recipe, gemm).operands()[side]
  if op == REUSE_FWD:
    fwd_op = recipe.fwd.operands()[side]
    if fwd_op is None:  # kept in high precision
      return pass_operand(res, gemm, side, axis, key, recipe, w_axes=w_axes, memo=memo)
    res = wg.pin_qarray(res, _swapped(w_axes, True), gathered=True)  # packed as W^T (N, K)
    x = opq.unpack(res, fwd_op, recipe.compute_dtype or res.dtype)
    signs, block = gemm_signs(key, recipe, gemm, memo)
    x, axis = to_last(x, axis, bool(block))
    return opq.fake(x, None, axis=axis, key=None, signs=signs, block=block,
                    dtype=recipe.compute_dtype), axis
  if op is None:
    return pass_operand(res, gemm, side, axis, key, recipe, w_axes=w_axes, memo=memo)
  res = wg.pin_qarray(res, w_axes, gathered=True) if w_axes is not None else res
  return (res if pack else opq.unpack(res, op, recipe.compute_dtype or res.dtype)), axis


# The backward operands that residuals="quantized" packs in the forward pass:
# (gemm, side, contraction axis in the canonical operand).
W_FOR_DGRAD = ("dgrad", RHS, -1)  # W (K, N) blocked along N
X_FOR_WGRAD = ("wgrad", LHS, -2)  # X (M, K) blocked along M


def residual(x, which, key, recipe: GemmRecipe, w_axes=None, memo: dict | None = None):
  """residuals="quantized": (packed operand or x itself if high precision, its axis)."""
  gemm, side, axis = which
  op = getattr(recipe, gemm).operands()[side]
  if op is None or (op == REUSE_FWD and recipe.fwd.operands()[side] is None):
    return x, axis
  return pass_operand(x, gemm, side, axis, key, recipe, pack=True, w_axes=w_axes, memo=memo)


def residual_axes(recipe: GemmRecipe):
  """The contraction axes of the kept residuals (static, so recomputed from the recipe)."""
  out = []
  for gemm, side, axis in (X_FOR_WGRAD, W_FOR_DGRAD):
    op = getattr(recipe, gemm).operands()[side]
    if op == REUSE_FWD:
      if recipe.fwd.operands()[side] is not None and side == RHS:
        axis = -3 - axis  # the forward moved W's K axis last: swap -1 and -2
    elif op is not None:
      axis = -1  # packed along the last axis (`to_last`)
    out.append(axis)
  return tuple(out)
