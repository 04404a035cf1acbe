"""The token cache follows the text: a corpus rewritten in place with the same size and the same
modification time is tokenized again, not served from the stale cache."""

import os

import numpy as np

from lpjax import data
from lpjax.data._text_files import file_signature


def _rewrite_keeping_size_and_mtime(path, text):
  st = os.stat(path)
  with open(path, "w") as f:
    f.write(text)
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
  assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns


def _tokens(dataset):
  return np.concatenate([np.asarray(dataset.train_tokens), np.asarray(dataset.eval_tokens)])


def test_a_corpus_rewritten_with_the_same_size_and_mtime_is_tokenized_again(tmp_path):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("aaaa bbbb\n" * 200)
  cache_root = str(tmp_path / "cache")
  first = _tokens(data.text_dataset(str(corpus), cache_root=cache_root))
  _rewrite_keeping_size_and_mtime(str(corpus), "cccc dddd\n" * 200)
  second = _tokens(data.text_dataset(str(corpus), cache_root=cache_root))
  assert ord("a") in first and ord("a") not in second  # the new text, not the cached tokens
  assert np.sum(second == ord("c")) == 800


def test_the_signature_sees_the_tail_of_a_large_file(tmp_path):
  path = tmp_path / "big.txt"
  path.write_bytes(b"x" * 300_000)
  before = file_signature(str(path))
  with open(path, "r+b") as f:  # one byte near the end, same size
    f.seek(299_990)
    f.write(b"y")
  st = os.stat(path)
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
  assert file_signature(str(path)) != before
