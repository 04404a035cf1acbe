"""Fixed-length training windows from a token stream, as a pure function of (seed, step).

Every batch is computed from (seed, step, row) alone, so a resumed run sees exactly the batches it
would have seen, and each process computes only its own rows.

Examples:
  >>> import numpy as np
  >>> ds = TokenStreamDataset(np.arange(1000) % 7, np.arange(300) % 7, vocab_size=7)
  >>> b = ds.train_batch(step=3, batch_size=4, seq_len=8, seed=0)
  >>> b["inputs"].shape, bool((b["inputs"][:, 1:] == b["targets"][:, :-1]).all())
  ((4, 8), True)
  >>> bool((ds.train_batch(3, 4, 8, seed=0)["inputs"] == b["inputs"]).all())
  True
"""

from __future__ import annotations

import numpy as np


def row_rng(seed: int, step: int, row: int, stream: int = 0) -> np.random.Generator:
  """The random generator of one row of one step (Philox, keyed by all four numbers)."""
  return np.random.Generator(np.random.Philox(key=[seed % 2**64, stream],
                                              counter=[step, row, 0, 0]))


def process_rows(batch_size: int, process_index: int, process_count: int) -> range:
  if batch_size % process_count:
    raise ValueError(f"batch_size {batch_size} is not divisible by the {process_count} processes; "
                     "choose a batch size that is a multiple of the process count.")
  per = batch_size // process_count
  return range(process_index * per, (process_index + 1) * per)


class TokenStreamDataset:
  """Random windows of seq_len + 1 tokens of a training stream; sequential windows for eval."""

  def __init__(self, train_tokens, eval_tokens, *, vocab_size: int, name: str = "tokens"):
    self.train_tokens = train_tokens
    self.eval_tokens = eval_tokens
    self.vocab_size = vocab_size
    self.name = name

  def _check(self, tokens, seq_len, what):
    if len(tokens) < seq_len + 2:
      raise ValueError(f"The {what} split of {self.name} has {len(tokens)} tokens, fewer than one "
                       f"sequence of {seq_len + 1}; use a shorter seq_len or more data.")

  def train_batch(self, step: int, batch_size: int, seq_len: int, seed: int,
                  process_index: int = 0, process_count: int = 1) -> dict:
    self._check(self.train_tokens, seq_len, "train")
    rows = []
    for row in process_rows(batch_size, process_index, process_count):
      start = row_rng(seed, step, row).integers(0, len(self.train_tokens) - seq_len - 1)
      rows.append(np.asarray(self.train_tokens[start:start + seq_len + 1], np.int32))
    return _split(np.stack(rows))

  def num_eval_batches(self, batch_size: int, seq_len: int) -> int:
    return (len(self.eval_tokens) - 1) // (batch_size * seq_len)

  def eval_batch(self, index: int, batch_size: int, seq_len: int,
                 process_index: int = 0, process_count: int = 1) -> dict:
    """The index-th batch of consecutive, non-overlapping eval windows (wraps around)."""
    self._check(self.eval_tokens, seq_len, "eval")
    windows = (len(self.eval_tokens) - 1) // seq_len
    rows = []
    for row in process_rows(batch_size, process_index, process_count):
      w = (index * batch_size + row) % windows
      rows.append(np.asarray(self.eval_tokens[w * seq_len:w * seq_len + seq_len + 1], np.int32))
    return _split(np.stack(rows))


def _split(windows: np.ndarray) -> dict:
  return {"inputs": windows[:, :-1], "targets": windows[:, 1:]}
