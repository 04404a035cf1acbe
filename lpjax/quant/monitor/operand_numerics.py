"""The numerics statistics of one quantized operand, from what its quantizer saw and gave.

`operand_numerics(xs, x_hat, q, op)` takes the output of `lpjax.quant.gemm.operand.quantize_view`
(the quantizer's float32 input after the RHT and pre-scale, its dequantized output, and the QArray)
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

import jax.numpy as jnp
import numpy as np

from lpjax.quant.codec import scales_exact as sc
from lpjax.quant.formats import specs as formats
from lpjax.quant.gemm.operand import saturated_mask
from lpjax.quant.numerics import fp32_bits as fb

STATS = ("snr_db", "rel_err", "saturated", "flushed", "scale_min", "scale_max", "scale_std",
         "clamped_scales")
_NAN = np.float32(np.nan)


def operand_numerics(xs, x_hat, q, op) -> dict:
  """{name in STATS: float32 scalar} for one quantizer's input `xs` and output `x_hat`."""
  xs, x_hat = xs.astype(jnp.float32), x_hat.astype(jnp.float32)
  err = jnp.sum(jnp.square(xs - x_hat))
  power = jnp.sum(jnp.square(xs))
  safe = lambda v: jnp.where(v > 0, v, 1.0)
  nonzero = _nonzero(xs)
  out = dict(
      snr_db=jnp.where(err > 0, 10.0 * jnp.log10(power / safe(err)), jnp.inf),
      rel_err=jnp.where(power > 0, jnp.sqrt(err) / jnp.sqrt(safe(power)), 0.0),
      flushed=jnp.sum(nonzero & ~_nonzero(x_hat)) / jnp.maximum(jnp.sum(nonzero), 1),
  )
  if q is None:
    out.update(saturated=_NAN, scale_min=_NAN, scale_max=_NAN, scale_std=_NAN,
               clamped_scales=_NAN)
  else:
    out["saturated"] = jnp.mean(saturated_mask(xs, x_hat, q).astype(jnp.float32))
    out.update(_scale_numerics(xs, q, op))
  return {k: jnp.asarray(out[k], jnp.float32) for k in STATS}


def _nonzero(x):
  """x != 0 on the bits: XLA:CPU compares subnormals as zero."""
  return (fb.to_bits(x) & jnp.uint32(fb.ABS_MASK)) != 0


def _scale_numerics(xs, q, op) -> dict:
  """Block-scale exponents and the clamped fraction, over the blocks that are not all zero."""
  fmt, layout = q.fmt, q.layout
  # the block amax on the bits (XLA:CPU's float max flushes subnormals)
  amax_bits = jnp.max(fb.to_bits(layout.group(xs)) & jnp.uint32(fb.ABS_MASK),
                      axis=layout.reduce_axes, keepdims=True)
  amax = fb.from_bits(amax_bits)
  scales = layout.scales_in(q.scales)
  live = (amax_bits != 0) & (amax_bits < jnp.uint32(fb.INF_BITS))
  clamped = jnp.zeros(amax.shape, bool)
  if fmt.scale == "e8m0":
    exp = scales.astype(jnp.int32) - 127
    if fmt.fixed_scale_exponent is None:
      mode = formats.check_scale_mode(fmt, op.scale_mode)
      k = sc.e8m0_exponent(amax_bits, fmt.element, mode, clamp=False)
      clamped = (k < -127) | (k > 127)
  elif fmt.scale == "ue4m3":
    amax_t_bits = (jnp.uint32(0) if q.tensor_scale is None
                   else fb.to_bits(q.tensor_scale) & jnp.uint32(fb.ABS_MASK))
    mult = sc.nvfp4_decode_scale(scales.astype(jnp.uint32), amax_t_bits, fmt.tensor_scale)
    exp = fb.exponent(mult & jnp.uint32(fb.ABS_MASK))
    s_enc = fb.from_bits(sc.nvfp4_encode_scale(amax_t_bits, fmt.tensor_scale))
    ideal = amax * s_enc / np.float32(6.0)  # the block scale before its e4m3 rounding
    clamped = (scales == 0) | (ideal > np.float32(448.0))
  else:  # fp32 scales: the decode multiplier itself
    mult_bits = fb.to_bits(scales.astype(jnp.float32)) & jnp.uint32(fb.ABS_MASK)
    exp = fb.exponent(mult_bits)
    if fmt.element.kind != "uint":
      enc = sc.fp32_encode_scale(amax_bits, fmt.element.max_value)
      clamped = enc >= jnp.uint32(sc.FLT_MAX_BITS)
  clamped = jnp.broadcast_to(live & clamped, exp.shape)
  n_live = jnp.sum(jnp.broadcast_to(live, exp.shape))
  live = jnp.broadcast_to(live, exp.shape) & (scales != 0 if fmt.scale != "e8m0" else True)
  n = jnp.sum(live)
  e = exp.astype(jnp.float32)
  mean = jnp.sum(jnp.where(live, e, 0.0)) / jnp.maximum(n, 1)
  var = jnp.sum(jnp.where(live, jnp.square(e - mean), 0.0)) / jnp.maximum(n, 1)
  none = n == 0
  return dict(
      scale_min=jnp.where(none, _NAN, jnp.min(jnp.where(live, e, jnp.inf))),
      scale_max=jnp.where(none, _NAN, jnp.max(jnp.where(live, e, -jnp.inf))),
      scale_std=jnp.where(none, _NAN, jnp.sqrt(var)),
      clamped_scales=jnp.sum(clamped) / jnp.maximum(n_live, 1),
  )
