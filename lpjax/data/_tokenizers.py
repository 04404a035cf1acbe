"""Tokenizers: byte-level (no files needed) or SentencePiece from a model file (the papers use T5's).

Examples:
  >>> tok = ByteTokenizer()
  >>> ids = tok.encode("hi")
  >>> ids.tolist(), tok.vocab_size, tok.decode(ids)
  ([104, 105], 257, 'hi')
"""

from __future__ import annotations

import os

import numpy as np


class ByteTokenizer:
  """UTF-8 bytes as tokens 0..255, plus an end-of-document token 256."""

  vocab_size = 257
  eos_id = 256
  name = "byte"

  def encode(self, text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)

  def decode(self, ids) -> str:
    ids = [int(i) for i in np.asarray(ids).reshape(-1) if 0 <= int(i) < 256]
    return bytes(ids).decode("utf-8", errors="replace")


class SentencePieceTokenizer:
  """A SentencePiece model file (e.g. T5's spiece.model, vocab 32000)."""

  def __init__(self, model_path: str):
    if not os.path.isfile(model_path):
      raise FileNotFoundError(
          f"SentencePiece model file {model_path!r} does not exist. Set data.tokenizer to the path "
          "of a .model file (e.g. T5's spiece.model), or to 'byte' for byte-level tokens.")
    import sentencepiece  # imported here: only needed for this tokenizer

    self._sp = sentencepiece.SentencePieceProcessor(model_file=model_path)
    self.vocab_size = int(self._sp.get_piece_size())
    eos = int(self._sp.eos_id())
    self.eos_id = eos if eos >= 0 else self.vocab_size - 1
    self.name = f"spm:{os.path.abspath(model_path)}"

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._sp.encode(text), np.int32)

  def decode(self, ids) -> str:
    return self._sp.decode([int(i) for i in np.asarray(ids).reshape(-1)])


def get_tokenizer(spec: str):
  """'byte' -> ByteTokenizer; a path to a .model file -> SentencePieceTokenizer."""
  if spec in ("byte", "bytes", None, ""):
    return ByteTokenizer()
  return SentencePieceTokenizer(spec)
