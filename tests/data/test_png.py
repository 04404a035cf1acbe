"""lpjax.data._png: PNGs decoded back by an independent reader (and by matplotlib), grids."""

import os
import struct
import zlib

import numpy as np
import pytest

from lpjax.data import _png as png


def read_png(path):
  """A minimal PNG decoder (8-bit grayscale / RGB, no interlace, any of the 5 filter types)."""
  data = open(path, "rb").read()
  assert data[:8] == b"\x89PNG\r\n\x1a\n"
  pos, chunks = 8, []
  while pos < len(data):
    (length,) = struct.unpack(">I", data[pos:pos + 4])
    kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
    (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
    assert crc == zlib.crc32(kind + body), f"bad CRC in {kind}"
    chunks.append((kind, body))
    pos += 12 + length
  assert chunks[0][0] == b"IHDR" and chunks[-1] == (b"IEND", b"")
  w, h, depth, color, comp, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
  assert (depth, comp, filt, interlace) == (8, 0, 0, 0)
  c = {0: 1, 2: 3}[color]
  raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
  stride = w * c
  assert len(raw) == h * (stride + 1)
  out = np.zeros((h, stride), np.int64)
  for y in range(h):
    f, line = raw[y * (stride + 1)], np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1)
    prev = out[y - 1] if y else np.zeros(stride, np.int64)
    row = np.zeros(stride, np.int64)
    for x in range(stride):
      a = row[x - c] if x >= c else 0
      b, cc = prev[x], (prev[x - c] if x >= c else 0)
      pred = {0: 0, 1: a, 2: b, 3: (a + b) // 2}.get(f)
      if f == 4:
        p = a + b - cc
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - cc)
        pred = a if pa <= pb and pa <= pc else (b if pb <= pc else cc)
      row[x] = (int(line[x]) + pred) % 256
    out[y] = row
  return out.reshape(h, w, c).astype(np.uint8)


@pytest.mark.parametrize("channels", [1, 3])
def test_png_round_trip(tmp_path, channels):
  rng = np.random.default_rng(0)
  image = rng.integers(0, 256, size=(13, 7, channels), dtype=np.uint8)
  path = str(tmp_path / "sub" / "x.png")
  png.save_png(path, image)
  np.testing.assert_array_equal(read_png(path), image)
  mpl_image = pytest.importorskip("matplotlib.image")
  decoded = np.round(mpl_image.imread(path) * 255).astype(np.uint8)  # floats in [0, 1]
  np.testing.assert_array_equal(decoded.reshape(image.shape), image)
  assert [f for f in os.listdir(tmp_path / "sub")] == ["x.png"]  # no temporary file left


def test_float_images_map_minus_one_one_to_0_255(tmp_path):
  image = np.array([[-1.0, 0.0, 1.0, 2.0, -3.0]], np.float32)
  png.save_png(str(tmp_path / "f.png"), image)
  assert read_png(str(tmp_path / "f.png"))[0, :, 0].tolist() == [0, 128, 255, 255, 0]


def test_grid_places_each_tile():
  images = np.stack([np.full((2, 3), 10 * (i + 1), np.uint8) for i in range(5)])
  grid = png.image_grid(images, rows=2, pad=1, pad_value=7)
  assert grid.shape == (2 * 3 - 1, 3 * 4 - 1, 1)
  assert grid[0, 0, 0] == 10 and grid[0, 4, 0] == 20 and grid[0, 8, 0] == 30
  assert grid[3, 0, 0] == 40 and grid[3, 4, 0] == 50 and grid[3, 8, 0] == 7  # empty last tile
  assert (grid[2, :, 0] == 7).all() and (grid[:, 3, 0] == 7).all()


def test_batch_is_tiled_when_saved(tmp_path):
  images = np.random.default_rng(1).integers(0, 256, size=(4, 5, 6, 3), dtype=np.uint8)
  png.save_png(str(tmp_path / "b.png"), images)
  np.testing.assert_array_equal(read_png(str(tmp_path / "b.png")), png.image_grid(images, rows=2))


def test_bad_shapes_name_the_problem(tmp_path):
  with pytest.raises(ValueError, match="image_grid first"):
    png.encode_png(np.zeros((4, 4, 2), np.uint8))
  with pytest.raises(ValueError, match="rows=3"):
    png.image_grid(np.zeros((2, 4, 4), np.uint8), rows=3)
