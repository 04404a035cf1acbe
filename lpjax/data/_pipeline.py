"""Dataset selection from a config and a prefetching batch iterator (grain).

Examples:
  >>> import numpy as np
  >>> from lpjax.data._token_stream import TokenStreamDataset
  >>> ds = TokenStreamDataset(np.arange(5000) % 11, np.arange(500) % 11, vocab_size=11)
  >>> it = batch_iterator(ds, start_step=5, batch_size=2, seq_len=4, seed=1)
  >>> step, batch = next(it)
  >>> step, bool((batch["inputs"] == ds.train_batch(5, 2, 4, 1)["inputs"]).all())
  (5, True)
"""

from __future__ import annotations

import itertools
from typing import Iterator

SOURCES = ("embedded", "text", "tfds")


def make_dataset(source: str = "embedded", *, path: str = "", tfds_name: str = "",
                 tokenizer: str = "byte", tfds_data_dir: str | None = None,
                 cache_dir: str | None = None, text_key: str = "text",
                 tfds_reader: str = "auto", seq_len: int = 0, encoding: str = "utf-8",
                 encoding_errors: str = "strict"):
  """The dataset named by a config's `data` section (`seq_len`: the tf.data reader's row length;
  `encoding`, `encoding_errors`: how source='text' decodes its files)."""
  if source == "embedded":
    from lpjax.data._text_files import embedded_dataset
    return embedded_dataset(tokenizer, cache_root=cache_dir)
  if source == "text":
    if not path:
      raise ValueError("data.source='text' needs data.path: a text file or a glob like 'docs/*.txt'.")
    from lpjax.data._text_files import text_dataset
    return text_dataset(path, tokenizer, cache_root=cache_dir, encoding=encoding,
                        errors=encoding_errors)
  if source == "tfds":
    if not tfds_name:
      raise ValueError("data.source='tfds' needs data.tfds_name, e.g. 'c4/en'.")
    from lpjax.data._tfds_text import tfds_text_dataset
    return tfds_text_dataset(tfds_name, tokenizer, data_dir=tfds_data_dir, text_key=text_key,
                             reader=tfds_reader, row_len=seq_len)
  raise ValueError(f"Unknown data.source {source!r}; valid: {', '.join(SOURCES)}.")


def batch_iterator(dataset, *, start_step: int, batch_size: int, seq_len: int, seed: int,
                   process_index: int = 0, process_count: int = 1, num_steps: int | None = None,
                   prefetch: int = 4, seq_len_at=None) -> Iterator[tuple[int, dict]]:
  """Yields (step, batch) from start_step on, computed ahead by grain threads.

  `seq_len_at(step)`, if given, overrides seq_len per step (a sequence-length curriculum).
  """
  def make(step):
    length = seq_len_at(step) if seq_len_at is not None else seq_len
    return dataset.train_batch(step, batch_size, length, seed, process_index, process_count)

  return step_iterator(make, start_step=start_step, num_steps=num_steps, prefetch=prefetch)


def step_iterator(make_batch, *, start_step: int, num_steps: int | None = None,
                  prefetch: int = 4) -> Iterator[tuple[int, dict]]:
  """Yields (step, make_batch(step)) from start_step on; grain threads compute `prefetch` ahead.

  `make_batch` must be a pure function of the step (so the order of computation does not matter).
  Without grain (a stock GPU image), standard-library threads prefetch instead: the same batches.
  """
  stop = start_step + (num_steps if num_steps is not None else 2**62)
  try:
    import grain
  except ImportError:
    return _threaded_steps(make_batch, range(start_step, stop), prefetch)
  ds = grain.MapDataset.range(start_step, stop).map(lambda step: (step, make_batch(step)))
  if prefetch <= 0:
    return iter(ds)
  return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=prefetch)))


def _threaded_steps(make_batch, steps, prefetch: int) -> Iterator[tuple[int, dict]]:
  """(step, make_batch(step)) in step order, `prefetch` computed ahead by two threads."""
  import collections
  import concurrent.futures

  steps = iter(steps)
  if prefetch <= 0:
    yield from ((step, make_batch(step)) for step in steps)
    return
  pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="lpjax-batches")
  try:
    pending = collections.deque((s, pool.submit(make_batch, s)) for s in itertools.islice(
        steps, prefetch))
    while pending:
      step, future = pending.popleft()
      for s in itertools.islice(steps, 1):
        pending.append((s, pool.submit(make_batch, s)))
      yield step, future.result()
  finally:  # a consumer that stops early leaves no batch computing behind it
    pool.shutdown(wait=False, cancel_futures=True)
