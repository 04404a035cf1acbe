"""The tokenizer.json lpjax writes for its byte tokenizer (lpjax.models._hf_tokenizer): read by an
independent implementation of what Hugging Face `tokenizers` does with it (a ByteLevel
pre-tokenizer, then a BPE model without merges), it encodes every text as lpjax.data's
ByteTokenizer does; where transformers is installed (requirements-interop.txt), its AutoTokenizer
loads the files and does the same."""

import json

import numpy as np
import pytest

from lpjax.data import ByteTokenizer
from lpjax.models._hf_tokenizer import byte_tokenizer_files

TEXTS = ["hello world", "  leading spaces and\ttabs\n", "héllo wörld — ✓ 日本語 🙂", "a\x00b\x7f",
         "".join(chr(c) for c in range(0x20, 0x300))]


def _gpt2_byte_chars() -> dict[int, str]:
  """GPT-2's encoder.py table, as its paper code writes it: the bytes '!'..'~', '¡'..'¬',
  '®'..'ÿ' are their own characters; every other byte b, in order, is chr(2**8 + n)."""
  printable = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
  others = [b for b in range(256) if b not in printable]
  return {b: chr(b) if b in printable else chr(256 + others.index(b)) for b in range(256)}


def _encode_with(tokenizer_json: dict, text: str) -> list[int]:
  """tokenizers' pipeline for this file: no normalizer; the ByteLevel pre-tokenizer (use_regex
  off: the whole text is one word) maps each UTF-8 byte to its character; BPE without merges
  leaves each character a token, looked up in the vocabulary; no post-processor."""
  assert tokenizer_json["normalizer"] is None and tokenizer_json["post_processor"] is None
  pre = tokenizer_json["pre_tokenizer"]
  assert (pre["type"], pre["use_regex"], pre["add_prefix_space"]) == ("ByteLevel", False, False)
  model = tokenizer_json["model"]
  assert model["type"] == "BPE" and model["merges"] == []
  chars = _gpt2_byte_chars()
  return [model["vocab"][chars[b]] for b in text.encode("utf-8")]


def test_the_byte_tokenizer_file_encodes_as_lpjax():
  files = byte_tokenizer_files(256, max_length=64)
  t = json.loads(files["tokenizer.json"])
  assert sorted(t["model"]["vocab"].values()) == list(range(256))  # every byte, once
  assert t["added_tokens"] == [{"id": 256, "content": "</s>", "single_word": False,
                                "lstrip": False, "rstrip": False, "normalized": False,
                                "special": True}]
  config = json.loads(files["tokenizer_config.json"])
  assert (config["eos_token"], config["model_max_length"]) == ("</s>", 64)
  for text in TEXTS:
    assert _encode_with(t, text) == ByteTokenizer().encode(text).tolist(), text


def test_transformers_autotokenizer_loads_it_and_encodes_as_lpjax(tmp_path):
  transformers = pytest.importorskip("transformers")
  for name, content in byte_tokenizer_files(256, max_length=64).items():
    (tmp_path / name).write_text(content, encoding="utf-8")
  tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  assert (tok.eos_token_id, len(tok)) == (256, 257)
  for text in TEXTS:
    ids = tok.encode(text)
    assert ids == ByteTokenizer().encode(text).tolist(), text
    assert tok.decode(ids) == text
  assert tok.decode(np.array([104, 105, 256]), skip_special_tokens=True) == "hi"
