"""Bit-exact comparisons and test data of the numpy oracle (pure numpy).

Part of `numpy_oracle` (which re-exports every name here): comparing an implementation's outputs
with an oracle result bit for bit (NaNs equal each other, -0 differs from +0), and the
heavy-tailed inputs with ties, zeros and -0 that the exact tests feed both.
"""

from __future__ import annotations

import numpy as np

__all__ = ["bit_view", "assert_same_bits", "check_quantized", "heavy_tailed"]


def bit_view(a):
  """Unsigned-integer view of an array's bits, with every NaN made the same (positive) NaN."""
  a = np.asarray(a)
  if a.dtype.kind == "f" or a.dtype.name in ("bfloat16",):
    width = a.dtype.itemsize
    u = {2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
    canon = np.full((), np.nan, dtype=a.dtype).view(u)
    return np.where(np.isnan(a.astype(np.float32)), canon, a.view(u))
  return a


def assert_same_bits(actual, expected, what="array"):
  """Bit-exact equality (NaNs equal each other, -0 differs from +0), with a useful message."""
  actual = np.asarray(actual)
  expected = np.asarray(expected)
  assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
  assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
  a, e = bit_view(actual), bit_view(expected)
  bad = np.argwhere(a != e)
  if bad.size:
    idx = [tuple(int(i) for i in b) for b in bad[:6]]
    detail = ", ".join(f"{i}: got {actual[i]!r} want {expected[i]!r}" for i in idx)
    raise AssertionError(f"{what}: {len(bad)} of {a.size} differ; first {detail}")


def check_quantized(ref, codes, scales, values, tensor_scale=None, zeros=None, what=""):
  """Compare an implementation's outputs (plain numpy arrays) with an oracle result dict."""
  assert_same_bits(np.asarray(codes), ref["codes"], f"{what} codes")
  assert_same_bits(np.asarray(scales), ref["scales"], f"{what} scales")
  if ref["tensor_scale"] is not None:
    assert tensor_scale is not None, f"{what}: tensor_scale missing"
    assert_same_bits(np.asarray(tensor_scale, dtype=np.float32).reshape(()),
                     np.asarray(ref["tensor_scale"], dtype=np.float32).reshape(()),
                     f"{what} tensor_scale")
  if ref["zeros"] is not None:
    assert zeros is not None, f"{what}: zeros missing"
    z, rz = np.asarray(zeros), ref["zeros"]
    ok = ~np.isnan(ref["scales"])   # the zero point of a non-finite group is unspecified
    assert_same_bits(z[ok], rz[ok], f"{what} zeros")
  assert_same_bits(np.asarray(values), ref["values"], f"{what} dequantized values")


def heavy_tailed(shape, seed, dtype=np.float32, exp_range=24, with_specials=True):
  """Random test data: Student-t(3) values, per-row power-of-two magnitudes spanning
  2^-exp_range..2^exp_range, some exact grid-like values and ties, zeros and -0."""
  rng = np.random.default_rng(seed)
  x = rng.standard_t(3, size=shape)
  rows = 2.0 ** rng.integers(-exp_range, exp_range + 1, size=shape[:-1] + (1,))
  x = x * rows
  if with_specials:
    sel = rng.random(shape)
    # values (n + 1/2) * 2^j: ties for many element grids at many scales
    ties = (rng.integers(-16, 16, size=shape) + 0.5) * 2.0 ** rng.integers(-4, 2, size=shape) * rows
    x = np.where(sel < 0.15, ties, x)
    x = np.where((sel >= 0.15) & (sel < 0.17), 0.0, x)
    x = np.where((sel >= 0.17) & (sel < 0.19), -0.0, x)
  return x.astype(dtype)
