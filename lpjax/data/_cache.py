"""An on-disk cache of tokenized splits: .npy files written atomically, read memory-mapped.

Examples:
  >>> import numpy as np, tempfile
  >>> d = tempfile.mkdtemp()
  >>> arrays = cached_splits(d, "demo", lambda: {"train": np.arange(5, dtype=np.uint16)})
  >>> arrays["train"].tolist()
  [0, 1, 2, 3, 4]
"""

from __future__ import annotations

import json
import logging
import os
import tempfile

import numpy as np

DEFAULT_CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "lpjax")


def cache_dir(configured: str | None = None) -> str:
  return configured or os.environ.get("LPJAX_CACHE_DIR") or DEFAULT_CACHE_DIR


def _atomic_save(path: str, array: np.ndarray):
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp.npy")
  with os.fdopen(fd, "wb") as f:
    np.save(f, array, allow_pickle=False)
  os.replace(tmp, path)  # readers see either nothing or the complete file


def cached_splits(root: str, key: str, build) -> dict[str, np.ndarray]:
  """Returns {split: tokens}, building them once with `build()` into root/key/.

  A directory is complete when its manifest.json exists (written last); a half-written cache from
  a crashed run, or a corrupt one, is rebuilt (with a warning).
  """
  directory = os.path.join(root, key)
  manifest = os.path.join(directory, "manifest.json")
  if os.path.exists(manifest):
    try:
      return _load(directory)
    except (OSError, ValueError) as e:
      logging.getLogger("lpjax.data").warning("The token cache %s is corrupt (%s); rebuilding it.",
                                              directory, e)
      os.remove(manifest)
  os.makedirs(directory, exist_ok=True)
  splits = build()
  for name, tokens in splits.items():
    _atomic_save(os.path.join(directory, f"{name}.npy"), np.asarray(tokens))
  info = {name: int(len(tokens)) for name, tokens in splits.items()}
  fd, tmp = tempfile.mkstemp(dir=directory, suffix=".json")
  with os.fdopen(fd, "w") as f:
    json.dump(info, f)
  os.replace(tmp, manifest)  # written last: its presence marks a complete cache
  return _load(directory)


def _load(directory):
  with open(os.path.join(directory, "manifest.json")) as f:
    names = json.load(f)
  arrays = {name: np.load(os.path.join(directory, f"{name}.npy"), mmap_mode="r", allow_pickle=False)
            for name in names}
  for name, length in names.items():
    if len(arrays[name]) != length:
      raise ValueError(f"{name}.npy holds {len(arrays[name])} tokens, the manifest says {length}")
  return arrays


def smallest_uint(vocab_size: int):
  return np.uint16 if vocab_size <= 2**16 else np.uint32
