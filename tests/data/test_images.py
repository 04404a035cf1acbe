"""lpjax.data._images: digits (offline), TFDS image datasets (mocked), resizing, batch purity."""

import itertools

import numpy as np
import pytest

from lpjax.data import _image_ops as image_ops, _images as images
from lpjax.data._imagenet100 import IMAGENET100_WNIDS


def _rows(a):
  return {row.tobytes() for row in np.asarray(a)}


def _shifts(image, pad, fill=-1.0):
  """All pad-and-crop variants of an HWC image (the shifts by up to `pad` pixels)."""
  h, w = image.shape[:2]
  padded = np.pad(image, ((pad, pad), (pad, pad), (0, 0)), constant_values=fill)
  return [padded[t:t + h, l:l + w] for t, l in itertools.product(range(2 * pad + 1), repeat=2)]


# --- digits -----------------------------------------------------------------------------------


def test_digits_split_is_fixed_and_covers_the_dataset():
  from sklearn.datasets import load_digits

  ds = images.make_image_dataset("digits", augment=False)
  assert (ds.name, ds.num_classes, ds.image_shape) == ("digits", 10, (8, 8, 1))
  assert (ds.train_size, ds.eval_size) == (1437, 360)
  # Pixel values 0..16 map to p / 8 - 1, exactly.
  raw = load_digits()
  original = (raw.images.astype(np.float32) / 8 - 1)[..., None]
  test = [ds.eval_batch(i, 100) for i in range(ds.num_eval_batches(100))]
  test_x = np.concatenate([b["image"][b["mask"] > 0] for b in test])
  test_y = np.concatenate([b["label"][b["mask"] > 0] for b in test])
  # One epoch without augmentation visits each training image exactly once.
  train = [ds.train_batch(s, 479, seed=5) for s in range(3)]
  train_x = np.concatenate([b["image"] for b in train])
  train_y = np.concatenate([b["label"] for b in train])
  key = lambda x, y: {(xi.tobytes(), int(yi)) for xi, yi in zip(x, y)}
  everything = key(original, raw.target)
  assert len(key(train_x, train_y)) == 1437 and len(key(test_x, test_y)) == 360
  assert key(train_x, train_y) | key(test_x, test_y) <= everything
  assert not key(train_x, train_y) & key(test_x, test_y)
  # The split itself is a fixed part of the dataset's definition.
  assert test_y[:12].tolist() == [0, 5, 1, 6, 2, 2, 9, 9, 0, 5, 0, 8]
  assert np.bincount(test_y).tolist() == [40, 39, 30, 32, 32, 43, 37, 32, 38, 37]


def test_train_batches_are_a_pure_function_of_seed_and_step():
  a = images.digits_dataset().train_batch(7, 16, seed=3)
  b = images.digits_dataset().train_batch(7, 16, seed=3)  # a fresh object, same batch
  np.testing.assert_array_equal(a["image"], b["image"])
  np.testing.assert_array_equal(a["label"], b["label"])
  c = images.digits_dataset().train_batch(8, 16, seed=3)
  d = images.digits_dataset().train_batch(7, 16, seed=4)
  assert not np.array_equal(a["image"], c["image"]) and not np.array_equal(a["image"], d["image"])
  assert a["image"].dtype == np.float32 and a["label"].dtype == np.int32
  assert a["image"].min() >= -1 and a["image"].max() <= 1 and a["image"].max() > 0.9
  # Each process computes exactly its own, disjoint rows of the global batch.
  parts = [images.digits_dataset().train_batch(7, 16, seed=3, process_index=p, process_count=4)
           for p in range(4)]
  assert all(p["image"].shape == (4, 8, 8, 1) for p in parts)
  np.testing.assert_array_equal(np.concatenate([p["image"] for p in parts]), a["image"])
  np.testing.assert_array_equal(np.concatenate([p["label"] for p in parts]), a["label"])
  with pytest.raises(ValueError, match="not divisible"):
    images.digits_dataset().train_batch(0, 6, seed=0, process_count=4)


def test_digits_augmentation_shifts_by_at_most_one_pixel():
  plain = images.digits_dataset(augment=False).train_batch(2, 32, seed=1)
  aug = images.digits_dataset().train_batch(2, 32, seed=1)
  np.testing.assert_array_equal(plain["label"], aug["label"])  # same examples, same order
  moved = 0
  for x, y in zip(plain["image"], aug["image"]):
    assert any(np.array_equal(y, s) for s in _shifts(x, 1))
    moved += not np.array_equal(x, y)
  assert moved > 16  # 8 of 9 shifts move the image


