"""The sink row of a measured GEMM site: additive sums per call, and the statistics made of them.

Each call of a measured GEMM adds one row of sums (`pack`) to its site's sink cotangent: per
quantized operand the sums of `operand_numerics.operand_sums`, per pass the power of the
high-precision product and of the quantized product's error, the two squared norms of the
gradient-noise ratio, the number of calls and of non-finite elements. Sums add: a loop's
iterations (a scan that is not over blocks sums its constants' cotangents), a conv's feature
groups and the vmapped examples of one site pool into one row, whose statistics (`finish`) are
those of all their elements together. A site that never ran (the untaken branch of a `cond`)
keeps a zero row: `calls` 0, every statistic NaN. A site that saw a NaN or an infinity in an
operand or a product has `nonfinite` > 0 and every statistic NaN.

Examples:
  >>> len(SINK_FIELDS), SINK_FIELDS[:2], SINK_FIELDS[-4:]
  (54, ('fwd.x.snr_db', 'fwd.x.rel_err'), ('wgrad.out_snr_db', 'grad_noise_ratio', 'calls', 'nonfinite'))
  >>> import jax.numpy as jnp
  >>> zero = finish(jnp.zeros((1, SIZE)))[0]   # a site that never ran
  >>> int(zero[FIELD_INDEX["calls"]]), bool(jnp.isnan(zero[FIELD_INDEX["fwd.x.snr_db"]]))
  (0, True)
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from lpjax.quant.gemm import dot_general as dg
from lpjax.quant.monitor.operand_numerics import EXP_BINS, STATS, SUMS, finish as finish_operand

PASSES = ("fwd", "dgrad", "wgrad")
# The operand rows, in the order of lpjax.quant.gemm.dot_general.QUANTIZER_PLACES.
OPERANDS = tuple((g, name) for g, _, name, _, _ in dg.QUANTIZER_PLACES)
# The statistics of one site and block, as `finish` gives them (the public row layout).
SINK_FIELDS = (tuple(f"{g}.{o}.{s}" for g, o in OPERANDS for s in STATS)
               + tuple(f"{g}.out_snr_db" for g in PASSES)
               + ("grad_noise_ratio", "calls", "nonfinite"))
FIELD_INDEX = {f: i for i, f in enumerate(SINK_FIELDS)}

# The sums of one call: per operand SUMS then its exponent histogram; per pass the product's
# power and error; the gradient's power and noise; calls; non-finite elements.
_OPERAND = len(SUMS) + EXP_BINS
_TAIL = len(OPERANDS) * _OPERAND
_PRODUCT = {g: _TAIL + 2 * i for i, g in enumerate(PASSES)}
_GRAD, _CALLS, _NONFINITE = _TAIL + 6, _TAIL + 8, _TAIL + 9
SIZE = _TAIL + 10


def pack(operands: dict, products: dict, grad: tuple, nonfinite) -> jnp.ndarray:
  """One call's sums as a float32[SIZE] row. operands: {(gemm, operand): operand_sums(...)} of
  the quantized operands (the others stay NaN); products: {pass: (power, err)}; grad: (power of
  dW_hp, power of dW_q - dW_hp); nonfinite: the number of non-finite elements seen."""
  row = jnp.asarray(np.full(SIZE, np.nan, np.float32))
  for i, name in enumerate(OPERANDS):
    if name in operands:
      s = operands[name]
      vec = jnp.concatenate([jnp.stack([s[k] for k in SUMS]), s["exponents"]])
      row = row.at[i * _OPERAND:(i + 1) * _OPERAND].set(vec)
  for g, (power, err) in products.items():
    row = row.at[_PRODUCT[g]].set(power).at[_PRODUCT[g] + 1].set(err)
  row = row.at[_GRAD].set(grad[0]).at[_GRAD + 1].set(grad[1])
  return row.at[_CALLS].set(1.0).at[_NONFINITE].set(jnp.asarray(nonfinite, jnp.float32))


def _ratio_db(power, err):
  safe = jnp.where(err > 0, err, 1.0)
  return jnp.where(err > 0, 10.0 * jnp.log10(power / safe), jnp.inf)


def finish(acc) -> jnp.ndarray:
  """float32[..., len(SINK_FIELDS)] statistics of float32[..., SIZE] sums (of any number of
  calls): NaN where not measured, where the site never ran (calls 0) or saw non-finite values.

  One computation over every operand, pass and row at once (the operands' sums side by side on
  an axis of their own), not one per field: the same elementwise arithmetic and reductions, so
  the same values, in a fixed handful of HLO ops whatever the number of sites (`finish_all`)."""
  lead = acc.shape[:-1]
  per_operand = acc[..., :_TAIL].reshape(lead + (len(OPERANDS), _OPERAND))
  sums = {k: per_operand[..., j] for j, k in enumerate(SUMS)}
  sums["exponents"] = per_operand[..., len(SUMS):]
  stats = finish_operand(sums)  # {stat: [..., operand]}
  operands = jnp.stack([stats[s] for s in STATS], axis=-1).reshape(lead + (-1,))
  products = acc[..., _TAIL:_TAIL + 2 * len(PASSES)].reshape(lead + (len(PASSES), 2))
  out_snr = _ratio_db(products[..., 0], products[..., 1])
  signal, noise = acc[..., _GRAD], acc[..., _GRAD + 1]
  safe = jnp.where(noise > 0, noise, 1.0)
  ratio = jnp.where(noise > 0, jnp.sqrt(signal / safe), jnp.inf)
  calls, nonfinite = acc[..., _CALLS], acc[..., _NONFINITE]
  meaningful = (calls > 0) & (nonfinite == 0)
  values = jnp.concatenate([operands, out_snr, ratio[..., None]], axis=-1)
  values = jnp.where(meaningful[..., None], values, jnp.nan)
  return jnp.concatenate([values, calls[..., None], nonfinite[..., None]],
                         axis=-1).astype(jnp.float32)


def finish_all(sums: dict) -> dict:
  """{key: `finish`(sums[key])} of several sites' sums (float32[rows, SIZE] each), finished as
  one array (their rows stacked): one computation for every site of a measured step."""
  if not sums:
    return {}
  keys = list(sums)
  rows = [sums[k].shape[0] for k in keys]
  done = finish(jnp.concatenate([sums[k] for k in keys], axis=0))
  starts = np.cumsum([0] + rows)
  return {k: done[a:b] for k, a, b in zip(keys, starts[:-1], starts[1:])}


def status(values: dict, prefix: str | None = None) -> str:
  """The reading of one row of `finish` ({field: float}): "not_run" (the site never ran: its
  calls are 0), "nonfinite" (it saw a NaN or an infinity), "exact" (operand `prefix`, e.g.
  "fwd.x", quantized without error: its snr_db is inf) or "ok" (a measured error)."""
  if not values["calls"] > 0:
    return "not_run"
  if values["nonfinite"] > 0:
    return "nonfinite"
  if prefix is not None and values[f"{prefix}.snr_db"] == np.inf:
    return "exact"
  return "ok"
