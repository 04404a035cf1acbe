"""The numerics statistics of one quantized operand, from what its quantizer saw and gave.

`operand_numerics(xs, x_hat, q, op)` takes the output of `lpjax.quant.gemm.operand.quantize_view`
(the quantizer's float32 input after the RHT and pre-scale, its dequantized output, and its codes
and scales unpacked: `lpjax.quant.codec.unpacked.Unpacked`)
and returns float32 scalars, one per name of `STATS` (docs/numerics_monitor.md):

- snr_db: 10 log10(sum xs^2 / sum (xs - x_hat)^2); inf when exact;
- rel_err: ||xs - x_hat|| / ||xs|| (0 for an all-zero input);
- saturated: fraction of elements clipped at the element format's largest magnitude;
- flushed: fraction of the non-zero elements that became zero;
- scale_min / scale_max / scale_std: floor(log2) of the blocks' decoded scales (the e8m0 exponent
  of MX formats; of NVFP4's s_b * amax_t / 2688), over the blocks that are not all zero and whose
  scale did not underflow to zero;
- clamped_scales: fraction of the blocks that are not all zero whose scale the scale format could
  not represent and clamped (e8m0: the exponent out of [-127, 127]; ue4m3: s_b underflowed to 0
  or would exceed 448; fp32: 1 / scale beyond FLT_MAX).

Quantizers that keep no codes and scales (SSP, QuEST, four-over-six, MS-EDEN) report NaN for the
scale statistics, `clamped_scales` and `saturated`.

The statistics are computed from additive sums (`operand_sums`: powers, counts and a histogram of
the block-scale exponents), so that the calls of one site (a loop's iterations, a grouped conv's
groups) pool into the statistics of all their elements together (`finish`): the SNR of the
concatenated tensors, the fraction over all elements, the min / max / std over all blocks.

Examples:
  >>> import jax.numpy as jnp
  >>> from lpjax.quant.gemm.operand import quantize_view
  >>> from lpjax.quant.recipes.gemm_recipe import OperandQuant
  >>> op = OperandQuant("mxfp4")
  >>> x = jnp.array([[0.3, 1.0, -2.9, 6.5] * 8])
  >>> s = operand_numerics(*quantize_view(x, op, axis=-1, key=None), op)
  >>> float(s["scale_min"]), float(s["saturated"]), round(float(s["snr_db"]), 1)
  (0.0, 0.25, 22.4)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.quant.codec import scales_exact as sc
from lpjax.quant.codec import scales_fast as fast_scales
from lpjax.quant.formats import specs as formats
from lpjax.quant.gemm.operand import saturated_mask
from lpjax.quant.numerics import fp32_bits as fb

STATS = ("snr_db", "rel_err", "saturated", "flushed", "scale_min", "scale_max", "scale_std",
         "clamped_scales")
# The additive sums of one operand (`operand_sums`), scalars, then the exponent histogram.
SUMS = ("power", "err", "nonfinite", "saturated", "elements", "flushed", "nonzero", "clamped",
        "live")
EXP_LO, EXP_BINS = -160, 320  # histogram bins of floor(log2(scale)): -160 ... 159 (clipped)
_LO_BITS = 4  # a bin is hi * 16 + lo (lo: its low 4 bits) in `_histogram` (20 x 16 = EXP_BINS)
assert EXP_BINS % (1 << _LO_BITS) == 0
_RUN = 128  # elements summed in order by `_element_sums` before the runs' partial sums are added
_NAN = np.float32(np.nan)


def operand_numerics(xs, x_hat, q, op) -> dict:
  """{name in STATS: float32 scalar} for one quantizer's input `xs` and output `x_hat`."""
  return finish(operand_sums(xs, x_hat, q, op))


