"""Image operations in numpy on float32 (H, W, C) images: bilinear resizing and augmentations.

Examples:
  >>> import numpy as np
  >>> x = np.arange(16, dtype=np.float32).reshape(4, 4, 1)
  >>> np.round(resize_bilinear(x, 2, 2)[..., 0].astype(float), 3).tolist()   # antialiased 2x shrink
  [[3.571, 5.143], [9.857, 11.429]]
  >>> rng = np.random.default_rng(0)
  >>> pad_crop(x, 1, rng).shape, random_resized_crop(x, 3, rng).shape, resize_center_crop(x, 2).shape
  ((4, 4, 1), (3, 3, 1), (2, 2, 1))
"""

from __future__ import annotations

import functools
import math

import numpy as np

IMAGENET_EVAL_RATIO = 256 / 224  # eval: shorter side resized to image_size * 1.14, then center crop


@functools.lru_cache(maxsize=256)
def _linear_weights(n_in: int, n_out: int) -> np.ndarray:
  """(n_out, n_in) bilinear interpolation weights: half-pixel centres, triangle filter widened by
  the shrink factor when downsampling (antialiasing), rows normalized to sum 1."""
  scale = n_out / n_in
  width = max(1.0 / scale, 1.0)
  centres = (np.arange(n_out) + 0.5) / scale - 0.5
  w = np.maximum(0.0, 1.0 - np.abs(centres[:, None] - np.arange(n_in)[None, :]) / width)
  return (w / w.sum(axis=1, keepdims=True)).astype(np.float32)


def resize_bilinear(images: np.ndarray, height: int, width: int) -> np.ndarray:
  """Bilinear resize of (..., H, W, C) images to (..., height, width, C), float32.

  Same definition as `jax.image.resize(method="linear", antialias=True)`: output pixel i samples
  the input at (i + 0.5) * H / height - 0.5 with a triangle filter, widened when shrinking.

  Examples:
    >>> x = np.array([[0.0, 1.0]], np.float32)[..., None]    # 1x2, one channel
    >>> resize_bilinear(x, 1, 4)[0, :, 0].tolist()
    [0.0, 0.25, 0.75, 1.0]
  """
  x = np.asarray(images, np.float32)
  h, w = x.shape[-3], x.shape[-2]
  if (h, w) != (height, width):
    x = np.einsum("oh,...hwc->...owc", _linear_weights(h, height), x, optimize=True)
    x = np.einsum("pw,...owc->...opc", _linear_weights(w, width), x, optimize=True)
  return x


def pad_crop(image, pad: int, rng, fill: float = -1.0):
  """A random crop of the image's size out of the image padded by `pad` pixels of `fill`."""
  h, w = image.shape[:2]
  padded = np.pad(image, ((pad, pad), (pad, pad), (0, 0)), constant_values=fill)
  top, left = rng.integers(0, 2 * pad + 1, size=2)
  return padded[top:top + h, left:left + w]


def random_resized_crop(image, size: int, rng, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
  """Inception-style crop (torchvision's RandomResizedCrop): a random area and aspect ratio,
  10 tries, else a center crop clamped to `ratio`; resized to size x size."""
  h, w = image.shape[:2]
  for _ in range(10):
    area = h * w * rng.uniform(*scale)
    aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
    cw, ch = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
    if 0 < cw <= w and 0 < ch <= h:
      top, left = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
      return resize_bilinear(image[top:top + ch, left:left + cw], size, size)
  if w / h < ratio[0]:
    cw, ch = w, min(h, round(w / ratio[0]))
  elif w / h > ratio[1]:
    cw, ch = min(w, round(h * ratio[1])), h
  else:
    cw, ch = w, h
  return resize_bilinear(center_crop(image, ch, cw), size, size)


def center_crop(image, ch: int, cw: int):
  """The central ch x cw window."""
  h, w = image.shape[:2]
  top, left = (h - ch) // 2, (w - cw) // 2
  return image[top:top + ch, left:left + cw]


def resize_center_crop(image, size: int):
  """Shorter side to round(size * 256/224), then the central size x size."""
  h, w = image.shape[:2]
  short = max(round(size * IMAGENET_EVAL_RATIO), size)
  factor = short / min(h, w)
  image = resize_bilinear(image, max(round(h * factor), size), max(round(w * factor), size))
  return center_crop(image, size, size)


def random_flip(image, rng):
  """A horizontal flip with probability 1/2."""
  return image[:, ::-1] if rng.random() < 0.5 else image
