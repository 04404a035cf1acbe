"""PNG files and image grids with the standard library only (zlib + struct), written atomically.

Examples:
  >>> import numpy as np, os, tempfile
  >>> images = np.linspace(-1, 1, 4 * 8 * 8).reshape(4, 8, 8, 1)     # floats in [-1, 1]
  >>> grid = image_grid(images, rows=2)
  >>> grid.shape, grid.dtype
  ((17, 17, 1), dtype('uint8'))
  >>> path = os.path.join(tempfile.mkdtemp(), "grid.png")
  >>> save_png(path, grid)
  >>> open(path, "rb").read(8)
  b'\\x89PNG\\r\\n\\x1a\\n'
"""

from __future__ import annotations

import math
import os
import struct
import tempfile
import zlib

import numpy as np

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_COLOR_TYPES = {1: 0, 3: 2}  # channels -> PNG colour type (0 grayscale, 2 RGB)


def to_uint8(images, value_range: tuple[float, float] = (-1.0, 1.0)) -> np.ndarray:
  """uint8 pixels of images: uint8 passes through; floats map value_range onto 0..255 (clipped)."""
  x = np.asarray(images)
  if x.dtype == np.uint8:
    return x
  low, high = value_range
  scaled = (x.astype(np.float64) - low) / (high - low) * 255.0
  return np.clip(np.round(scaled), 0, 255).astype(np.uint8)


def image_grid(images, rows: int, *, pad: int = 1, pad_value: int = 0,
               value_range: tuple[float, float] = (-1.0, 1.0)) -> np.ndarray:
  """Tiles images (N, H, W[, C]) into one uint8 image (rows x ceil(N / rows) tiles).

  Tiles are separated by `pad` pixels of `pad_value`; floats are mapped from `value_range`.
  """
  x = to_uint8(images, value_range)
  if x.ndim == 3:
    x = x[..., None]
  if x.ndim != 4 or x.shape[-1] not in _COLOR_TYPES:
    raise ValueError(f"image_grid needs images (N, H, W) or (N, H, W, 1|3), got shape {x.shape}.")
  n, h, w, c = x.shape
  if not 1 <= rows <= max(n, 1):
    raise ValueError(f"rows={rows} must be between 1 and the number of images ({n}).")
  cols = math.ceil(n / rows)
  grid = np.full((rows * (h + pad) - pad, cols * (w + pad) - pad, c), pad_value, np.uint8)
  for i in range(n):
    r, q = divmod(i, cols)
    grid[r * (h + pad):r * (h + pad) + h, q * (w + pad):q * (w + pad) + w] = x[i]
  return grid


def _chunk(kind: bytes, data: bytes) -> bytes:
  return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def encode_png(image) -> bytes:
  """The bytes of an 8-bit PNG of image (H, W), (H, W, 1) or (H, W, 3), uint8 or floats in [-1, 1]."""
  x = to_uint8(image)
  if x.ndim == 2:
    x = x[..., None]
  if x.ndim != 3 or x.shape[-1] not in _COLOR_TYPES or 0 in x.shape:
    raise ValueError(f"A PNG needs an image (H, W), (H, W, 1) or (H, W, 3), got shape {x.shape}; "
                     "tile a batch with image_grid first.")
  h, w, c = x.shape
  header = struct.pack(">IIBBBBB", w, h, 8, _COLOR_TYPES[c], 0, 0, 0)
  rows = np.concatenate([np.zeros((h, 1), np.uint8), x.reshape(h, w * c)], axis=1)  # filter 0
  idat = zlib.compress(rows.tobytes(), 6)
  return PNG_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def save_png(path: str, images) -> None:
  """Writes one image, or a batch (N, H, W[, C]) tiled in a near-square grid, as a PNG.

  The file appears atomically (a temporary file in the same directory, then os.replace).
  """
  x = np.asarray(images)
  if x.ndim == 4 or (x.ndim == 3 and x.shape[-1] not in _COLOR_TYPES):
    x = image_grid(x, rows=max(1, math.isqrt(len(x))))
  data = encode_png(x)
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp.png")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file a normal file's mode
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