def operand_sums(xs, x_hat, q, op) -> dict:
  """{name in SUMS: float32 scalar, "exponents": float32[EXP_BINS]}: sums over the elements (and
  blocks) of one quantization; the sums of several quantizations are their pooled sums.

  The element sums read the quantization's values and codes (`Unpacked`), computed once for all
  their readers; the block sums read its scales and block amaxes (`_scale_sums`)."""
  xs, x_hat = xs.astype(jnp.float32), x_hat.astype(jnp.float32)
  nonzero = _nonzero(xs)
  saturated = None if q is None else saturated_mask(xs, x_hat, q)
  terms = dict(power=jnp.square(xs), err=jnp.square(xs - x_hat), nonfinite=~jnp.isfinite(xs),
               flushed=nonzero & ~_nonzero(x_hat), nonzero=nonzero, saturated=saturated)
  out = _element_sums({k: v for k, v in terms.items() if v is not None})
  out["elements"] = jnp.float32(xs.size)
  if q is None:
    out.update(saturated=_NAN, clamped=_NAN, live=_NAN,
               exponents=jnp.full((EXP_BINS,), _NAN))
  else:
    out.update(_scale_sums(q, op))
  return {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}


def _element_sums(terms: dict) -> dict:
  """{name: float32 sum of every element of terms[name]} (masks count 1), in one pass over the
  elements: one variadic reduction of every term over runs of _RUN elements (nothing
  materialized), then a sum of the runs' partial sums. XLA:CPU hands a plain float32 sum to
  YNNPACK unfused, which materialized every term at the operand's size first (4 B per element per
  term). The counts are exact below 2**24 elements."""
  keys = list(terms)
  size = terms[keys[0]].size
  run = _RUN if size % _RUN == 0 else max(terms[keys[0]].shape[-1:] + (1,))
  vals = [terms[k].astype(jnp.float32).reshape(-1, run) for k in keys]
  zero = [jnp.float32(0)] * len(vals)
  runs = jax.lax.reduce(vals, zero, lambda a, b: [p + q for p, q in zip(a, b)], (1,))
  return {k: jnp.sum(r) for k, r in zip(keys, runs)}


def finish(s: dict) -> dict:
  """{name in STATS: float32 array} of sums (`operand_sums`, or sums of them: arrays of any
  leading shape, "exponents" with a last axis of EXP_BINS)."""
  safe = lambda v: jnp.where(v > 0, v, 1.0)
  power, err = s["power"], s["err"]
  hist = s["exponents"]
  e = jnp.arange(EXP_BINS, dtype=jnp.float32) + EXP_LO
  n = _tree_sum(hist)
  none = ~(n > 0)  # no block with a scale (or no scales kept: NaN)
  mean = _tree_sum(hist * e) / safe(n)
  var = _tree_sum(hist * jnp.square(e - mean[..., None])) / safe(n)
  present = hist > 0
  out = dict(
      snr_db=jnp.where(err > 0, 10.0 * jnp.log10(power / safe(err)), jnp.inf),
      rel_err=jnp.where(power > 0, jnp.sqrt(err) / jnp.sqrt(safe(power)), 0.0),
      saturated=s["saturated"] / jnp.maximum(s["elements"], 1),
      flushed=s["flushed"] / jnp.maximum(s["nonzero"], 1),
      scale_min=jnp.where(none, _NAN, jnp.min(jnp.where(present, e, jnp.inf), -1)),
      scale_max=jnp.where(none, _NAN, jnp.max(jnp.where(present, e, -jnp.inf), -1)),
      scale_std=jnp.where(none, _NAN, jnp.sqrt(var)),
      clamped_scales=s["clamped"] / jnp.maximum(s["live"], 1),
  )
  return {k: jnp.asarray(out[k], jnp.float32) for k in STATS}


def _tree_sum(x):
  """The sum over the last axis in a fixed pairwise order (zero-padded to a power of two, then
  halved by elementwise adds): the same float32 value however many rows, operands and sites are
  finished together (XLA's own reduce may order its adds by the shape)."""
  n = x.shape[-1]
  width = 1 << max(n - 1, 0).bit_length()
  x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - n)])
  while width > 1:
    width //= 2
    x = x[..., :width] + x[..., width:]
  return x[..., 0]


def _nonzero(x):
  """x != 0 on the bits: XLA:CPU compares subnormals as zero."""
  return (fb.to_bits(x) & jnp.uint32(fb.ABS_MASK)) != 0


