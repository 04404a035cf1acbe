"""Tokenizer files beside an exported checkpoint: the imported checkpoint's, copied, or for
lpjax's byte tokenizer a `tokenizer.json` that Hugging Face's `tokenizers` (and so transformers'
`AutoTokenizer`) loads and that encodes as lpjax does.

lpjax's byte tokenizer (lpjax.data.ByteTokenizer) gives a text's UTF-8 bytes as ids 0..255 and
ends each document with id 256. The file is a byte-level BPE without merges: the `ByteLevel`
pre-tokenizer maps each byte b to GPT-2's printable character for b (`bytes_to_unicode`), the
vocabulary maps that character to id b, and with no merge every byte stays its own token; id 256
is the special token "</s>" (end of document, and the separator a next document starts after, so
also its beginning of sequence). No post-processor: encoding adds no token, as lpjax's encode.

Examples:
  >>> import json
  >>> files = byte_tokenizer_files()
  >>> sorted(files)
  ['special_tokens_map.json', 'tokenizer.json', 'tokenizer_config.json']
  >>> t = json.loads(files["tokenizer.json"])
  >>> vocab = t["model"]["vocab"]
  >>> [vocab[bytes_to_unicode()[b]] for b in "hé".encode()], t["added_tokens"][0]["id"]
  ([104, 195, 169], 256)
"""

from __future__ import annotations

import json
import os

# the files of a Hugging Face checkpoint directory that are not weights or config.json: copied
# from an imported checkpoint into the run's workdir and on into its exports
TOKENIZER_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "tokenizer.model", "added_tokens.json",
                   "vocab.json", "merges.txt", "chat_template.jinja")
EOS = "</s>"


def bytes_to_unicode() -> dict[int, str]:
  """GPT-2's byte -> printable character table (the `ByteLevel` pre-tokenizer's): printable
  Latin-1 bytes map to themselves, the other 68 to characters from U+0100 on, in byte order."""
  keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
  table, extra = {}, 0
  for b in range(256):
    if b in keep:
      table[b] = chr(b)
    else:
      table[b] = chr(256 + extra)
      extra += 1
  return table


def byte_tokenizer_files(eos_id: int = 256, max_length: int | None = None) -> dict[str, str]:
  """{file name: text} of lpjax's byte tokenizer for transformers (`max_length`: the
  tokenizer's model_max_length, e.g. max_position_embeddings)."""
  byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                "use_regex": False}
  special = {"id": eos_id, "content": EOS, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True}
  tokenizer = {
      "version": "1.0", "truncation": None, "padding": None, "added_tokens": [special],
      "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None,
      "decoder": byte_level,
      "model": {"type": "BPE", "dropout": None, "unk_token": None,
                "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
                "byte_fallback": False, "ignore_merges": False,
                "vocab": {c: b for b, c in bytes_to_unicode().items()}, "merges": []}}
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOS, "eos_token": EOS,
            "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
            "added_tokens_decoder": {str(eos_id): {k: v for k, v in special.items() if k != "id"}}}
  if max_length:
    config["model_max_length"] = int(max_length)
  dump = lambda d: json.dumps(d, indent=2, ensure_ascii=False)
  return {"tokenizer.json": dump(tokenizer), "tokenizer_config.json": dump(config),
          "special_tokens_map.json": dump({"bos_token": EOS, "eos_token": EOS})}


def tokenizer_files_in(path: str) -> dict[str, bytes]:
  """{name: bytes} of the TOKENIZER_FILES present in directory `path`."""
  out = {}
  for name in TOKENIZER_FILES:
    file = os.path.join(path, name)
    if os.path.isfile(file):
      with open(file, "rb") as f:
        out[name] = f.read()
  return out
