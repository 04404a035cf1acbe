"""Local text corpora: a file or glob of text files, and the offline default corpus.

The offline default is the Python standard library's own source files (about 12 MB without its
tests): a real corpus present on every machine that runs lpjax, so the first run needs no download.

Examples:
  >>> import tempfile, os
  >>> d = tempfile.mkdtemp()
  >>> for i in range(4):
  ...   _ = open(os.path.join(d, f"f{i}.txt"), "w").write("hello world " * 50)
  >>> ds = text_dataset(os.path.join(d, "*.txt"), "byte", cache_root=d)
  >>> ds.vocab_size, len(ds.train_tokens) + len(ds.eval_tokens)
  (257, 2404)
"""

from __future__ import annotations

import glob
import hashlib
import os
import sys
import sysconfig
import zlib

import numpy as np

from lpjax.data import _cache as cache
from lpjax.data._token_stream import TokenStreamDataset
from lpjax.data._tokenizers import get_tokenizer

# Directories of the standard library left out of the offline corpus (tests, vendored packages).
_STDLIB_EXCLUDE = ("test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__")


def stdlib_source_files() -> list[str]:
  """The .py files of this Python's standard library (the embedded offline corpus), sorted."""
  root = sysconfig.get_paths()["stdlib"]
  files = []
  for path in glob.glob(os.path.join(root, "**", "*.py"), recursive=True):
    parts = os.path.relpath(path, root).split(os.sep)
    if not any(p in _STDLIB_EXCLUDE for p in parts[:-1]):
      files.append(path)
  return sorted(files, key=lambda p: os.path.relpath(p, root))


def _is_eval_file(relpath: str, eval_percent: int) -> bool:
  """Deterministic split by file: a stable hash of the relative path."""
  return zlib.crc32(relpath.encode()) % 100 < eval_percent