def _scale_sums(q, op) -> dict:
  """The histogram of the block-scale exponents, and the clamped and live (not all zero) block
  counts, from the quantization's own scales and block amaxes (one value per block, not per
  element)."""
  fmt = q.fmt
  amax_bits, scales = q.amax_bits, q.scales
  amax = fb.from_bits(amax_bits)
  live = (amax_bits != 0) & (amax_bits < jnp.uint32(fb.INF_BITS))
  clamped = jnp.zeros(amax.shape, bool)
  if fmt.scale == "e8m0":
    exp = scales.astype(jnp.int32) - 127
    if fmt.fixed_scale_exponent is None:
      mode = formats.check_scale_mode(fmt, op.scale_mode)
      if mode == "rceil":  # bounds instead of its exact product: the same answer
        clamped = fast_scales.rceil_clamped(amax_bits, fmt.element)
      else:
        k = sc.e8m0_exponent(amax_bits, fmt.element, mode, clamp=False)
        clamped = (k < -127) | (k > 127)
  elif fmt.scale == "ue4m3":
    amax_t_bits = (jnp.uint32(0) if q.tensor_scale is None
                   else fb.to_bits(q.tensor_scale) & jnp.uint32(fb.ABS_MASK))
    # the fast path's decode multiplier and S_enc: the bits of scales_exact's, at a table look-up
    mult = fast_scales.decode_multiplier(scales.astype(jnp.uint32), amax_t_bits, fmt.tensor_scale)
    exp = fb.exponent(mult & jnp.uint32(fb.ABS_MASK))
    s_enc = fb.from_bits(fast_scales.encode_scale(amax_t_bits, fmt.tensor_scale))
    ideal = amax * s_enc / np.float32(6.0)  # the block scale before its e4m3 rounding
    clamped = (scales == 0) | (ideal > np.float32(448.0))
  else:  # fp32 scales: the decode multiplier itself
    mult_bits = fb.to_bits(scales.astype(jnp.float32)) & jnp.uint32(fb.ABS_MASK)
    exp = fb.exponent(mult_bits)
    if fmt.element.kind != "uint":
      enc = sc.fp32_encode_scale(amax_bits, fmt.element.max_value)
      clamped = enc >= jnp.uint32(sc.FLT_MAX_BITS)
  clamped = jnp.broadcast_to(live & clamped, exp.shape)
  n_live = jnp.broadcast_to(live, exp.shape)
  live = n_live & (scales != 0 if fmt.scale != "e8m0" else True)
  bins = jnp.clip(exp.astype(jnp.int32) - EXP_LO, 0, EXP_BINS - 1)
  exponents, clamped_count, live_count = _histogram(bins, live, clamped, n_live)
  return dict(exponents=exponents, clamped=clamped_count, live=live_count)


def _histogram(bins, live, *flags):
  """float32[EXP_BINS]: how many live blocks fall in each bin (`bins`: int32 in [0, EXP_BINS)),
  then how many blocks have each of `flags` (bool, in `bins`' shape), as float32 scalars.

  Each bin is split in two digits, hi * 16 + lo, and the counts are the product of the blocks'
  one-hot rows of the two digits ([hi, blocks] @ [blocks, lo]); the flags' counts are one more
  row (all ones) times one more column per flag. Exact (0/1 products, sums below 2**24 blocks),
  and a [blocks, 39] read instead of [blocks, 322]: one-hot rows of every bin summed over the
  blocks are materialized whole on XLA:CPU (its reductions go to YNNPACK unfused: 1.3 KB per
  block, the monitor's peak memory), and a scatter-add is a loop there.
  """
  col = lambda m: m.reshape(-1, 1)
  bins = col(bins.astype(jnp.uint32))
  hi = (bins >> _LO_BITS) == jnp.arange(EXP_BINS >> _LO_BITS, dtype=jnp.uint32)
  lo = ((bins & ((1 << _LO_BITS) - 1)) == jnp.arange(1 << _LO_BITS, dtype=jnp.uint32)) & col(live)
  rows = jnp.concatenate([hi, jnp.ones_like(hi[:, :1])], axis=1).astype(jnp.float32)
  cols = jnp.concatenate([lo, *map(col, flags)], axis=1).astype(jnp.float32)
  joint = jnp.einsum("nh,nl->hl", rows, cols, precision=jax.lax.Precision.HIGHEST)
  n_lo = 1 << _LO_BITS
  return (joint[:-1, :n_lo].reshape(-1), *joint[-1, n_lo:])
