"""Random Hadamard transform (RHT): blocks of g elements times H_g diag(signs) / sqrt(g).

Orthogonal, so applying it to both operands of a GEMM along the contraction axis leaves the
product unchanged in exact arithmetic while spreading outliers across the block (docs/numerics.md §7).

Computed as a fast Walsh-Hadamard transform, so its rounding is defined, not left to a GEMM's
summation order: log2(g) butterfly stages h = 1, 2, 4, ..., g/2, each taking every pair (a, b) of
elements h apart within groups of 2h to (fl(a + b), fl(a - b)), then one multiply by
fl(1 / sqrt(g)), and every zero result made +0. The Pallas kernels (lpjax/pallas/_rht.py) compute
the same stages as products with `butterfly_stages` matrices (each output is one exact a +- b plus
exact zeros, so any summation order gives the same value; zeros are made +0 there too) and match
this function bit for bit. 2 log2(g) additions per element instead of a g-wide matmul.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> x = jnp.arange(8.0).reshape(2, 4)
  >>> signs = random_signs(jax.random.key(0), 4)
  >>> y = hadamard(x, 4, signs=signs)
  >>> bool(jnp.allclose(hadamard(y, 4, signs=signs, inverse=True), x, atol=1e-5))
  True
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.quant.numerics import rng
from lpjax.quant.numerics.materialize import materialize, opaque_zero
from lpjax.quant.formats.packing import normalize_axis


@functools.lru_cache(maxsize=None)
def hadamard_matrix(n: int) -> np.ndarray:
  """The Sylvester Hadamard matrix H_n (entries ±1), n a power of two."""
  if n < 1 or n & (n - 1):
    raise ValueError(f"Hadamard block size must be a power of two, got {n}.")
  h = np.ones((1, 1), np.float32)
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  return h


@functools.lru_cache(maxsize=None)
def butterfly_stages(n: int) -> np.ndarray:
  """float32 (log2(n), n, n): stage h = 2**i as a matrix S with y = x @ S = the butterflies of `fwht`."""
  hadamard_matrix(n)  # validates n
  stages = []
  h = 1
  while h < n:
    s = np.zeros((n, n), np.float32)
    for start in range(0, n, 2 * h):
      for p in range(h):
        a, b = start + p, start + p + h
        s[a, a], s[b, a] = 1.0, 1.0  # column a: a + b
        s[a, b], s[b, b] = 1.0, -1.0  # column b: a - b
    stages.append(s)
    h *= 2
  return np.stack(stages) if stages else np.zeros((0, n, n), np.float32)


def normalizer(n: int, dtype) -> np.ndarray:
  """fl(1 / sqrt(n)) in `dtype`: the transform's final multiplier."""
  return np.asarray(1.0 / np.sqrt(float(n)), dtype=dtype)


# Butterfly levels computed per pass over the data, by where the transformed axis lies. Along the
# last axis the first pass takes level h = 1 alone and each later pass two levels (the last entry
# repeats); along an inner axis (pairs of contiguous rows) every pass takes two. See `fwht`.
_LEVELS_PER_PASS = (1, 2)
_LEVELS_PER_PASS_INNER = (2,)


