"""Statistical properties: random bits, stochastic rounding (unbiased, never all-zero), and the
relative-MSE anchors of docs/numerics.md §6 on N(0,1) data."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import numpy_oracle as O  # noqa: E402

from lpjax import quant  # noqa: E402

CANON = (16, 128)


# ----------------------------------------------------------------------------- random bits

def test_random_bits_shape_determinism_and_key_dependence():
  k0, k1 = jax.random.key(0), jax.random.key(1)
  a = np.asarray(quant.random_bits(k0, CANON))
  assert a.dtype == np.uint32 and a.shape == CANON
  np.testing.assert_array_equal(a, np.asarray(quant.random_bits(k0, CANON)))
  b = np.asarray(quant.random_bits(k1, CANON))
  assert np.mean(a == b) < 0.01
  c = np.asarray(quant.random_bits(jax.random.fold_in(k0, 1), CANON))
  assert np.mean(a == c) < 0.01
  assert len(np.unique(a)) > 0.99 * a.size


def test_random_bits_depend_on_flat_index_only():
  """docs/quant.md: a hash of the key's data and the row-major flat index (so any grid of
  kernels can regenerate the same bits)."""
  k = jax.random.key(3)
  a = np.asarray(quant.random_bits(k, CANON)).ravel()
  np.testing.assert_array_equal(a, np.asarray(quant.random_bits(k, (CANON[0] * CANON[1],))))
  np.testing.assert_array_equal(a, np.asarray(quant.random_bits(k, (4, 8, 64))).ravel())


def test_random_bits_are_uniform():
  n = 1 << 16
  bits = np.asarray(quant.random_bits(jax.random.key(7), (n,))).astype(np.uint64)
  per_bit = np.array([np.mean((bits >> i) & 1) for i in range(32)])
  assert np.all(np.abs(per_bit - 0.5) < 5 * np.sqrt(0.25 / n)), per_bit
  u = bits.astype(np.float64) / 2.0 ** 32
  assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / n)
  corr = np.corrcoef(u[:-1], u[1:])[0, 1]     # neighbouring counters are independent
  assert abs(corr) < 5 / np.sqrt(n)
  hist = np.bincount((u * 16).astype(int), minlength=16)
  chi2 = np.sum((hist - n / 16) ** 2 / (n / 16))
  assert chi2 < 50    # 15 degrees of freedom: p ~ 1e-5


# ----------------------------------------------------------------------------- SR unbiased

def _in_range_data(fmt):
  """Blocks whose amax is exactly 2^emax * 2^j (MX: k = j, nothing clips); values off-grid."""
  rng = np.random.default_rng(11)
  x = rng.uniform(-1, 1, CANON)
  j = rng.integers(-6, 6, size=(CANON[0], 1)).astype(np.float64)
  f = O.get_fmt(fmt)
  top = 2.0 ** O.ELEMENTS[f.element].emax if f.scale == "e8m0" else 1.0
  x = x * top * np.exp2(j)
  x[:, ::32] = top * np.exp2(j)           # the block max, on the grid
  return x.astype(np.float32)


SR_FORMATS = ["mxfp4", "mxfp6_e3m2", "mxfp8_e5m2", "nvfp4", "nvfp4_16x16", "int4_g128",
              "fp8_e4m3", "uint4_g128"]
N_KEYS = 1024


@pytest.mark.parametrize("fmt", SR_FORMATS)
def test_stochastic_rounding_is_unbiased(fmt):
  """Over 1024 keys every element rounds to one of its two grid neighbours dn < x < up, and up
  is chosen with frequency p = (x - dn) / (up - dn) (within 5.5 binomial standard errors), so
  E[q] = x. Saturated or on-grid elements (up == dn) are deterministic."""
  x = _in_range_data(fmt)
  ref_up = O.quantize(x, fmt, rounding="toward_positive")
  ref_dn = O.quantize(x, fmt, rounding="toward_negative")
  up, dn = ref_up["values"], ref_dn["values"]
  # counted on the codes (the neighbours' codes from the oracle), independent of decoding
  xj = jnp.asarray(x)
  c_up, c_dn = jnp.asarray(ref_up["codes_unpacked"]), jnp.asarray(ref_dn["codes_unpacked"])
  four_bit = O.elem_bits(fmt) == 4
  keys = jax.random.split(jax.random.key(123), N_KEYS)

  @jax.jit
  def counts(keys):
    def one(key):
      c = quant.quantize(xj, fmt, rounding="stochastic", key=key).codes
      if four_bit:
        c = quant.unpack_fp4(c, x.shape[-1])
      return (c == c_up).astype(jnp.int32), (c == c_dn).astype(jnp.int32)
    n_up, n_dn = jax.lax.map(one, keys, batch_size=64)
    return n_up.sum(0), n_dn.sum(0)

  n_up, n_dn = (np.asarray(a) for a in counts(keys))
  inside = up != dn
  assert inside.mean() > 0.8, "the data must mostly sit between two grid points"
  assert np.all(n_up[~inside] == N_KEYS), "deterministic elements"
  assert np.all((n_up + n_dn)[inside] == N_KEYS), "SR must pick one of the two neighbours"
  x64, up64, dn64 = (a.astype(np.float64) for a in (x, up, dn))
  p0 = np.where(inside, (x64 - dn64) / np.where(inside, up64 - dn64, 1), 0)
  p_hat = n_up / N_KEYS
  se = np.sqrt(p0 * (1 - p0) / N_KEYS)
  bad = inside & (np.abs(p_hat - p0) > 5.5 * se + 1e-4)   # 1e-4: fp32 scale round-off in p0
  z = np.where(inside & (se > 0), (p_hat - p0) / np.maximum(se, 1e-30), 0)
  assert not bad.any(), f"{bad.sum()} biased elements, worst |z| {np.abs(z).max():.1f}"
  zi = z[inside & (se > 0)]
  assert abs(zi.mean()) < 5 / np.sqrt(zi.size), f"aggregate bias: mean z {zi.mean():.3f}"


# ----------------------------------------------------------------------------- SR never zero

NONZERO_FORMATS = [("mxfp4", 32), ("mxfp6_e2m3", 32), ("mxfp8_e4m3", 32), ("nvfp4", 16),
                   ("nvfp4_16x16", None), ("int4_g128", 128), ("fp8_e4m3", None)]


@pytest.mark.parametrize("fmt,bsz", NONZERO_FORMATS)
def test_stochastic_rounding_never_all_zero(fmt, bsz):
  rng = np.random.default_rng(5)
  base = rng.standard_normal(CANON)
  for mag in (1e-30, 1.0, 1e30):
    if fmt == "fp8_e4m3" and mag == 1e30:
      continue
    x = jnp.asarray((base * mag).astype(np.float32))
    rtn = np.asarray(quant.fake_quant(x, fmt))
    for seed in range(2):
      y = np.asarray(quant.fake_quant(x, fmt, rounding="stochastic", key=jax.random.key(seed)))
      assert np.count_nonzero(y) >= 0.8 * np.count_nonzero(rtn), (mag, seed)
      if bsz:   # the largest element of every block stays non-zero
        blocks = y.reshape(CANON[0], -1, bsz)
        assert np.all(np.any(blocks != 0, axis=-1)), (mag, seed)


def test_stochastic_rounding_small_values_nvfp4():
  """Values well below half the smallest step of their block round up with probability
  |v| / step (a kernel that returned zeros here would fail)."""
  x = np.full(CANON, 0.05, np.float32)
  x[:, 1::2] = -0.01
  x[:, ::16] = 6.0          # amax 6 in every block: S_enc_b ~ 1, step 0.5 next to zero
  y = np.asarray(quant.fake_quant(jnp.asarray(x), "nvfp4", rounding="stochastic",
                                  key=jax.random.key(0)))
  for value, step_sign in ((0.05, 1), (-0.01, -1)):
    sel = (x == np.float32(value))
    got = y[sel]
    assert np.all((got == 0) | (got == np.float32(0.5 * step_sign)))
    p = abs(value) / 0.5
    n, k = sel.sum(), np.count_nonzero(got)
    assert abs(k - n * p) < 5.5 * np.sqrt(n * p * (1 - p)), (value, k, n * p)


# ----------------------------------------------------------------------------- MSE anchors

ANCHORS = [("mxfp4", "nearest_even", 1.32e-2), ("mxfp4", "stochastic", 2.5e-2),
           ("nvfp4", "nearest_even", 9.0e-3), ("nvfp4", "stochastic", 1.9e-2)]
_NORMAL = np.random.default_rng(2024).standard_normal((1024, 1024)).astype(np.float32)


@pytest.mark.parametrize("fmt,rounding,anchor", ANCHORS)
def test_relative_mse_anchors(fmt, rounding, anchor):
  """E(q - x)^2 / E x^2 on 2^20 N(0,1) samples within 5% of §6 (statistical error ~0.3%)."""
  x = jnp.asarray(_NORMAL)
  key = jax.random.key(99) if rounding == "stochastic" else None
  q = quant.quantize(x, fmt, rounding=rounding, key=key)
  y = np.asarray(quant.dequantize(q), np.float64)
  rel = np.sum((y - _NORMAL) ** 2) / np.sum(_NORMAL.astype(np.float64) ** 2)
  assert abs(rel / anchor - 1) < 0.05, f"{fmt} {rounding}: relative MSE {rel:.4e} vs {anchor:.2e}"
  if rounding == "nearest_even":   # and the codes are the oracle's on this large tensor too
    ref = O.quantize(_NORMAL, fmt)
    O.assert_same_bits(np.asarray(q.codes), ref["codes"], "codes")
    O.assert_same_bits(np.asarray(q.scales), ref["scales"], "scales")


def test_sr_error_is_larger_than_rtn_but_unbiased_on_average():
  """SR trades variance for bias: larger MSE, but the mean error over a tensor is ~0."""
  x = jnp.asarray(_NORMAL[:16, :128])
  keys = jax.random.split(jax.random.key(5), 64)
  errs = [np.asarray(quant.fake_quant(x, "mxfp8_e4m3", rounding="stochastic", key=k)) - x
          for k in keys[:8]]
  e = np.stack(errs).astype(np.float64)
  assert abs(e.mean()) < 5 * e.std() / np.sqrt(e.size)
  rtn = np.asarray(quant.fake_quant(x, "mxfp8_e4m3")) - np.asarray(x)
  assert np.mean(e ** 2) > np.mean(rtn.astype(np.float64) ** 2)
