"""How an array is laid out for the kernels: a 2-D view, its zero padding, and the tile grid.

x is seen as (P, M, N) and stored as the 2-D array (P * M_pad, N_pad). Scaling groups run along N
("rows": quantize along the last axis) or along M ("cols": along any other axis; the blocked axis is
M, the axes after it are flattened into N), or both (`double_quantize`). A kernel tile is
(tile_m, tile_n), powers of two (a Triton requirement) that divide the padded extents and hold
whole scaling groups along each blocked direction. Padding is zeros (which change no block amax,
docs/numerics.md §4) and is cut off the outputs; shapes that need none are not copied.

Examples:
  >>> view = make_view((3, 5, 96), axis=-1, block=32, directions=("rows",))
  >>> (view.p, view.m, view.n), (view.m_pad, view.n_pad), view.tile
  ((1, 15, 96), (16, 96), (16, 32))
  >>> view = make_view((4, 64, 8), axis=1, block=32, directions=("cols",))
  >>> (view.p, view.m, view.n), view.tile
  ((4, 64, 8), (64, 8))
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

# Default tile caps (elements); the benchmark can override them with `tile=`.
ROWS_TILE = (32, 256)  # groups along the contiguous axis: 32 rows x 256 columns
COLS_TILE = (64, 128)  # groups down the columns: 64 rows (2 MX blocks) x 128 contiguous columns
MIN_FREE_TILE = 8  # a non-blocked tile edge below this is padded up rather than used as is


def _pow2_divisor(n: int, cap: int) -> int:
  """The largest power of two that divides n and is <= cap (n >= 1)."""
  d = 1
  while d * 2 <= cap and n % (d * 2) == 0:
    d *= 2
  return d


def _next_pow2(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()


def check_tile(tile) -> tuple[int, int] | None:
  if tile is None:
    return None
  if len(tile) != 2 or any(not isinstance(t, int) or t < 1 or t & (t - 1) for t in tile):
    raise ValueError(f"tile must be two powers of two (rows, columns), got {tile!r}.")
  return tuple(tile)


def blocked_extent(n: int, unit: int, cap: int) -> tuple[int, int]:
  """(padded extent, tile) of a blocked axis: whole units of `unit` elements per tile."""
  units = max(math.ceil(n / unit), 1)
  tile = unit * _pow2_divisor(units, max(cap // unit, 1))
  return units * unit, tile


def free_extent(n: int, cap: int, minimum: int = MIN_FREE_TILE,
                strict: bool = False) -> tuple[int, int]:
  """(padded extent, tile) of an axis without groups: pad only when no tile >= minimum divides.

  A short axis (n < minimum) is padded to a power of two >= n, or to `minimum` when `strict`.
  """
  n = max(n, 1)
  floor = min(minimum, cap) if strict else min(minimum, _next_pow2(n), cap)
  padded = math.ceil(n / floor) * floor if _pow2_divisor(n, cap) < floor else n
  return padded, _pow2_divisor(padded, cap)


@dataclasses.dataclass(frozen=True)
class View:
  shape: tuple[int, ...]  # x's shape
  directions: tuple[str, ...]  # "rows" (groups along N) and/or "cols" (groups along M)
  p: int  # leading extent (flattened axes before M)
  m: int  # logical extent of M (x's, or x's padded to the Hadamard block)
  n: int  # logical extent of N
  m_in: int  # x's extent of M
  n_in: int  # x's extent of N
  m_pad: int  # M padded (a multiple of tile[0])
  n_pad: int  # N padded (a multiple of tile[1])
  tile: tuple[int, int]  # kernel tile (rows, columns) of the 2-D view

  @property
  def grid(self) -> tuple[int, int]:
    return (self.p * self.m_pad // self.tile[0], self.n_pad // self.tile[1])

  @property
  def rows(self) -> int:
    return self.p * self.m_pad

  def to_2d(self, a):
    """An array of x's shape -> (P * M_pad, N_pad), zero-padded."""
    return self.pad_2d(a, self.m_in, self.n_in, self.m_pad, self.n_pad)

  def pad_2d(self, a, m, n, m_pad, n_pad):
    """A (P, m, n)-shaped array (codes or scales) -> (P * m_pad, n_pad), zero-padded."""
    a = a.reshape(self.p, m, n)
    if (m_pad, n_pad) != (m, n):
      a = jnp.pad(a, [(0, 0), (0, m_pad - m), (0, n_pad - n)])
    return a.reshape(self.p * m_pad, n_pad)

  def from_2d(self, a, m: int, n: int, shape):
    """(P * m_pad', n_pad') -> the leading (m, n) of each slab, reshaped to `shape`."""
    a = a.reshape(self.p, a.shape[0] // self.p, a.shape[1])
    if a.shape[1:] != (m, n):
      a = a[:, :m, :n]
    return a.reshape(shape)


def make_view(shape, axis: int, block: int, directions, *, tile=None, m_unit: int | None = None,
              n_unit: int | None = None, min_free: int | None = None, m_len: int | None = None,
              n_len: int | None = None) -> View:
  """The view of an array of `shape` blocked along `axis` (or the last two axes for both).

  Args:
    shape: x's shape (rank >= 1; rank >= 2 for both directions).
    axis: the blocked axis, normalized (ignored when both directions are given).
    block: elements per scaling group.
    directions: ("rows",), ("cols",) or ("rows", "cols").
    tile: optional caps (rows, columns) on the kernel tile, powers of two.
    m_unit / n_unit: the tile unit along a blocked M / N (default `block`; the Hadamard kernels
      need whole rotation blocks too).
    min_free: if given, the smallest tile edge along a non-blocked axis, padding short axes up
      (the Hadamard kernels' dots need 16); by default a short axis keeps a small tile.
    m_len / n_len: the extents to pad M / N to before blocking (the Hadamard block multiple).
  """
  shape = tuple(int(d) for d in shape)
  ndim = len(shape)
  if directions == ("rows",):
    p, m, n = 1, math.prod(shape[:-1]), shape[-1]
    caps = ROWS_TILE
  elif directions == ("cols",):
    p, m, n = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    caps = COLS_TILE
  else:
    if ndim < 2:
      raise ValueError(f"quantizing along both of the last two axes needs rank >= 2, got {shape}.")
    p, m, n = math.prod(shape[:-2]), shape[-2], shape[-1]
    caps = COLS_TILE
  caps = check_tile(tile) or caps
  m_real = m if m_len is None else m_len
  n_real = n if n_len is None else n_len
  if "cols" in directions:
    m_pad, tm = blocked_extent(m_real, m_unit or block, max(caps[0], m_unit or block))
  else:
    m_pad, tm = free_extent(m_real, caps[0], min_free or MIN_FREE_TILE, min_free is not None)
  if "rows" in directions:
    n_pad, tn = blocked_extent(n_real, n_unit or block, max(caps[1], n_unit or block))
  else:
    n_pad, tn = free_extent(n_real, caps[1], min_free or MIN_FREE_TILE, min_free is not None)
  return View(shape=shape, directions=tuple(directions), p=p, m=m_real, n=n_real, m_in=m, n_in=n,
              m_pad=m_pad, n_pad=n_pad, tile=(tm, tn))
