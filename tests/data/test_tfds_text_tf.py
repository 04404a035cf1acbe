"""The tf.data reader of TFDS text (lpjax/data/_tfds_text_tf.py).

Most tests need TensorFlow, an optional extra that CI does not install; they run with
`make test-tf` (a separate venv with the extra). The errors for a missing TensorFlow run in CI.
"""

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from lpjax import data  # noqa: E402
from lpjax.data import _tfds_text_tf as tfds_text_tf  # noqa: E402

needs_tf = pytest.mark.skipif(not tfds_text_tf.tensorflow_available(),
                              reason="TensorFlow is not installed (optional extra: make test-tf)")


@pytest.fixture
def c4_mock():
  import tensorflow_datasets.text.c4  # noqa: F401  (registers the builder)
  with tfds.testing.mock_data(num_examples=24, policy=tfds.testing.MockPolicy.USE_CODE):
    yield


def _make(row_len=16):
  return data.make_dataset("tfds", tfds_name="c4/en", tokenizer="byte", tfds_reader="tf_data",
                           seq_len=row_len)


def test_without_tensorflow_the_error_names_the_extra(monkeypatch, tmp_path):
  monkeypatch.setattr(tfds_text_tf, "tensorflow_available", lambda: False)
  with pytest.raises(ImportError, match=r"(?s)needs TensorFlow.*pip install -e '\.\[tf\]'"):
    data.make_dataset("tfds", tfds_name="c4/en", tfds_data_dir=str(tmp_path),
                      tfds_reader="tf_data", seq_len=16)
  # auto: an unprepared dataset names both ways out
  with pytest.raises(FileNotFoundError, match=r"(?s)--file_format=array_record.*\.\[tf\]"):
    data.make_dataset("tfds", tfds_name="c4/en", tfds_data_dir=str(tmp_path), seq_len=16)


def test_unknown_reader_is_named():
  with pytest.raises(ValueError, match="auto, data_source, tf_data"):
    data.make_dataset("tfds", tfds_name="c4/en", tfds_reader="grain")


@needs_tf
def test_unprepared_dataset_names_the_build_command(tmp_path):
  with pytest.raises(FileNotFoundError, match=f"tfds build c4/en --data_dir={tmp_path}"):
    data.make_dataset("tfds", tfds_name="c4/en", tfds_data_dir=str(tmp_path),
                      tfds_reader="tf_data", seq_len=16)


@needs_tf
def test_batches_are_a_function_of_seed_and_step(c4_mock):
  a, b = _make(), _make()
  first = a.train_batch(3, 4, 16, seed=0)
  assert first["inputs"].shape == (4, 16) and first["inputs"].dtype == np.int32
  assert np.array_equal(first["inputs"][:, 1:], first["targets"][:, :-1])
  # a fresh dataset asked for step 3 directly (a resumed run) reads forward to the same rows
  assert np.array_equal(b.train_batch(3, 4, 16, seed=0)["inputs"], first["inputs"])
  # an earlier step after a later one rebuilds the stream: steps 0..3 in order match
  in_order = [a.train_batch(s, 4, 16, seed=0)["inputs"] for s in range(4)]
  assert np.array_equal(in_order[3], first["inputs"])
  assert not np.array_equal(in_order[2], in_order[3])
  assert not np.array_equal(_make().train_batch(3, 4, 16, seed=1)["inputs"], first["inputs"])


@needs_tf
def test_rows_pack_whole_documents_separated_by_eos(c4_mock):
  """Concatenated in order, the rows are the documents' bytes, each followed by EOS (256)."""
  import tensorflow_datasets as tfds_mod

  texts = {bytes(e["text"]) for e in tfds_mod.load("c4/en", split="train").as_numpy_iterator()}
  ds = _make(row_len=31)
  rows = [ds.train_batch(s, 2, 31, seed=5) for s in range(12)]
  stream = np.concatenate([np.concatenate([b["inputs"][r], b["targets"][r][-1:]])
                           for b in rows for r in range(2)])
  eos = np.flatnonzero(stream == 256)
  assert len(eos) >= 3
  whole = [bytes(stream[i + 1:j].astype(np.uint8)) for i, j in zip(eos[:-1], eos[1:])]
  assert all(doc in texts for doc in whole), whole[:3]
  assert bytes(stream[:eos[0]].astype(np.uint8)) in texts  # the stream starts with a document