def fwht(xb, axis: int = -1):
  """Unnormalized Walsh-Hadamard transform along `axis` (its length a power of two), by butterflies.

  The log2(n) butterfly levels are grouped into passes: a pass of g levels takes each group of
  2^g elements (h apart) to their 2^g outputs in one expression, with exactly the additions and
  subtractions of the g levels one after the other, so the result is the same bit for bit. Each
  pass is one XLA fusion and one float32 array, so fewer passes mean fewer full-size float32
  temporaries (on LLaMA-1B's backward they set the peak) and fewer trips through memory.

  The transform runs where the axis lies, without moving any data: along an inner axis the
  pairs of a level are whole rows of contiguous elements, which vectorize well, so passes of two
  levels are fastest; along the last axis the first pass is a single
  level because XLA fuses the operand's producer (the sign flips, the bf16 -> f32 convert) into
  it, and a wider pass would read that producer 2^g times; the later passes take two levels. A
  transposed copy to bring the axis last would cost more than the transform (measured on CPU).

  Examples:
    >>> import jax.numpy as jnp
    >>> fwht(jnp.array([1.0, 2.0, 3.0, 4.0])).tolist()  # H_4 @ x
    [10.0, -2.0, -4.0, 0.0]
    >>> fwht(jnp.array([[1.0, 5.0], [2.0, 6.0], [3.0, 7.0], [4.0, 8.0]]), axis=0)[:, 1].tolist()
    [26.0, -2.0, -4.0, 0.0]
  """
  shape = xb.shape
  axis = axis % xb.ndim
  n = shape[axis]
  per_pass = _LEVELS_PER_PASS if axis == xb.ndim - 1 else _LEVELS_PER_PASS_INNER
  h, done = 1, 0
  while h < n:
    levels = per_pass[min(done, len(per_pass) - 1)]
    done += 1
    k = 2  # the pass's group: 2^levels elements, h apart (fewer at the last level)
    while k < 2**levels and h * k < n:
      k *= 2
    # Only the transformed axis is split (no axes merged), so a sharding of the others carries.
    v = xb.reshape(shape[:axis] + (n // (k * h), k, h) + shape[axis + 1:])
    parts = [jax.lax.index_in_dim(v, i, axis + 1, keepdims=False) for i in range(k)]
    step = 1
    while step < k:  # level h * step: pairs `step` apart within the group
      out = list(parts)
      for start in range(0, k, 2 * step):
        for i in range(start, start + step):
          a, b = parts[i], parts[i + step]
          out[i], out[i + step] = a + b, a - b
      parts = out
      step *= 2
    xb = jnp.stack(parts, axis=axis + 1)
    h *= k
  return xb.reshape(shape)


def positive_zeros(y):
  """y with every zero as +0 (the sign of an exact zero sum is summation-order dependent)."""
  return jnp.where(y == 0, jnp.zeros_like(y), y)


def random_signs(key, n: int) -> jax.Array:
  """float32 ±1 of shape (n,), from `key`: sign i is -1 where the top bit of
  `lpjax.quant.random_bits(key, (n,))[i]` is set, +1 otherwise."""
  a, m = rng.stream_words(key, materialized=False)  # materialized below, with the signs
  bits = rng.hash_bits(rng.flat_index((n,)), a, m)  # rng.random_bits(key, (n,))
  signs = jnp.where((bits >> 31) != 0, jnp.float32(-1.0), jnp.float32(1.0))
  # Computed once: XLA would otherwise fuse the hashes into every element of the transform. The
  # opaque zero from a stream word (not the bits): the key's hashes, the bits' and the division
  # are one kernel.
  (signs,) = materialize((signs,), opaque_zero(a))
  return signs


def hadamard(x, block: int, axis: int = -1, signs=None, inverse: bool = False) -> jax.Array:
  """Applies H_block diag(signs) / sqrt(block) to each block of `block` elements along `axis`.

  Args:
    x: float array; x.shape[axis] must be a multiple of `block`.
    block: block size, a power of two (16..256 in the recipes).
    axis: the axis to transform (the GEMM's contraction axis).
    signs: optional ±1 vector of shape (block,) (`random_signs`); None means all +1.
    inverse: apply the inverse (= transpose) diag(signs) H_block / sqrt(block) instead.

  Returns:
    The transformed array, x's shape and dtype (computed in float32 or wider).
  """
  x = jnp.asarray(x)
  axis = normalize_axis(axis, x.ndim)
  hadamard_matrix(block)  # validates block
  if x.shape[axis] % block:
    raise ValueError(f"hadamard: x.shape[{axis}] = {x.shape[axis]} is not a multiple of the block "
                     f"size {block}; pad the axis or choose a block that divides it.")
  compute = jnp.promote_types(x.dtype, jnp.float32)
  if signs is None:
    signs = jnp.ones((block,), compute)
  signs = jnp.asarray(signs, compute)
  if signs.shape != (block,):
    raise ValueError(f"signs must have shape ({block},), got {signs.shape}.")
  # Blocks viewed in place: (..., blocks, block, ...) along `axis`, the signs broadcast over it.
  # (an explicit block count, not -1: numpy cannot infer -1 in a zero-size array's reshape)
  xb = x.astype(compute).reshape(x.shape[:axis] + (x.shape[axis] // block, block) +
                                 x.shape[axis + 1:])
  signs = signs.reshape((block,) + (1,) * (x.ndim - 1 - axis))
  scale = jnp.asarray(normalizer(block, compute))
  if inverse:  # (H D)^T = D H: transform first, then the signs
    yb = positive_zeros(fwht(xb, axis + 1) * scale) * signs
  else:  # y = H (D x) for each block
    yb = positive_zeros(fwht(xb * signs, axis + 1) * scale)
  return yb.reshape(x.shape).astype(x.dtype)
