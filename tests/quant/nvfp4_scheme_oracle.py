"""numpy re-derivations of the NVFP4 schemes of lpjax.quant.schemes.nvfp4 (Four over Six, MS-EDEN).

Independent of the code under test where it matters: e2m1 rounding searches the grid (no step
arithmetic), E4M3 conversion and neighbours come from ml_dtypes' value table. The order of the
float32 operations is the contract's (docs/numerics.md §7b), sums over a block as pairwise trees.
The random uniforms are lpjax's counter hash (an input, not under test).
"""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np

from lpjax.quant.schemes import nvfp4 as schemes

F32 = np.float32
GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], F32)


def np_round_e2m1(v, rounding, u=None):
  """Nearest grid point by search; ties by code parity (even) or magnitude (away)."""
  a = np.minimum(np.abs(v), F32(6))
  hi = np.searchsorted(GRID, a, side="left").clip(0, 7)  # first grid point >= a
  lo = np.where(GRID[hi] == a, hi, hi - 1).clip(0, 7)
  glo, ghi = GRID[lo], GRID[hi]
  if rounding == "stochastic":
    frac = np.where(ghi > glo, (a - glo) / np.where(ghi > glo, ghi - glo, 1), 0).astype(F32)
    q = np.where(u < frac, ghi, glo)
  else:
    dlo, dhi = a - glo, ghi - a
    tie_up = (hi % 2 == 0) if rounding == "nearest_even" else np.ones_like(hi, bool)
    q = np.where(dlo < dhi, glo, np.where(dhi < dlo, ghi, np.where(tie_up, ghi, glo)))
  return np.where(v < 0, -q, q).astype(F32)


def np_e4m3(v):
  return np.asarray(v, F32).astype(ml_dtypes.float8_e4m3fn).astype(F32)


def np_tree_sum(x):
  while x.shape[-1] > 1:
    x = (x[..., 0::2] + x[..., 1::2]).astype(F32)
  return x[..., 0]


def np_four_over_six(b, rounding, us=(None, None)):
  """b: (..., 16) blocks, float32."""
  amax = F32(np.max(np.abs(b)))
  if amax == 0:
    return b
  dec, enc = F32(amax * F32(1 / 1536)), F32(F32(1536) / amax)
  bamax = np.max(np.abs(b), axis=-1, keepdims=True)
  outs = []
  for target, u in zip((6, 4), us):
    s = np_e4m3((bamax * F32(1 / target)).astype(F32) * enc)
    step = (s * dec).astype(F32)
    q = np.where(s > 0, np_round_e2m1((b / np.where(s > 0, step, 1)).astype(F32), rounding, u), 0)
    deq = (q * step).astype(F32)
    outs.append((deq, np_tree_sum(np.square(deq - b).astype(F32))[..., None]))
  (d6, e6), (d4, e4) = outs
  return np.where(e4 < e6, d4, d6)


def np_ms_eden(x, group, u):
  g = x.reshape(x.shape[:-1] + (x.shape[-1] // group, group // 16, 16)).astype(F32)
  vmax = F32(6.0 / ((17 / 16) * 0.93))
  amax = F32(np.max(np.abs(g)))
  rv = F32(1 / np.float64(vmax))
  d = F32(1) if amax == 0 else F32(F32(amax * F32(1 / 255.99)) * rv)
  s = np_e4m3((np.max(np.abs(g), -1, keepdims=True) * rv).astype(F32) / d)
  s = np.where(s == 0, F32(1), s)
  xs = (g / (s * d).astype(F32)).astype(F32)
  q = np_round_e2m1(xs, "nearest_away")
  flat = lambda v: v.reshape(v.shape[:-2] + (group,))
  num, den = np_tree_sum(flat(xs * xs)), np_tree_sum(flat(xs * q))
  corr = np.where(den == 0, F32(1), num / np.where(den == 0, 1, den)).astype(F32)
  cs = (s * corr[..., None, None]).astype(F32)
  # neighbours on the E4M3 grid by search over all finite positive values
  vals = np.sort(np.arange(0x7F, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(F32))
  i = np.searchsorted(vals, cs, side="right")  # first value > cs
  up = vals[np.minimum(i, len(vals) - 1)]
  down = vals[np.maximum(i - 1, 0)]
  p = ((cs - down) / (up - down)).astype(F32)
  scale = np.where(u[..., None] < p, up, down)
  return ((q * scale).astype(F32) * d).astype(F32).reshape(x.shape)


def uniforms(key, shape):
  return np.asarray(schemes._uniform(key, shape))


def four_over_six(x, *, tile, rounding, key=None):
  """Four over Six of an array along its last axis (16x16 tiles over the last two if tile)."""
  x = np.asarray(x, F32)
  if tile:
    r, c = x.shape[-2:]
    pr, pc = (-r) % 16, (-c) % 16
    xp = np.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, pr), (0, pc)])
    R, C = xp.shape[-2:]
    b = xp.reshape(xp.shape[:-2] + (R // 16, 16, C // 16, 16))
    b = np.moveaxis(b, -3, -2).reshape(xp.shape[:-2] + (R // 16, C // 16, 256))
  else:
    pad = (-x.shape[-1]) % 16
    xp = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])
    b = xp.reshape(xp.shape[:-1] + (-1, 16))
  us = (None, None)
  if rounding == "stochastic":
    us = tuple(uniforms(jax.random.fold_in(key, i), b.shape) for i in (0, 1))
  out = np_four_over_six(b, rounding, us)
  if tile:
    out = np.moveaxis(out.reshape(xp.shape[:-2] + (R // 16, C // 16, 16, 16)), -2, -3)
    return out.reshape(xp.shape)[..., :r, :c]
  return out.reshape(xp.shape)[..., :x.shape[-1]]


def ms_eden(x, *, group, key):
  """MS-EDEN of an array along its last axis (a multiple of group)."""
  x = np.asarray(x, F32)
  u = uniforms(key, x.shape[:-1] + (x.shape[-1] // group, group // 16, 1))[..., 0]
  return np_ms_eden(x, group, u)


def quest(x, group=32):
  """QuEST (Quartet's forward quantizer) of x along its last axis: (values, trust mask)."""
  x = np.asarray(x, F32)
  g = x.reshape(x.shape[:-1] + (-1, group))
  inv = F32(1 / group)
  mean_sq = (np_tree_sum((g * g).astype(F32)) * inv).astype(F32)
  mean = (np_tree_sum(g) * inv).astype(F32)
  var = (mean_sq - (mean * mean).astype(F32)).astype(F32)
  std = np.sqrt(np.maximum(var, F32(0))).astype(F32)
  scale = (F32(2.92247856 / 6.0) * std + F32(1e-8)).astype(F32)
  _, exp = np.frexp(scale)  # scale = m 2^exp, m in [0.5, 1): 2^floor(log2 scale) = 2^(exp - 1)
  e = np.ldexp(F32(1), exp - 1).astype(F32)[..., None]
  t = (g / e).astype(F32)
  a = np.minimum(np.abs(t), F32(6))
  hi = np.searchsorted(GRID, a, side="left").clip(0, 7)
  lo = np.where(GRID[hi] == a, hi, hi - 1).clip(0, 7)
  q = np.where(a - GRID[lo] <= GRID[hi] - a, GRID[lo], GRID[hi])  # ties toward zero
  q = np.where(t < 0, -q, q)
  return (q * e).astype(F32).reshape(x.shape), (np.abs(t) < 6).reshape(x.shape)