def read_text(path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
  """The text of file `path`. Strict by default: a byte sequence that is not valid `encoding`
  raises a ValueError naming the file and its byte offset (a binary or Latin-1 file must not
  train as replacement characters without a word); `errors` is `bytes.decode`'s choice for
  users who mean it ('replace', 'ignore', ...)."""
  with open(path, "rb") as f:
    raw = f.read()
  try:
    return raw.decode(encoding, errors)
  except UnicodeDecodeError as e:
    bad = raw[e.start:e.start + 4].hex(" ")
    raise ValueError(
        f"{path} is not valid {encoding}: {e.reason} at byte offset {e.start} (bytes {bad}). "
        f"Convert the file to {encoding}, set data.encoding to the file's encoding (e.g. "
        "'latin-1'), or set data.encoding_errors='replace' to train on it with the undecodable "
        "bytes replaced.") from None


def _tokenize_files(files, root, tokenizer, eval_percent, encoding="utf-8", errors="strict"):
  dtype = cache.smallest_uint(tokenizer.vocab_size)
  parts = {"train": [], "validation": []}
  single = len(files) == 1
  for path in files:
    ids = np.append(tokenizer.encode(read_text(path, encoding, errors)),
                    tokenizer.eos_id).astype(dtype)
    if single:  # one file: its last eval_percent of tokens is the validation split
      cut = len(ids) - max(len(ids) * eval_percent // 100, 1)
      parts["train"].append(ids[:cut])
      parts["validation"].append(ids[cut:])
    else:
      split = "validation" if _is_eval_file(os.path.relpath(path, root), eval_percent) else "train"
      parts[split].append(ids)
  if not parts["validation"] and parts["train"]:  # guarantee a non-empty eval split
    parts["validation"].append(parts["train"].pop())
  return {k: np.concatenate(v) if v else np.zeros((0,), dtype) for k, v in parts.items()}


_EDGE_BYTES = 1 << 16  # the head and tail of each file that go into the cache key


def file_signature(path: str) -> str:
  """size, mtime in ns and a hash of the first and last 64 KiB: a file rewritten in place
  (even with the same size within the same second) gets another signature."""
  st = os.stat(path)
  h = hashlib.sha256()
  with open(path, "rb") as f:
    h.update(f.read(_EDGE_BYTES))
    if st.st_size > _EDGE_BYTES:
      f.seek(max(st.st_size - _EDGE_BYTES, _EDGE_BYTES))
      h.update(f.read())
  return f"{st.st_size}|{st.st_mtime_ns}|{h.hexdigest()[:16]}"


def _fingerprint(files, tokenizer_name: str, eval_percent: int, decoding: str = "") -> str:
  """The cache key of tokenizing `files`: their paths and signatures, the tokenizer (its file's
  signature too, for SentencePiece), the eval split and the decoding ("" for the embedded corpus,
  whose keys predate it)."""
  h = hashlib.sha256(f"{tokenizer_name}|{eval_percent}{decoding}".encode())
  if tokenizer_name.startswith("spm:") and os.path.isfile(tokenizer_name[4:]):
    h.update(file_signature(tokenizer_name[4:]).encode())
  for path in files:
    h.update(f"{path}|{file_signature(path)}".encode())
  return h.hexdigest()[:16]


def text_files(pattern: str) -> list[str]:
  """The files `pattern` (a file or a glob, `~` expanded) names, sorted; FileNotFoundError with the
  fix when there are none (a folder is named as such)."""
  path = os.path.expanduser(pattern)
  files = sorted(f for f in glob.glob(path, recursive=True) if os.path.isfile(f))
  if files:
    return files
  if os.path.isdir(path):
    raise FileNotFoundError(f"data.path {pattern!r} is a folder; give a file or a glob of its "
                            f"text files, e.g. {os.path.join(pattern, '**', '*.txt')!r}.")
  raise FileNotFoundError(f"No text files match {pattern!r}; set data.path to a file or a glob "
                          "such as 'corpus/*.txt'.")


def text_dataset(pattern: str, tokenizer: str = "byte", *, eval_percent: int = 3,
                 cache_root: str | None = None, name: str | None = None, encoding: str = "utf-8",
                 errors: str = "strict") -> TokenStreamDataset:
  """A TokenStreamDataset from a text file or glob, tokenized once into the cache.

  The files are decoded with `encoding` and `errors` (`read_text`: strict UTF-8 by default, so a
  file that is not UTF-8 is an error naming its byte offset).
  """
  files = text_files(pattern)
  tok = get_tokenizer(tokenizer)
  root = os.path.commonpath([os.path.dirname(f) for f in files])
  # The decoding is part of the key: caches of the old replace-by-default decoding are not reused.
  key = f"text-{_fingerprint(files, tok.name, eval_percent, f'|{encoding}|{errors}')}"
  splits = cache.cached_splits(
      cache.cache_dir(cache_root), key,
      lambda: _tokenize_files(files, root, tok, eval_percent, encoding, errors))
  return TokenStreamDataset(splits["train"], splits["validation"], vocab_size=tok.vocab_size,
                            name=name or pattern)


def embedded_dataset(tokenizer: str = "byte", *, eval_percent: int = 3,
                     cache_root: str | None = None) -> TokenStreamDataset:
  """The offline default: this Python's standard library source, split by file."""
  files = stdlib_source_files()
  if not files:
    raise FileNotFoundError("Found no Python standard library sources for the embedded corpus; "
                            "use data.source='text' with data.path pointing at text files.")
  tok = get_tokenizer(tokenizer)
  root = sysconfig.get_paths()["stdlib"]
  version = "py{}.{}".format(*sys.version_info[:2])
  key = f"stdlib-{version}-{_fingerprint(files, tok.name, eval_percent)}"
  splits = cache.cached_splits(cache.cache_dir(cache_root), key,
                               lambda: _tokenize_files(files, root, tok, eval_percent))
  return TokenStreamDataset(splits["train"], splits["validation"], vocab_size=tok.vocab_size,
                            name=f"{version}-stdlib")