def _documents_of(rows):
  """The whole documents (between two EOS) in a batch's rows, decoded."""
  docs = []
  for r in range(rows["inputs"].shape[0]):
    row = np.concatenate([rows["inputs"][r], rows["targets"][r][-1:]])
    eos = np.flatnonzero(row == 256)
    docs += [bytes(row[i + 1:j].astype(np.uint8)).decode() for i, j in zip(eos[:-1], eos[1:])]
  return docs


@pytest.fixture
def tiny_tfrecord_corpus(tmp_path):
  """A real TFDS dataset in the default tfrecord format: 40 + 8 short, distinct documents."""
  import tensorflow as tf

  def split(n, prefix):
    texts = [f"{prefix} document {i:02d}." for i in range(n)]
    return tf.data.Dataset.from_tensor_slices({"text": texts})

  builder = tfds.dataset_builders.TfDataBuilder(
      name="lpjax_tiny_text", version="1.0.0", data_dir=str(tmp_path),
      split_datasets={"train": split(40, "train"), "validation": split(8, "eval")},
      features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))
  builder.download_and_prepare()
  return str(tmp_path)


@needs_tf
def test_processes_read_disjoint_halves_of_a_tfrecord_dataset(tiny_tfrecord_corpus):
  ds = data.make_dataset("tfds", tfds_name="lpjax_tiny_text", tfds_data_dir=tiny_tfrecord_corpus,
                         seq_len=63)  # auto: not array_record, TensorFlow present -> tf.data
  assert type(ds).__name__ == "TfDataTextDataset"
  seen = []
  for process in (0, 1):
    docs = set()
    for step in range(10):
      docs |= set(_documents_of(ds.train_batch(step, 4, 63, seed=0, process_index=process,
                                               process_count=2)))
    seen.append({int(d.split()[-1].rstrip(".")) for d in docs if d.startswith("train")})
  # tfds.even_splits: each process reads its own 20 of the 40 documents (their order on disk is
  # TFDS's shuffle at preparation), and after a few epochs it has read all 20
  assert not seen[0] & seen[1], seen
  assert len(seen[0]) == len(seen[1]) == 20 and seen[0] | seen[1] == set(range(40)), seen
  assert all(d.startswith("eval") for d in _documents_of(ds.eval_batch(0, 4, 63)))


@needs_tf
def test_a_curriculum_truncates_rows_without_moving_the_stream(c4_mock):
  full, short = _make(), _make()
  for step in range(3):
    long_rows = full.train_batch(step, 2, 16, seed=0)
    short_rows = short.train_batch(step, 2, 8, seed=0)
    assert np.array_equal(short_rows["inputs"], long_rows["inputs"][:, :8])
  with pytest.raises(ValueError, match="exceeds the rows"):
    full.train_batch(3, 2, 17, seed=0)


@needs_tf
def test_eval_batches_are_fixed(c4_mock):
  ds = _make()
  a = ds.eval_batch(1, 2, 16)
  assert np.array_equal(_make().eval_batch(1, 2, 16)["inputs"], a["inputs"])
  assert ds.num_eval_batches(2, 16) >= 1


@needs_tf
def test_trainer_reads_c4_through_tf_data(c4_mock, tmp_path):
  from config_helpers import small
  from lpjax.train.loop._trainer import Trainer

  c = small(steps=2, **{"data.source": "tfds", "data.tfds_name": "c4/en",
                        "data.tfds_reader": "tf_data", "data.prefetch": 2})
  results = Trainer(c, str(tmp_path)).run()
  assert results["steps"] == 2 and np.isfinite(results["final_eval_loss"])
