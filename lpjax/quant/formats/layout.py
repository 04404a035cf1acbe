"""How an array is cut into scaling groups (blocks, channels, the tensor, or 16x16 tiles).

A `GroupLayout` maps an array of x's shape to a "grouped" view in which a reduction over
`reduce_axes` (keepdims) gives one value per scaling group that broadcasts back over the group,
and maps per-group values to the public `scales` layout of docs/quant.md.

Examples:
  >>> import jax.numpy as jnp
  >>> from lpjax.quant.formats import specs as formats
  >>> layout = GroupLayout.make(formats.get_format("mxfp4"), (3, 40), axis=-1)
  >>> layout.group(jnp.zeros((3, 40))).shape, layout.scale_shape
  ((3, 2, 32), (3, 2))
  >>> inner = GroupLayout.make(formats.get_format("mxfp4"), (64, 5), axis=0)  # blocks in place
  >>> inner.group(jnp.zeros((64, 5))).shape, inner.reduce_axes, inner.scale_shape
  ((2, 32, 5), (-2,), (2, 5))
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from lpjax.quant.formats.packing import normalize_axis


@dataclasses.dataclass(frozen=True)
class GroupLayout:
  kind: str  # "block" (1-D blocks along axis; channel = one block of the whole axis), "tensor", "tile"
  shape: tuple[int, ...]  # x's shape
  axis: int  # the blocked axis, non-negative (the last axis for tiles; unused for "tensor")
  block: int  # elements per block along the axis (tile edge for tiles)

  @classmethod
  def make(cls, fmt, shape, axis: int) -> "GroupLayout":
    shape = tuple(int(d) for d in shape)
    ndim = len(shape)
    if fmt.granularity == "tensor":
      if ndim:
        normalize_axis(axis, ndim)
      return cls("tensor", shape, ndim - 1 if ndim else 0, 0)
    if ndim == 0:
      raise ValueError(f"Format {fmt} scales blocks along an axis; got a scalar. Use a per-tensor "
                       "format (e.g. 'fp8_e4m3') or reshape to rank >= 1.")
    axis = normalize_axis(axis, ndim)
    if fmt.tile:
      if ndim < 2:
        raise ValueError(f"Format {fmt} tiles the last two axes; got shape {shape}.")
      return cls("tile", shape, ndim - 1, fmt.block_size)
    block = shape[axis] if fmt.granularity == "channel" else fmt.block_size
    return cls("block", shape, axis, max(block, 1))

  # --- x's shape <-> grouped view ---------------------------------------------------------------

  @property
  def reduce_axes(self) -> tuple[int, ...]:
    if self.kind == "tensor":
      return tuple(range(len(self.shape)))
    if self.kind == "tile":
      return (-3, -1)
    return (self.axis - len(self.shape),)  # the within-block axis of the grouped view

  def _padded(self, n: int) -> int:
    return math.ceil(n / self.block) * self.block

  def group(self, a):
    """x-shaped array -> grouped view (zero padding at the ends of the blocked axes)."""
    if self.kind == "tensor":
      return a
    if self.kind == "tile":
      m, k = self.shape[-2:]
      pad = [(0, 0)] * (a.ndim - 2) + [(0, self._padded(m) - m), (0, self._padded(k) - k)]
      a = jnp.pad(a, pad) if any(p for _, p in pad) else a
      b = self.block
      return a.reshape(a.shape[:-2] + (a.shape[-2] // b, b, a.shape[-1] // b, b))
    ax, n = self.axis, self.shape[self.axis]
    if self._padded(n) != n:
      a = jnp.pad(a, [(0, self._padded(n) - n) if d == ax else (0, 0) for d in range(a.ndim)])
    return a.reshape(a.shape[:ax] + (-1, self.block) + a.shape[ax + 1:])

  def ungroup(self, g):
    """Grouped view -> x's shape (padding dropped)."""
    if self.kind == "tensor":
      return g
    if self.kind == "tile":
      m, k = self.shape[-2:]
      a = g.reshape(g.shape[:-4] + (g.shape[-4] * g.shape[-3], g.shape[-2] * g.shape[-1]))
      return a[..., :m, :k]
    ax = self.axis
    a = g.reshape(g.shape[:ax] + (-1,) + g.shape[ax + 2:])
    return jax.lax.slice_in_dim(a, 0, self.shape[ax], axis=ax)

  # --- per-group values <-> public scales --------------------------------------------------------

  @property
  def scale_shape(self) -> tuple[int, ...]:
    if self.kind == "tensor":
      return ()
    if self.kind == "tile":
      m, k = self.shape[-2:]
      return self.shape[:-2] + (math.ceil(m / self.block), math.ceil(k / self.block))
    shape = list(self.shape)
    shape[self.axis] = math.ceil(shape[self.axis] / self.block)
    return tuple(shape)

  def scales_out(self, per_group):
    """keepdims per-group values -> the public scales layout."""
    if self.kind == "tensor":
      return per_group.reshape(())
    if self.kind == "tile":
      return per_group[..., 0, :, 0]
    return jnp.squeeze(per_group, self.axis + 1)

  def scales_in(self, scales):
    """Public scales -> keepdims per-group values that broadcast over the grouped view."""
    if self.kind == "tensor":
      return scales.reshape((1,) * len(self.shape))
    if self.kind == "tile":
      return scales[..., :, None, :, None]
    return jnp.expand_dims(scales, self.axis + 1)
