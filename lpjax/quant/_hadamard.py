"""Random Hadamard transform (RHT): blocks of g elements times H_g diag(signs) / sqrt(g).

Orthogonal, so applying it to both operands of a GEMM along the contraction axis leaves the
product unchanged in exact arithmetic while spreading outliers across the block (docs/numerics.md §7).

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

from lpjax.quant._packing import _normalize_axis


@functools.lru_cache(maxsize=None)
def hadamard_matrix(n: int) -> np.ndarray:
  """The Sylvester Hadamard matrix H_n (entries ±1), n a power of two."""
  if n < 1 or n & (n - 1):
    raise ValueError(f"Hadamard block size must be a power of two, got {n}.")
  h = np.ones((1, 1), np.float32)
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  return h


def random_signs(key, n: int) -> jax.Array:
  """float32 ±1 of shape (n,), from `key`."""
  return jnp.where(jax.random.bernoulli(key, 0.5, (n,)), 1.0, -1.0).astype(jnp.float32)


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
  axis = _normalize_axis(axis, x.ndim)
  h = hadamard_matrix(block)
  if x.shape[axis] % block:
    raise ValueError(f"hadamard: x.shape[{axis}] = {x.shape[axis]} is not a multiple of the block "
                     f"size {block}; pad the axis or choose a block that divides it.")
  compute = jnp.promote_types(x.dtype, jnp.float32)
  if signs is None:
    signs = jnp.ones((block,), compute)
  signs = jnp.asarray(signs, compute)
  if signs.shape != (block,):
    raise ValueError(f"signs must have shape ({block},), got {signs.shape}.")
  xm = jnp.moveaxis(x, axis, -1).astype(compute)
  xb = xm.reshape(xm.shape[:-1] + (-1, block))
  hm = jnp.asarray(h, compute) / jnp.sqrt(jnp.asarray(block, compute))
  if inverse:  # (H D)^T = D H: transform first, then the signs
    yb = jnp.matmul(xb, hm, precision=jax.lax.Precision.HIGHEST) * signs
  else:  # y = H (D x) for each block as a column vector; H is symmetric
    yb = jnp.matmul(xb * signs, hm, precision=jax.lax.Precision.HIGHEST)
  return jnp.moveaxis(yb.reshape(xm.shape), -1, axis).astype(x.dtype)
