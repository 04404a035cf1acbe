"""Test data with the numerics contract's hard cases, and bit-for-bit comparison of results.

Bit comparisons treat NaN as one category (any NaN matches any NaN; payload and sign bits are not
compared), as docs/numerics.md states; everything else is compared bit for bit.

The data follow tests/quant's oracle data (heavy-tailed rows over a wide exponent range, exact
ties, signed zeros) plus NaN, Inf and subnormal inputs; everything is a pure function of a seed.
"""

from __future__ import annotations

import numpy as np


def edge_data(shape, seed: int, *, exp_range: int = 24, specials: bool = True) -> np.ndarray:
  """float32 data with per-row scales 2^[-exp_range, exp_range], ties, +-0, NaN, Inf, subnormals.

  Examples:
    >>> x = edge_data((16, 128), 0)
    >>> x.dtype, bool(np.isnan(x).any()), bool(np.isinf(x).any())
    (dtype('float32'), True, True)
  """
  rng = np.random.default_rng(seed)
  x = rng.standard_t(3, size=shape)
  x = x * 2.0 ** rng.integers(-exp_range, exp_range + 1, size=shape[:-1] + (1,))
  if specials:
    sel = rng.random(shape)
    ties = (rng.integers(-16, 16, size=shape) + 0.5) * 2.0 ** rng.integers(-4, 2, size=shape)
    x = np.where(sel < 0.15, ties, x)  # exact midpoints of many element grids
    x = np.where((sel >= 0.15) & (sel < 0.17), 0.0, x)
    x = np.where((sel >= 0.17) & (sel < 0.19), -0.0, x)
    x = np.where((sel >= 0.19) & (sel < 0.195), 3e-41, x)  # fp32 subnormals
    flat = x.reshape(-1)
    flat[7], flat[-5] = np.nan, -np.inf  # one NaN block and one Inf block
  return x.astype(np.float32)


def extreme_data(shape, seed: int) -> np.ndarray:
  """Rows from 2^-140 (subnormal blocks) to 2^124, and values near FLT_MAX in the first row."""
  rng = np.random.default_rng(seed)
  x = rng.standard_t(3, size=shape)
  x = x * np.exp2(np.round(np.linspace(-140, 124, shape[0])))[:, None]
  x[0, :8] = [3.0e38, -3.4e38, 1e38, 2.0 ** 127, -1.0, 0.5, 7.0, 2.0 ** -149]
  fmax = np.finfo(np.float32).max
  return np.clip(x, -fmax, fmax).astype(np.float32)


def bits(a) -> np.ndarray:
  """The raw bits of an array (so NaN == NaN and -0 != +0), as unsigned integers."""
  a = np.asarray(a)
  width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
  return a.view(width) if a.dtype.kind != "b" else a.astype(np.uint8)


def _is_float(dtype) -> bool:
  """numpy floats and ml_dtypes' (bfloat16, float8_*, float4_*, ...)."""
  return dtype.kind == "f" or dtype.name.startswith(("float", "bfloat"))


def differing(u, v) -> np.ndarray:
  """Where two arrays of one shape and dtype differ: bit for bit (so -0 != +0), except that NaN
  is one category (docs/numerics.md, "NaN payloads"): a NaN matches any NaN, whatever its sign
  and payload bits (a GPU may canonicalise payloads in a bf16 / fp16 conversion), and a NaN
  never matches a number.

  Examples:
    >>> nan_a, nan_b = np.float32([np.nan]), np.uint32([0xFFC00001]).view(np.float32)
    >>> bool(differing(nan_a, nan_b).any()), bool(differing(nan_a, np.float32([1.0])).any())
    (False, True)
  """
  diff = bits(u) != bits(v)
  if _is_float(np.asarray(u).dtype):
    nan_u, nan_v = np.isnan(np.asarray(u, np.float32)), np.isnan(np.asarray(v, np.float32))
    diff = np.where(nan_u & nan_v, False, diff | (nan_u != nan_v))
  return diff


def same_bits(a, b) -> tuple[bool, str]:
  """(True, '') when two pytrees of arrays agree bit for bit (NaN as one category: `differing`),
  else (False, what differs).

  Examples:
    >>> same_bits({"c": np.float32([1, -0.0])}, {"c": np.float32([1, 0.0])})
    (False, 'leaf 0: 1 of 2 elements differ (first at index 1)')
    >>> same_bits([np.float32([np.nan])], [np.uint32([0x7FC00001]).view(np.float32)])
    (True, '')
    >>> same_bits([np.float32([np.nan, 2])], [np.float32([1, 2])])
    (False, 'leaf 0: 1 of 2 elements differ (first at index 0); NaN in one only: 1')
  """
  import jax
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  if len(la) != len(lb):
    return False, f"{len(la)} vs {len(lb)} outputs"
  for i, (u, v) in enumerate(zip(la, lb)):
    u, v = np.asarray(u), np.asarray(v)
    if u.shape != v.shape or u.dtype != v.dtype:
      return False, f"leaf {i}: {u.dtype}{list(u.shape)} vs {v.dtype}{list(v.shape)}"
    diff = differing(u, v)
    if diff.any():
      first = np.unravel_index(int(np.argmax(diff)), diff.shape)
      where = first[0] if len(first) == 1 else tuple(int(i) for i in first)
      why = f"leaf {i}: {int(diff.sum())} of {diff.size} elements differ (first at index {where})"
      if _is_float(u.dtype):
        nan_only = int((np.isnan(u.astype(np.float32)) != np.isnan(v.astype(np.float32))).sum())
        why += f"; NaN in one only: {nan_only}" if nan_only else ""
      return False, why
  return True, ""
