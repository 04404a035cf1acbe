"""TFDS text datasets (c4/en or any text dataset) through `tfds.data_source` (array_record).

(Datasets prepared in TFDS's default tfrecord format are read through tf.data instead when
TensorFlow is installed: `tfds_text_dataset(..., reader="tf_data")`, lpjax/data/_tfds_text_tf.py.)

Random access makes batches a pure function of (seed, step, row): each row draws documents at
random (with replacement), tokenizes them and packs them, separated by EOS, into seq_len + 1
tokens. No TensorFlow is needed. Prepare the dataset once as array_record:

    tfds build c4/en --file_format=array_record --data_dir=$TFDS_DATA_DIR

Examples:
  >>> import tensorflow_datasets as tfds
  >>> import tensorflow_datasets.text.c4  # registers the builder
  >>> with tfds.testing.mock_data(num_examples=8, policy=tfds.testing.MockPolicy.USE_CODE):
  ...   ds = tfds_text_dataset("c4/en", "byte")
  ...   ds.train_batch(0, 2, 16, seed=0)["inputs"].shape
  (2, 16)
"""

from __future__ import annotations

import logging

import numpy as np

from lpjax.data._tfds_builders import array_record_hint, text_builder
from lpjax.data._token_stream import _split, process_rows, row_rng
from lpjax.data._tokenizers import get_tokenizer

log = logging.getLogger("lpjax.data")


def _prepare_hint(name: str, data_dir: str | None) -> str:
  dir_flag = f" --data_dir={data_dir}" if data_dir else ""
  return f"tfds build {name} --file_format=array_record{dir_flag}"


class TfdsTextDataset:
  """Rows packed from randomly drawn documents of a TFDS text split."""

  def __init__(self, train_source, eval_source, tokenizer, *, text_key: str, name: str):
    self.train_source = train_source
    self.eval_source = eval_source
    self.tokenizer = tokenizer
    self.vocab_size = tokenizer.vocab_size
    self.text_key = text_key
    self.name = name

  def _document(self, source, index: int) -> np.ndarray:
    record = source[int(index)]
    text = record[self.text_key]
    if isinstance(text, bytes):
      text = text.decode("utf-8", errors="replace")
    return np.append(self.tokenizer.encode(str(text)), self.tokenizer.eos_id)

  def _row(self, source, rng, seq_len: int) -> np.ndarray:
    pieces, total = [], 0
    while total < seq_len + 1:
      doc = self._document(source, rng.integers(0, len(source)))
      pieces.append(doc)
      total += len(doc)
    return np.concatenate(pieces)[:seq_len + 1].astype(np.int32)

  def train_batch(self, step, batch_size, seq_len, seed, process_index=0, process_count=1):
    rows = [self._row(self.train_source, row_rng(seed, step, r), seq_len)
            for r in process_rows(batch_size, process_index, process_count)]
    return _split(np.stack(rows))

  def num_eval_batches(self, batch_size, seq_len):
    return max(len(self.eval_source) // batch_size, 1)

  def eval_batch(self, index, batch_size, seq_len, process_index=0, process_count=1):
    rows = [self._row(self.eval_source, row_rng(0, index, r, stream=1), seq_len)
            for r in process_rows(batch_size, process_index, process_count)]
    return _split(np.stack(rows))


READERS = ("auto", "data_source", "tf_data")


def tfds_text_dataset(name: str, tokenizer: str = "byte", *, data_dir: str | None = None,
                      train_split: str = "train", eval_split: str = "validation",
                      text_key: str = "text", reader: str = "auto", row_len: int = 0):
  """A TFDS text dataset, read with `reader`:

  - "data_source": `tfds.data_source` over array_record (random access, no TensorFlow);
  - "tf_data": tf.data over the default tfrecord files (needs TensorFlow; `row_len` = the run's
    longest seq_len; see lpjax.data._tfds_text_tf);
  - "auto": array_record if prepared so, else tf.data if TensorFlow is installed.
  """
  if reader not in READERS:
    raise ValueError(f"data.tfds_reader {reader!r} is unknown; valid: {', '.join(READERS)}.")
  builder = text_builder(name, data_dir)  # a clear error for unknown names; registers catalogue builders
  if reader == "tf_data":
    return _tf_data(name, tokenizer, data_dir, train_split, eval_split, text_key, row_len, builder)
  try:
    return _data_source(name, tokenizer, data_dir, train_split, eval_split, text_key)
  except FileNotFoundError as array_record_error:
    from lpjax.data import _tfds_text_tf as tfds_text_tf
    if reader == "data_source" or not tfds_text_tf.tensorflow_available():
      if reader == "auto":
        raise FileNotFoundError(
            f"{array_record_error}\nOr, for a dataset prepared in TFDS's default tfrecord format, "
            f"install TensorFlow to read it through tf.data:\n    {tfds_text_tf.TF_INSTALL_HINT}"
        ) from array_record_error
      raise
    log.info("%s is not prepared as array_record; reading it through tf.data.", name)
    try:
      return _tf_data(name, tokenizer, data_dir, train_split, eval_split, text_key, row_len,
                      builder)
    except FileNotFoundError as tfrecord_error:
      raise FileNotFoundError(f"{array_record_error}\nNor is it prepared as tfrecord for tf.data "
                              f"({tfrecord_error}).") from tfrecord_error


def _tf_data(name, tokenizer, data_dir, train_split, eval_split, text_key, row_len, builder):
  from lpjax.data._tfds_text_tf import tfds_text_tf_dataset
  return tfds_text_tf_dataset(name, tokenizer, row_len=row_len, data_dir=data_dir,
                              train_split=train_split, eval_split=eval_split, text_key=text_key,
                              builder=builder)


def _data_source(name, tokenizer, data_dir, train_split, eval_split, text_key) -> TfdsTextDataset:
  """A TFDS text dataset prepared as array_record, read with tfds.data_source."""
  import tensorflow_datasets as tfds

  try:
    train = tfds.data_source(name, split=train_split, data_dir=data_dir, download=False)
    evaluation = tfds.data_source(name, split=eval_split, data_dir=data_dir, download=False)
  except Exception as e:
    raise FileNotFoundError(f"TFDS dataset {name!r} (splits {train_split!r}, {eval_split!r}) is not "
                            f"prepared as array_record ({type(e).__name__}: {e}). Prepare it once "
                            f"with:\n    {_prepare_hint(name, data_dir)}{array_record_hint()}") from e
  return TfdsTextDataset(train, evaluation, get_tokenizer(tokenizer), text_key=text_key, name=name)
