"""Independent numpy references for the FP4 GEMM kernel tests (and benchmarks/speed/fp4_gemm.py).

None of this runs lpjax's kernel code: codes are decoded from the packed bytes with the E2M1 table
of docs/numerics.md §1, scales from their bytes, block sums in int64, products in float64.
"""

import jax.numpy as jnp
import numpy as np

from lpjax import quant

E2M1_X2 = np.array([0, 1, 2, 3, 4, 6, 8, 12], np.int64)  # 2 * the E2M1 code points 0..7
EPS32 = 2.0**-24


# --------------------------------------------------------------------------- numpy references


def np_values_x2(q):
  """int64 2 * E2M1 values (..., K) from the packed bytes (low nibble first)."""
  b = np.asarray(q.codes).astype(np.int64)
  nib = np.stack([b & 15, b >> 4], -1).reshape(*b.shape[:-1], -1)[..., : q.shape[-1]]
  v = E2M1_X2[nib & 7]
  return np.where(nib >= 8, -v, v)


def np_scales(q):
  """float64 block scales (..., rows, n_blocks); 16x16 tiles repeated over their rows."""
  s = np.asarray(q.scales).astype(np.int64)
  if q.fmt.scale == "e8m0":
    v = np.where(s == 255, np.nan, np.exp2(s - 127.0))
  else:
    e, m = (s >> 3) & 15, s & 7
    v = np.where(e == 0, m * 2.0**-9, (1 + m / 8) * np.exp2(e - 7.0))
    v = np.where((s & 0x7F) == 0x7F, np.nan, v)
  if q.fmt.tile:
    v = np.repeat(v, q.fmt.block_size, axis=-2)[..., : q.shape[-2], :]
  return v


def _blocked(q):
  b = q.fmt.block_size
  v = np_values_x2(q)
  nb = -(-q.shape[-1] // b)
  v = np.pad(v, [(0, 0)] * (v.ndim - 1) + [(0, nb * b - v.shape[-1])])
  return v.reshape(*v.shape[:-1], nb, b)


def np_partials(qa, qb):
  """(n_blocks, ..., M, N) int64 partial sums of (2a)(2b) per block."""
  a, b = _blocked(qa), _blocked(qb)
  return np.moveaxis(np.einsum("...mjk,...njk->...mnj", a, b), -1, 0)


def np_tensor_factor(qa, qb):
  def g(q):
    if q.tensor_scale is None or float(q.tensor_scale) == 0:
      return np.float32(1)
    return np.float32(q.tensor_scale) * np.float32(1 / 2688)
  return np.float32(g(qa) * g(qb))


def np_sequential(qa, qb):
  """float32: sum over blocks, in order, of the exact products P_j s_a s_b / 4; NVFP4: x g_a g_b."""
  parts = np_partials(qa, qb)
  sa, sb = np_scales(qa), np_scales(qb)
  acc = np.zeros(parts.shape[1:], np.float32)
  for j in range(parts.shape[0]):
    exact = parts[j] * sa[..., :, None, j] * sb[..., None, :, j] / 4  # exact in float64
    acc = (acc + exact.astype(np.float32)).astype(np.float32)
  if qa.tensor_scale is not None or qb.tensor_scale is not None:
    acc = (acc * np_tensor_factor(qa, qb)).astype(np.float32)
  return acc


def np_float64(qa, qb):
  """(float64 GEMM of lpjax's dequantized values, float64 sum of |a||b| for the error bound)."""
  a = np.asarray(quant.dequantize(qa, impl="xla"), np.float64)
  b = np.asarray(quant.dequantize(qb, impl="xla"), np.float64)
  return a @ np.swapaxes(b, -1, -2), np.abs(a) @ np.swapaxes(np.abs(b), -1, -2)


def assert_within_f32_accumulation(y, qa, qb, extra_ulps=6):
  """|y - float64| <= (n_blocks + extra) eps32 sum|a||b|: float32 accumulation over the blocks
  (plus NVFP4's rounded decode multipliers in lpjax's dequantized values and the final scaling)."""
  ref, mag = np_float64(qa, qb)
  nb = -(-qa.shape[-1] // qa.fmt.block_size)
  bound = (nb + extra_ulps) * EPS32 * mag + 1e-37
  err = np.abs(np.asarray(y, np.float64) - ref)
  assert np.all(err <= bound), f"max error {err.max()} vs bound {bound[err > bound].min()}"


# --------------------------------------------------------------------------- data


def quantized(shape, fmt, seed, *, exponents=(-4, 4), scale=1.0, zero_rows=(), axis=-1):
  """quant.quantize (along `axis`) of heavy-tailed data times a random power of two per 16
  elements along `axis`, so block scales differ and the float32 sums round."""
  rng = np.random.default_rng(seed)
  moved = list(shape)
  moved.append(moved.pop(axis % len(shape)))
  k = moved[-1]
  exps = np.repeat(rng.integers(*exponents, size=moved[:-1] + [-(-k // 16)]), 16, -1)[..., :k]
  x = (rng.standard_t(4, size=moved) * np.exp2(exps) * scale).astype(np.float32)
  for r in zero_rows:
    x[..., r, :] = 0.0
  x = np.moveaxis(x, -1, axis % len(shape))
  return quant.quantize(jnp.asarray(x), fmt, axis=axis, impl="xla")


def e2m1_exact(shape, seed, block=32):
  """E2M1 values with a +-6 in every block along both axes: quantized losslessly (scale 1)."""
  rng = np.random.default_rng(seed)
  vals = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
  x = vals[rng.integers(0, 8, size=shape)] * rng.choice([-1.0, 1.0], size=shape)
  i, j = np.indices(shape[-2:])
  x[..., (i + j) % block == 0] = 6.0
  return jnp.asarray(x, jnp.float32)
