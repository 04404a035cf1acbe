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


def _normalize_axis(axis: int, ndim: int) -> int:
  if not -ndim <= axis < ndim:
    raise ValueError(f"axis {axis} is out of range for an array of rank {ndim}.")
  return axis % ndim


def pack_fp4(codes, axis: int = -1):
  """Packs uint8 nibbles (values 0..15) two per byte along `axis`; an odd length gets a zero pad."""
  codes = jnp.asarray(codes)
  if codes.ndim == 0:
    raise ValueError("pack_fp4 needs an array with at least one axis.")
  axis = _normalize_axis(axis, codes.ndim)
  codes = jnp.moveaxis(codes.astype(jnp.uint8), axis, -1)
  n = codes.shape[-1]
  if n % 2:
    codes = jnp.pad(codes, [(0, 0)] * (codes.ndim - 1) + [(0, 1)])
  pairs = (codes & 0xF).reshape(codes.shape[:-1] + (codes.shape[-1] // 2, 2))  # no -1: empty ok
  # Each pair as one little-endian uint16 (element 2i the low byte): a contiguous, vectorizable
  # pass instead of two strided reads per output byte. jnp's view keeps that byte order on every
  # backend (it is defined on the host's little-endian layout, as numpy's .view is).
  word = jax.lax.bitcast_convert_type(pairs, jnp.uint16)
  packed = (word | (word >> 4)).astype(jnp.uint8)
  return jnp.moveaxis(packed, -1, axis)


def unpack_fp4(packed, n: int, axis: int = -1):
  """Inverse of pack_fp4: returns `n` uint8 nibbles along `axis`."""
  packed = jnp.asarray(packed)
  if packed.dtype != jnp.uint8:
    raise TypeError(f"packed codes must be uint8, got {packed.dtype}.")
  axis = _normalize_axis(axis, packed.ndim)
  if not 0 <= n <= 2 * packed.shape[axis]:
    raise ValueError(f"n={n} does not fit {packed.shape[axis]} packed bytes along axis {axis}.")
  packed = jnp.moveaxis(packed, axis, -1)
  nibbles = jnp.stack([packed & 0xF, packed >> 4], axis=-1)
  nibbles = nibbles.reshape(packed.shape[:-1] + (2 * packed.shape[-1],))[..., :n]
  return jnp.moveaxis(nibbles, -1, axis)
