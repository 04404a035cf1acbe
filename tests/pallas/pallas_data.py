"""Shared test data and bit comparisons for the Pallas kernel tests."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax import quant

ON_GPU = jax.default_backend() == "gpu"
MX = ["mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2"]
FORMATS = MX + ["nvfp4"]
ROUNDINGS = list(quant.ROUNDING_MODES)


def needs_gpu_unless(interpret: bool):
  if not interpret and not ON_GPU:
    pytest.skip("compiled (Triton) kernels need a GPU; the interpret-mode class covers CPU")


def special_data(shape, seed=0, dtype=np.float32):
  """Heavy-tailed rows over 2^-8..2^8 magnitudes, plus rows with the cases of docs/numerics.md §4-5.

  The last rows of the last two axes (when there are at least 8 rows) hold: a NaN, +-Inf, an
  all-zero block with -0, fp32 subnormals, ties (n + 1/2) 2^j, and a block ~2^-40 below the rest
  (NVFP4's s_b -> 0 path).
  """
  rng = np.random.default_rng(seed)
  x = rng.standard_t(3, size=shape) * 2.0 ** rng.integers(-8, 9, size=shape[:-1] + (1,))
  x = x.astype(np.float32)
  x2 = x.reshape(-1, shape[-1])
  n = x2.shape[1]
  if x2.shape[0] >= 8:
    x2[-1, min(3, n - 1)] = np.nan
    x2[-2, n // 2] = np.inf
    x2[-2, 0] = -np.inf
    x2[-3, :] = np.where(rng.random(n) < 0.5, 0.0, -0.0)
    x2[-4, :] = (rng.standard_normal(n) * 1e-39).astype(np.float32)  # fp32 subnormals
    x2[-5, :] = (rng.integers(-12, 12, size=n) + 0.5) * 2.0 ** rng.integers(-3, 2, size=n)
    x2[-6, :] = x2[-6, :] * np.float32(2.0**-40)
  return x2.reshape(shape).astype(dtype)


def bits(a):
  a = np.asarray(a)
  return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def assert_same_bits(actual, expected, what):
  actual, expected = np.asarray(actual), np.asarray(expected)
  assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
  assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
  bad = np.argwhere(bits(actual) != bits(expected))
  if bad.size:
    first = tuple(int(i) for i in bad[0])
    raise AssertionError(f"{what}: {len(bad)} of {actual.size} differ; first at {first}: got "
                         f"{actual[first]!r}, want {expected[first]!r}")


def assert_same_values(actual, expected, what):
  """Bit for bit, except that NaN is one category (docs/numerics.md, "NaN payloads"): a NaN
  matches any NaN, whatever its sign and payload bits."""
  actual, expected = np.asarray(actual), np.asarray(expected)
  nan_a, nan_e = np.isnan(actual), np.isnan(expected)
  if (nan_a != nan_e).any():
    first = tuple(int(i) for i in np.argwhere(nan_a != nan_e)[0])
    raise AssertionError(f"{what}: NaN in one and not the other at {int((nan_a != nan_e).sum())} "
                         f"places; first at {first}: got {actual[first]!r}, want "
                         f"{expected[first]!r}")
  assert_same_bits(np.where(nan_a, 0, actual).astype(actual.dtype),
                   np.where(nan_e, 0, expected).astype(expected.dtype), what)


def assert_same_qarray(q, ref, what):
  assert (q.shape, q.axis, q.fmt, q.dtype) == (ref.shape, ref.axis, ref.fmt, ref.dtype), what
  assert_same_bits(q.codes, ref.codes, f"{what} codes")
  assert_same_bits(q.scales, ref.scales, f"{what} scales")
  assert (q.tensor_scale is None) == (ref.tensor_scale is None), what
  if ref.tensor_scale is not None:
    assert_same_bits(q.tensor_scale, ref.tensor_scale, f"{what} tensor_scale")
  assert q.zeros is None and ref.zeros is None


def key_kw(rounding, seed=0):
  return {"rounding": rounding, "key": jax.random.key(seed) if rounding == "stochastic" else None}


def as_jnp(x):
  return jnp.asarray(x)
