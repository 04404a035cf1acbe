"""Two 4-bit codes per byte: element 2i in the low nibble, 2i+1 in the high nibble (docs/numerics.md §1).

Examples:
  >>> import jax.numpy as jnp
  >>> packed = pack_fp4(jnp.array([1, 2, 3], jnp.uint8))
  >>> [hex(int(b)) for b in packed]
  ['0x21', '0x3']
  >>> unpack_fp4(packed, 3).tolist()
  [1, 2, 3]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def normalize_axis(axis: int, ndim: int) -> int:
  """`axis` of an array of rank `ndim` as a non-negative index; a ValueError when out of range."""
  if not -ndim <= axis < ndim:
    raise ValueError(f"axis {axis} is out of range for an array of rank {ndim}.")
  return axis % ndim


def pack_fp4(codes, axis: int = -1):
  """Packs uint8 nibbles (values 0..15) two per byte along `axis`; an odd length gets a zero pad."""
  codes = jnp.asarray(codes)
  if codes.ndim == 0:
    raise ValueError("pack_fp4 needs an array with at least one axis.")
  axis = normalize_axis(axis, codes.ndim)
  codes = codes.astype(jnp.uint8) & 0xF
  n = codes.shape[axis]
  if n % 2:
    codes = jnp.pad(codes, [(0, 1) if d == axis else (0, 0) for d in range(codes.ndim)])
  pairs = codes.reshape(codes.shape[:axis] + (codes.shape[axis] // 2, 2) + codes.shape[axis + 1:])
  if axis < codes.ndim - 1:  # in place: the pair's two rows are contiguous runs
    lo, hi = jnp.take(pairs, 0, axis=axis + 1), jnp.take(pairs, 1, axis=axis + 1)
    return lo | (hi << 4)
  # Along the last axis each pair as one little-endian uint16 (element 2i the low byte): a
  # contiguous, vectorizable pass instead of two strided reads per output byte. jnp's view keeps
  # that byte order on every backend (it is defined on the host's little-endian layout, as
  # numpy's .view is).
  word = jax.lax.bitcast_convert_type(pairs, jnp.uint16)
  return (word | (word >> 4)).astype(jnp.uint8)


def unpack_fp4(packed, n: int, axis: int = -1):
  """Inverse of pack_fp4: returns `n` uint8 nibbles along `axis`."""
  packed = jnp.asarray(packed)
  if packed.dtype != jnp.uint8:
    raise TypeError(f"packed codes must be uint8, got {packed.dtype}.")
  axis = normalize_axis(axis, packed.ndim)
  if not 0 <= n <= 2 * packed.shape[axis]:
    raise ValueError(f"n={n} does not fit {packed.shape[axis]} packed bytes along axis {axis}.")
  nibbles = jnp.stack([packed & 0xF, packed >> 4], axis=axis + 1)  # in place along any axis
  shape = packed.shape[:axis] + (2 * packed.shape[axis],) + packed.shape[axis + 1:]
  return jax.lax.slice_in_dim(nibbles.reshape(shape), 0, n, axis=axis)
