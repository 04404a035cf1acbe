"""TFDS text datasets through tf.data, for datasets prepared in TFDS's default (tfrecord) format.

Needs TensorFlow, an optional extra: `pip install -e '.[tf]'` (or `make venv-tf`). Datasets
prepared as array_record need no TensorFlow and resume instantly (`lpjax.data._tfds_text`); this
reader serves the common case of a dataset already built with plain `tfds build c4/en`.

The stream of one process: its even slice of the split (`tfds.even_splits`), files and examples
shuffled with the run's seed, repeated, tokenized, and packed into rows of `row_len + 1` tokens
(documents separated by EOS; a row continues where the previous one ended, so no token is
dropped). Batch `step` is the step-th group of `batch_size / process_count` rows of that stream:
a pure function of (seed, step, process_index, process_count). A sequence-length curriculum takes
the first `seq_len + 1` tokens of each row, so the stream position never depends on it.

Batches are made in order. Asking for a step behind the stream (a resumed run, or a second
consumer) rebuilds the stream and reads forward to it: resuming at step s re-reads s batches
(logged). Steps asked for ahead of the stream are made and kept until asked for.

Examples (skipped by the doctest run, which has no TensorFlow; tests/data/test_tfds_text_tf.py
runs the same under `make test-tf`):
  >>> import tensorflow_datasets as tfds                      # doctest: +SKIP
  >>> import tensorflow_datasets.text.c4                      # doctest: +SKIP
  >>> with tfds.testing.mock_data(num_examples=8):            # doctest: +SKIP
  ...   ds = tfds_text_tf_dataset("c4/en", "byte", row_len=16)
  ...   ds.train_batch(0, 2, 16, seed=0)["inputs"].shape
  (2, 16)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import threading
import time

import numpy as np

from lpjax.data._token_stream import _split, process_rows
from lpjax.data._tokenizers import get_tokenizer

log = logging.getLogger("lpjax.data")

SHUFFLE_BUFFER = 10_000  # documents held by tf.data's shuffle
TF_INSTALL_HINT = "pip install -e '.[tf]'  (or: make venv-tf)"


def tensorflow_available() -> bool:
  return importlib.util.find_spec("tensorflow") is not None


@dataclasses.dataclass
class _Stream:
  """One process's packed-row stream for one (seed, local batch) and the batches made ahead."""
  documents: object  # numpy iterator over document texts
  next_step: int = 0
  buffer: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))
  ready: dict = dataclasses.field(default_factory=dict)  # step -> rows made ahead


