"""TFDS text datasets (c4/en or any text dataset) through `tfds.data_source` (array_record).

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


import numpy as np

from lpjax.data.tfds_builders import tfds_builder
from lpjax.data.token_stream import _split, process_rows, row_rng
from lpjax.data.tokenizers import get_tokenizer


def _builder(name: str, data_dir: str | None):
  return tfds_builder(name, data_dir, ("text", "datasets", "image_classification", "structured"),
                      "'c4/en' or 'wikipedia/20230601.en'")


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


def tfds_text_dataset(name: str, tokenizer: str = "byte", *, data_dir: str | None = None,
                      train_split: str = "train", eval_split: str = "validation",
                      text_key: str = "text") -> TfdsTextDataset:
  """A TFDS text dataset prepared as array_record, read with tfds.data_source."""
  import tensorflow_datasets as tfds

  _builder(name, data_dir)  # a clear error for unknown names; registers catalogue builders
  try:
    train = tfds.data_source(name, split=train_split, data_dir=data_dir, download=False)
    evaluation = tfds.data_source(name, split=eval_split, data_dir=data_dir, download=False)
  except Exception as e:
    raise FileNotFoundError(f"TFDS dataset {name!r} (splits {train_split!r}, {eval_split!r}) is not "
                            f"prepared as array_record ({type(e).__name__}: {e}). Prepare it once "
                            f"with:\n    {_prepare_hint(name, data_dir)}") from e
  return TfdsTextDataset(train, evaluation, get_tokenizer(tokenizer), text_key=text_key, name=name)