def test_eval_batches_pad_and_mask_the_last_batch():
  ds = images.digits_dataset()
  assert ds.num_eval_batches(100) == 4 and ds.num_eval_batches(360) == 1
  last = ds.eval_batch(3, 100)
  assert last["mask"].tolist() == [1.0] * 60 + [0.0] * 40
  assert (last["image"][60:] == 0).all() and (last["label"][60:] == 0).all()
  again = images.digits_dataset().eval_batch(3, 100)
  np.testing.assert_array_equal(again["image"], last["image"])  # no augmentation, deterministic
  halves = [ds.eval_batch(3, 100, process_index=p, process_count=2) for p in (0, 1)]
  np.testing.assert_array_equal(np.concatenate([h["mask"] for h in halves]), last["mask"])
  np.testing.assert_array_equal(np.concatenate([h["image"] for h in halves]), last["image"])


def test_digits_resized_to_image_size():
  small, big = images.digits_dataset(), images.digits_dataset(image_size=16)
  assert big.image_shape == (16, 16, 1)
  b = big.eval_batch(0, 8)
  np.testing.assert_allclose(b["image"], image_ops.resize_bilinear(small.eval_batch(0, 8)["image"], 16, 16))
  assert big.train_batch(0, 8, seed=0)["image"].shape == (8, 16, 16, 1)


# --- bilinear resize --------------------------------------------------------------------------


def test_resize_bilinear_hand_computed():
  x = np.array([[0.0, 4.0], [8.0, 12.0]], np.float32)[..., None]
  up = image_ops.resize_bilinear(x, 4, 4)[..., 0]
  # Half-pixel centres: output i samples input (i + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25,
  # clamped at the borders; weights (1, .75/.25, .25/.75, 1).
  row = np.array([0.0, 1.0, 3.0, 4.0])
  np.testing.assert_allclose(up, np.array([0.0, 2.0, 6.0, 8.0])[:, None] + row[None, :], atol=1e-6)
  down = image_ops.resize_bilinear(np.arange(4, dtype=np.float32)[None, :, None], 1, 2)[0, :, 0]
  # Shrinking by 2 (antialiased): a triangle of half-width 2 centred at 0.5 and 2.5, so weights
  # (.75, .75, .25, 0) and (0, .25, .75, .75), each normalized by its sum 1.75.
  np.testing.assert_allclose(down, [(0 * .75 + 1 * .75 + 2 * .25) / 1.75,
                                    (1 * .25 + 2 * .75 + 3 * .75) / 1.75], atol=1e-6)


@pytest.mark.parametrize("shape,out", [((2, 7, 5, 3), (16, 12)), ((37, 23, 1), (9, 11)),
                                       ((10, 10, 2), (10, 4))])
def test_resize_bilinear_matches_jax_image_resize(shape, out):
  import jax
  import jax.numpy as jnp

  x = np.random.default_rng(0).uniform(-1, 1, size=shape).astype(np.float32)
  got = image_ops.resize_bilinear(x, *out)
  want = jax.image.resize(jnp.asarray(x), shape[:-3] + out + shape[-1:], "linear", antialias=True)
  np.testing.assert_allclose(got, np.asarray(want), atol=2e-6)


# --- TFDS (mocked) ----------------------------------------------------------------------------


@pytest.fixture
def tfds():
  return pytest.importorskip("tensorflow_datasets")


def test_cifar10_through_mock_data(tfds):
  import tensorflow_datasets.image_classification.cifar  # noqa: F401

  with tfds.testing.mock_data(num_examples=40, policy=tfds.testing.MockPolicy.USE_CODE):
    ds = images.make_image_dataset("tfds", tfds_name="cifar10")
    plain = images.make_image_dataset("tfds", tfds_name="cifar10", augment=False)
    records = tfds.data_source("cifar10", split="test")
    assert (ds.num_classes, ds.image_shape, ds.train_size, ds.eval_size) == (10, (32, 32, 3), 40, 40)
    a, b = ds.train_batch(3, 8, seed=0), ds.train_batch(3, 8, seed=0)
    np.testing.assert_array_equal(a["image"], b["image"])
    assert a["image"].min() >= -1 and a["image"].max() <= 1 and a["label"].max() < 10
    # Augmentation = a 4-pixel pad + crop, then maybe a horizontal flip.
    p = plain.train_batch(3, 8, seed=0)
    np.testing.assert_array_equal(p["label"], a["label"])
    flipped = 0
    for x, y in zip(p["image"], a["image"]):
      candidates = _shifts(x, 4)
      plain_match = any(np.array_equal(y, s) for s in candidates)
      flip_match = any(np.array_equal(y, s[:, ::-1]) for s in candidates)
      assert plain_match or flip_match
      flipped += flip_match and not plain_match
    assert flipped > 0
    # Eval rows are the test split in order, scaled to [-1, 1].
    e = ds.eval_batch(0, 4)
    for i in range(4):
      np.testing.assert_allclose(e["image"][i], records[i]["image"] / 127.5 - 1, atol=1e-6)
      assert e["label"][i] == records[i]["label"]