class TfDataTextDataset:
  """Rows packed from a shuffled, repeated tf.data stream of a TFDS text split (one per process)."""

  def __init__(self, name: str, tokenizer, *, row_len: int, data_dir: str | None,
               train_split: str, eval_split: str, text_key: str, num_eval_examples: int):
    if row_len <= 0:
      raise ValueError(f"row_len must be positive (the run's seq_len), got {row_len}.")
    self.name = name
    self.tokenizer = tokenizer
    self.vocab_size = tokenizer.vocab_size
    self.row_len = row_len
    self.data_dir = data_dir
    self.train_split = train_split
    self.eval_split = eval_split
    self.text_key = text_key
    self.num_eval_examples = num_eval_examples
    self._streams: dict = {}
    self._lock = threading.Lock()

  # --- the tf.data side ---------------------------------------------------------------------

  def _documents(self, split: str, seed: int | None, process_index: int, process_count: int):
    import tensorflow as tf
    import tensorflow_datasets as tfds

    if process_count > 1:
      split = tfds.even_splits(split, n=process_count, drop_remainder=True)[process_index]
    shuffle = seed is not None
    read_config = tfds.ReadConfig(shuffle_seed=seed if shuffle else None)
    ds = tfds.load(self.name, split=split, data_dir=self.data_dir, download=False,
                   shuffle_files=shuffle, read_config=read_config)
    key = self.text_key
    ds = ds.map(lambda example: example[key], num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True)
    if shuffle:
      ds = ds.shuffle(SHUFFLE_BUFFER, seed=seed, reshuffle_each_iteration=True)
    return ds.repeat().prefetch(tf.data.AUTOTUNE).as_numpy_iterator()

  # --- packing ------------------------------------------------------------------------------

  def _tokens(self, text) -> np.ndarray:
    if isinstance(text, bytes):
      text = text.decode("utf-8", errors="replace")
    return np.append(self.tokenizer.encode(str(text)), self.tokenizer.eos_id).astype(np.int32)

  def _next_rows(self, stream: _Stream, rows: int) -> np.ndarray:
    need = rows * (self.row_len + 1)
    pieces, have = [stream.buffer], len(stream.buffer)
    while have < need:
      doc = self._tokens(next(stream.documents))
      pieces.append(doc)
      have += len(doc)
    tokens = np.concatenate(pieces)
    stream.buffer = tokens[need:]
    return tokens[:need].reshape(rows, self.row_len + 1)

  def _rows_at(self, key, step: int, rows: int, make_stream) -> np.ndarray:
    """The rows of `step` of the stream `key`, made in order (thread-safe)."""
    with self._lock:
      stream = self._streams.get(key)
      if stream is None or (step < stream.next_step and step not in stream.ready):
        if step > 0:
          log.info("tf.data stream of %s: reading forward to step %d (re-reads the %d batches "
                   "before it; array_record data resumes without this).", self.name, step, step)
        start = time.time()
        stream = self._streams[key] = _Stream(make_stream())
        if step > 0:
          while stream.next_step < step:
            self._next_rows(stream, rows)
            stream.next_step += 1
          log.info("Reached step %d of the tf.data stream in %.1f s.", step, time.time() - start)
      while stream.next_step <= step:
        stream.ready[stream.next_step] = self._next_rows(stream, rows)
        stream.next_step += 1
      for stale in [s for s in stream.ready if s < step - 64]:  # never asked for: drop
        del stream.ready[stale]
      return stream.ready.pop(step)

  # --- the dataset interface (as TokenStreamDataset) ----------------------------------------

  def _check_len(self, seq_len: int):
    if seq_len > self.row_len:
      raise ValueError(f"seq_len {seq_len} exceeds the rows of this tf.data stream "
                       f"({self.row_len} tokens); build the dataset with row_len >= seq_len.")

  def train_batch(self, step, batch_size, seq_len, seed, process_index=0, process_count=1):
    self._check_len(seq_len)
    rows = len(process_rows(batch_size, process_index, process_count))
    key = ("train", seed, rows, process_index, process_count)
    windows = self._rows_at(key, int(step), rows, lambda: self._documents(
        self.train_split, seed, process_index, process_count))
    return _split(windows[:, :seq_len + 1])

  def num_eval_batches(self, batch_size, seq_len):
    return max(self.num_eval_examples // batch_size, 1)

  def eval_batch(self, index, batch_size, seq_len, process_index=0, process_count=1):
    """The index-th batch of the validation split read in order (wraps around)."""
    self._check_len(seq_len)
    rows = len(process_rows(batch_size, process_index, process_count))
    key = ("eval", rows, process_index, process_count)
    windows = self._rows_at(key, int(index), rows, lambda: self._documents(
        self.eval_split, None, process_index, process_count))
    return _split(windows[:, :seq_len + 1])


def tfds_text_tf_dataset(name: str, tokenizer: str = "byte", *, row_len: int,
                         data_dir: str | None = None, train_split: str = "train",
                         eval_split: str = "validation", text_key: str = "text",
                         builder=None) -> TfDataTextDataset:
  """A TFDS text dataset read through tf.data (TensorFlow required); rows of row_len + 1 tokens."""
  if not tensorflow_available():
    raise ImportError(f"Reading TFDS dataset {name!r} through tf.data needs TensorFlow, which is "
                      f"not installed. Install the optional extra:\n    {TF_INSTALL_HINT}\nor "
                      "prepare the dataset as array_record (no TensorFlow needed):\n    "
                      f"tfds build {name} --file_format=array_record")
  import tensorflow_datasets as tfds

  if builder is None:
    from lpjax.data._tfds_builders import text_builder
    builder = text_builder(name, data_dir)
  try:  # fail here, not at the first batch
    tfds.load(name, split=train_split, data_dir=data_dir, download=False)
  except Exception as e:
    dir_flag = f" --data_dir={data_dir}" if data_dir else ""
    raise FileNotFoundError(f"TFDS dataset {name!r} (split {train_split!r}) is not prepared "
                            f"({type(e).__name__}: {e}). Prepare it once with:\n    "
                            f"tfds build {name}{dir_flag}") from e
  if row_len <= 0:
    raise ValueError("The tf.data reader packs rows of a fixed length: pass row_len (make_dataset's "
                     "seq_len: the run's longest sequence length).")
  splits = getattr(builder.info, "splits", {}) or {}
  num_eval = splits[eval_split].num_examples if eval_split in splits else 0
  return TfDataTextDataset(name, get_tokenizer(tokenizer), row_len=row_len, data_dir=data_dir,
                           train_split=train_split, eval_split=eval_split, text_key=text_key,
                           num_eval_examples=num_eval)
