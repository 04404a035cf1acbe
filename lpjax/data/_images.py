"""Image classification datasets as pure functions of (seed, step), numpy only on the host.

Sources (`make_image_dataset`):

* "digits": scikit-learn's 8x8 handwritten digits (1797 images, 10 classes, read from a file
  inside the scikit-learn wheel: no network). A fixed split of 1437 train / 360 test images;
  training batches shift each image by up to 1 pixel.
* "tfds": any TFDS image dataset with "image" (uint8 HWC) and "label" features, read with
  `tfds.data_source` (array_record, random access). Fixed-size images (cifar10, mnist) are
  augmented with a 4-pixel pad + random crop and (RGB only) a horizontal flip; variable-size
  images (imagenet2012) with a random-resized crop to `image_size` (default 224) and a flip, and
  evaluated after resizing the shorter side to image_size * 256/224 and a center crop (the
  numpy operations are in `lpjax.data._image_ops`).
  `classes="imagenet100"` (or a comma-separated list of label names) keeps a subset of classes,
  relabelled 0..k-1 in sorted name order; the matching record ids are found once and cached
  as .npy in `cache_dir` ($LPJAX_CACHE_DIR or ~/.cache/lpjax).

Every training epoch visits the training split in a permutation drawn from (seed, epoch); the
augmentation of a row is drawn from (seed, step, row), so a batch depends on (seed, step,
batch_size) only and each process computes only its own rows. Images come out float32 in
[-1, 1], (B, H, W, C).

Examples:
  >>> ds = make_image_dataset("digits")
  >>> ds.name, ds.num_classes, ds.image_shape, ds.train_size, ds.eval_size
  ('digits', 10, (8, 8, 1), 1437, 360)
  >>> b = ds.train_batch(step=3, batch_size=4, seed=0)
  >>> b["image"].shape, b["image"].dtype, b["label"].dtype
  ((4, 8, 8, 1), dtype('float32'), dtype('int32'))
  >>> bool((ds.train_batch(3, 4, seed=0)["image"] == b["image"]).all())
  True
  >>> e = ds.eval_batch(ds.num_eval_batches(100) - 1, 100)
  >>> int(e["mask"].sum())   # 360 = 3 * 100 + 60 real rows in the last batch
  60
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from typing import Callable

import numpy as np

from lpjax.data._cache import _atomic_save, cache_dir as default_cache_dir
from lpjax.data._image_ops import (pad_crop, random_flip, random_resized_crop, resize_bilinear,
                                  resize_center_crop)
from lpjax.data._imagenet100 import CLASS_SUBSETS
from lpjax.data._tfds_builders import array_record_hint, require_tfds, tfds_builder
from lpjax.data._token_stream import process_rows, row_rng

SOURCES = ("digits", "tfds")
DIGITS_TEST_SIZE = 360  # of 1797 images; the other 1437 train
_AUGMENT_STREAM, _ORDER_STREAM = 1, 2  # Philox streams (row_rng) of augmentation and epoch order


# --- the dataset ----------------------------------------------------------------------------------


class _Split:
  """n examples; read(i) -> (float32 HWC image in [-1, 1], int label)."""

  def __init__(self, n: int, read: Callable[[int], tuple[np.ndarray, int]]):
    self.n, self.read = n, read


class ImageDataset:
  """Train batches from (seed, step); eval batches in order, the last one padded and masked."""

  def __init__(self, *, name: str, num_classes: int, image_shape: tuple[int, int, int],
               train: _Split, evaluation: _Split, train_transform, eval_transform):
    self.name = name
    self.num_classes = num_classes
    self.image_shape = tuple(image_shape)  # (H, W, C) of the batches
    self._train, self._eval = train, evaluation
    self._train_transform, self._eval_transform = train_transform, eval_transform
    self._orders: dict[tuple[int, int], np.ndarray] = {}
    if train.n == 0 or evaluation.n == 0:
      raise ValueError(f"Image dataset {name!r} has an empty split (train {train.n}, eval "
                       f"{evaluation.n} examples); check the dataset and its class subset.")

  @property
  def train_size(self) -> int:
    return self._train.n

  @property
  def eval_size(self) -> int:
    return self._eval.n

  def _order(self, seed: int, epoch: int) -> np.ndarray:
    """The training split's permutation of one epoch (the last two are kept)."""
    order = self._orders.get((seed, epoch))
    if order is None:  # (prefetching threads may race here: they compute the same permutation)
      order = row_rng(seed, epoch, 0, stream=_ORDER_STREAM).permutation(self._train.n)
      kept = {k: v for k, v in self._orders.items() if k[1] >= epoch - 1}
      kept[(seed, epoch)] = order
      self._orders = kept
    return order

  def train_batch(self, step: int, batch_size: int, seed: int, process_index: int = 0,
                  process_count: int = 1) -> dict:
    """This process's rows of the global batch `step`: {"image" (b, H, W, C), "label" (b,)}."""
    images, labels = [], []
    for row in process_rows(batch_size, process_index, process_count):
      epoch, offset = divmod(step * batch_size + row, self._train.n)
      image, label = self._train.read(int(self._order(seed, epoch)[offset]))
      images.append(self._train_transform(image, row_rng(seed, step, row, stream=_AUGMENT_STREAM)))
      labels.append(label)
    return {"image": np.stack(images).astype(np.float32), "label": np.asarray(labels, np.int32)}

  def num_eval_batches(self, batch_size: int) -> int:
    return -(-self._eval.n // batch_size)

  def eval_batch(self, index: int, batch_size: int, process_index: int = 0,
                 process_count: int = 1) -> dict:
    """Examples index*batch_size ... of the eval split, unaugmented; "mask" is 0 on padding."""
    images, labels, mask = [], [], []
    for row in process_rows(batch_size, process_index, process_count):
      i = index * batch_size + row
      if i < self._eval.n:
        image, label = self._eval.read(i)
        images.append(self._eval_transform(image))
        labels.append(label)
        mask.append(1.0)
      else:
        images.append(np.zeros(self.image_shape, np.float32))
        labels.append(0)
        mask.append(0.0)
    return {"image": np.stack(images).astype(np.float32), "label": np.asarray(labels, np.int32),
            "mask": np.asarray(mask, np.float32)}


def _transforms(kind: str, size: tuple[int, int], augment: bool, flip: bool, pad: int):
  """(train_transform(image, rng), eval_transform(image)) of one augmentation kind."""
  if kind == "imagenet":
    evaluate = lambda image: resize_center_crop(image, size[0])
    train = lambda image, rng: random_flip(random_resized_crop(image, size[0], rng), rng)
  else:  # fixed-size images: pad + random crop (+ flip), then resize to `size` if it differs
    evaluate = lambda image: resize_bilinear(image, *size)
    train = lambda image, rng: resize_bilinear(
        random_flip(pad_crop(image, pad, rng), rng) if flip else pad_crop(image, pad, rng), *size)
  if not augment:
    return (lambda image, rng: evaluate(image)), evaluate
  return train, evaluate


# --- digits (offline) -----------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _digits_arrays():
  from sklearn.datasets import load_digits  # reads a file shipped in the wheel

  digits = load_digits()
  images = (digits.images.astype(np.float32) / 8.0 - 1.0)[..., None]  # 0..16 -> [-1, 1]
  labels = digits.target.astype(np.int32)
  order = row_rng(0, 0, 0, stream=0).permutation(len(labels))  # the fixed split
  return (images[order[DIGITS_TEST_SIZE:]], labels[order[DIGITS_TEST_SIZE:]],
          images[order[:DIGITS_TEST_SIZE]], labels[order[:DIGITS_TEST_SIZE]])


def _array_split(images, labels) -> _Split:
  return _Split(len(labels), lambda i: (images[i], int(labels[i])))


def digits_dataset(image_size: int = 0, augment: bool = True) -> ImageDataset:
  """scikit-learn's digits, 8x8 (or image_size x image_size, bilinear), grayscale."""
  train_x, train_y, test_x, test_y = _digits_arrays()
  size = (image_size or 8,) * 2
  train, evaluate = _transforms("small", size, augment, flip=False, pad=1)
  return ImageDataset(name="digits", num_classes=10, image_shape=size + (1,),
                      train=_array_split(train_x, train_y), evaluation=_array_split(test_x, test_y),
                      train_transform=train, eval_transform=evaluate)


# --- TFDS -----------------------------------------------------------------------------------------


def _image_builder(name: str, data_dir: str | None):
  return tfds_builder(name, data_dir, ("image_classification", "image", "datasets"),
                      "'cifar10' or 'imagenet2012'")


def _prepare_command(builder, data_dir: str | None) -> str:
  command = f"tfds build {builder.name} --file_format=array_record"
  if data_dir:
    command += f" --data_dir={data_dir}"
  if getattr(builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None):
    command += " --manual_dir=DIR  (DIR holds the manually downloaded archives; see `tfds build`)"
  return command


def _eval_split(builder) -> str:
  splits = set(builder.info.splits)  # empty while unprepared (or mocked)
  for split in ("validation", "test"):
    if split in splits:
      return split
  return "validation" if builder.name.startswith("imagenet") else "test"


def _read_labels(open_source, n: int) -> np.ndarray:
  """Every record's label; image decoding is skipped where the installed TFDS allows it."""
  import importlib.util

  import tensorflow_datasets as tfds

  source = None
  if importlib.util.find_spec("tensorflow") is not None:  # skipping needs TensorFlow
    try:
      source = open_source({"image": tfds.decode.SkipDecoding()})
      source[0]["label"]
    except Exception:
      source = None
  source = source if source is not None else open_source(None)
  labels = np.empty(n, np.int64)
  for i in range(n):
    labels[i] = int(source[i]["label"])
    if i and i % 100_000 == 0:
      logging.info("lpjax.data._images: read %d / %d labels", i, n)
  return labels


def _class_index(open_source, n: int, relabel: np.ndarray, path: str) -> np.ndarray:
  """(m, 2) [record id, new label] of the records whose label `relabel` keeps (>= 0), built
  once (a scan of every record) and cached at `path`."""
  if os.path.exists(path):
    try:
      return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
      raise OSError(f"The class index {path} is corrupt ({e}); delete it to rebuild it.") from e
  logging.info("lpjax.data._images: indexing %d records once into %s", n, path)
  new = relabel[_read_labels(open_source, n)]
  keep = np.nonzero(new >= 0)[0]
  index = np.stack([keep, new[keep]], axis=1).astype(np.int64)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  _atomic_save(path, index)
  return index


def _reader(source, index):
  """read(i) of a TFDS split: record i, or record index[i, 0] relabelled index[i, 1]."""
  def read(i: int):
    record_id, label = (i, None) if index is None else (int(index[i, 0]), int(index[i, 1]))
    example = source[record_id]
    image = np.asarray(example["image"], np.float32) / 127.5 - 1.0
    return image, int(example["label"]) if label is None else label
  return read


def _subset(classes: str, names: list[str], dataset: str) -> list[str]:
  wanted = list(CLASS_SUBSETS.get(classes) or [c.strip() for c in classes.split(",") if c.strip()])
  missing = [c for c in wanted if c not in names]
  if missing or len(set(wanted)) != len(wanted):
    raise ValueError(f"classes={classes!r}: {len(missing)} of the class names are not labels of "
                     f"{dataset!r} (e.g. {missing[:3]}) or a name repeats. Use one of "
                     f"{sorted(CLASS_SUBSETS)} or a comma-separated list of its label names.")
  return sorted(wanted)


def tfds_image_dataset(name: str, *, data_dir: str | None = None, image_size: int = 0,
                       classes: str = "", augment: bool = True,
                       cache_dir: str | None = None) -> ImageDataset:
  """A TFDS image dataset prepared as array_record (see the module docstring)."""
  tfds = require_tfds()  # names the package and its pip command where it is missing

  builder = _image_builder(name, data_dir)
  features = builder.info.features
  if "image" not in features or "label" not in features:
    raise ValueError(f"TFDS dataset {name!r} has features {sorted(features)}; image datasets "
                     "need 'image' and 'label'.")
  names = list(features["label"].names)
  h, w, c = features["image"].shape
  splits = ("train", _eval_split(builder))
  opener = lambda split: lambda decoders: tfds.data_source(
      name, split=split, data_dir=data_dir, download=False, decoders=decoders)
  try:
    sources = [opener(s)(None) for s in splits]
  except Exception as e:
    raise FileNotFoundError(f"TFDS dataset {name!r} (splits {splits}) is not prepared as "
                            f"array_record ({type(e).__name__}: {e}). Prepare it once with:\n    "
                            f"{_prepare_command(builder, data_dir)}{array_record_hint()}") from e

  split_objs, num_classes = [], len(names)
  if classes:
    kept = _subset(classes, names, name)
    num_classes = len(kept)
    relabel = np.full(len(names), -1, np.int64)
    relabel[[names.index(k) for k in kept]] = np.arange(len(kept))
    digest = hashlib.sha1(",".join(kept).encode()).hexdigest()[:12]
    tag = classes if classes in CLASS_SUBSETS else digest
    root = os.path.join(default_cache_dir(cache_dir), "image_index")
  for split, source in zip(splits, sources):
    index = None
    if classes:
      path = os.path.join(root, f"{builder.info.full_name.replace('/', '_')}_{split}_{tag}_"
                                f"{len(source)}.npy")
      index = _class_index(opener(split), len(source), relabel, path)
    split_objs.append(_Split(len(source) if index is None else len(index), _reader(source, index)))

  if h is None or w is None:  # variable-size images: ImageNet-style crops
    size, kind = (image_size or 224,) * 2, "imagenet"
  else:
    size, kind = ((image_size,) * 2 if image_size else (h, w)), "small"
  train, evaluate = _transforms(kind, size, augment, flip=c == 3, pad=4)
  label = name + (f"[{classes}]" if classes else "")
  return ImageDataset(name=label, num_classes=num_classes, image_shape=size + (c,),
                      train=split_objs[0], evaluation=split_objs[1], train_transform=train,
                      eval_transform=evaluate)


def make_image_dataset(source: str = "digits", *, tfds_name: str = "", data_dir: str | None = None,
                       image_size: int = 0, classes: str = "", augment: bool = True,
                       cache_dir: str | None = None) -> ImageDataset:
  """The image dataset named by a config's `data` section (`SOURCES`)."""
  if source == "digits":
    if classes:
      raise ValueError("data.classes selects a class subset of a TFDS dataset; leave it empty "
                       "for source='digits'.")
    return digits_dataset(image_size, augment)
  if source == "tfds":
    if not tfds_name:
      raise ValueError("data.source='tfds' needs data.tfds_name, e.g. 'cifar10' or 'imagenet2012'.")
    return tfds_image_dataset(tfds_name, data_dir=data_dir, image_size=image_size, classes=classes,
                              augment=augment, cache_dir=cache_dir)
  raise ValueError(f"Unknown image data source {source!r}; valid: {', '.join(SOURCES)}.")