def test_imagenet100_subset_index_is_built_once(tfds, tmp_path, monkeypatch):
  import tensorflow_datasets.image_classification.imagenet  # noqa: F401

  names = tfds.builder("imagenet2012").info.features["label"].names
  assert set(IMAGENET100_WNIDS) <= set(names)  # the wnids are the TFDS label names
  new_label = {names.index(w): i for i, w in enumerate(sorted(IMAGENET100_WNIDS))}
  with tfds.testing.mock_data(num_examples=300, policy=tfds.testing.MockPolicy.USE_CODE):
    build = lambda: images.make_image_dataset("tfds", tfds_name="imagenet2012",
                                              classes="imagenet100", image_size=24,
                                              cache_dir=str(tmp_path))
    ds = build()
    records = tfds.data_source("imagenet2012", split="validation")
    expected = [(i, new_label[int(records[i]["label"])]) for i in range(len(records))
                if int(records[i]["label"]) in new_label]
    assert 10 < len(expected) < 100  # ~10% of the mocked records are ImageNet-100 classes
    assert ds.num_classes == 100 and ds.image_shape == (24, 24, 3)
    assert ds.eval_size == len(expected)
    e = ds.eval_batch(0, ds.eval_size)
    assert e["label"].tolist() == [label for _, label in expected]
    assert e["image"].shape == (ds.eval_size, 24, 24, 3) and (e["mask"] == 1).all()
    first = records[expected[0][0]]["image"] / 127.5 - 1
    np.testing.assert_allclose(e["image"][0], image_ops.resize_center_crop(first, 24), atol=1e-6)
    t = ds.train_batch(0, 8, seed=0)
    assert t["image"].shape == (8, 24, 24, 3) and t["image"].min() >= -1 and t["label"].max() < 100
    # The index is cached: a second dataset reads no labels.
    assert len(list((tmp_path / "image_index").glob("*.npy"))) == 2
    monkeypatch.setattr(images, "_read_labels", lambda *a: pytest.fail("rescanned the dataset"))
    again = build()
    np.testing.assert_array_equal(again.eval_batch(0, 8)["image"], ds.eval_batch(0, 8)["image"])


def test_random_resized_crop_keeps_shape_and_range():
  rng = np.random.default_rng(0)
  image = rng.uniform(-1, 1, size=(50, 20, 3)).astype(np.float32)
  for _ in range(5):
    out = image_ops.random_resized_crop(image, 16, rng)
    assert out.shape == (16, 16, 3) and out.min() >= -1 - 1e-6 and out.max() <= 1 + 1e-6
  assert image_ops.resize_center_crop(image, 16).shape == (16, 16, 3)


# --- errors -----------------------------------------------------------------------------------


def test_errors_name_the_fix(tfds, tmp_path):
  with pytest.raises(ValueError, match="valid: digits, tfds"):
    images.make_image_dataset("mnist")
  with pytest.raises(ValueError, match="needs data.tfds_name"):
    images.make_image_dataset("tfds")
  with pytest.raises(ValueError, match="leave it empty"):
    images.make_image_dataset("digits", classes="imagenet100")
  with pytest.raises(FileNotFoundError, match="tfds build cifar10 --file_format=array_record "
                                              f"--data_dir={tmp_path}"):
    images.make_image_dataset("tfds", tfds_name="cifar10", data_dir=str(tmp_path))
  import tensorflow_datasets.image_classification.cifar  # noqa: F401

  with tfds.testing.mock_data(num_examples=4, policy=tfds.testing.MockPolicy.USE_CODE):
    with pytest.raises(ValueError, match="not labels of 'cifar10'"):
      images.make_image_dataset("tfds", tfds_name="cifar10", classes="imagenet100",
                                cache_dir=str(tmp_path))
