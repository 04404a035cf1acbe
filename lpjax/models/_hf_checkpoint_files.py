"""Hugging Face checkpoint directories on disk: config.json and safetensors files, read and written.

A directory holds config.json and either one model.safetensors or shards that
model.safetensors.index.json names (`write_checkpoint` shards at `max_shard_bytes`). Reading
memory-maps one tensor at a time, and reads by hand a dtype numpy lacks (float8_e4m3fn scales).
Both use the `safetensors` package (`pip install safetensors`), imported only here.
`CheckpointError` is the error of a directory that does not hold the model it claims
(lpjax.models.hf_llama raises it too).

Examples:
  >>> import numpy as np, tempfile
  >>> d = tempfile.mkdtemp()
  >>> t = {"a.weight": np.ones((4, 8), np.float32), "b.weight": np.zeros((8,), np.float32)}
  >>> write_checkpoint(d, {"model_type": "llama"}, t, max_shard_bytes=64)  # 128 + 32 bytes: 2
  ['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors']
  >>> back = read_tensors(d)
  >>> sorted(back), back["a.weight"].shape
  (['a.weight', 'b.weight'], (4, 8))
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import ml_dtypes
import numpy as np

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
           "F8_E4M3": ml_dtypes.float8_e4m3fn, "U8": np.uint8, "I8": np.int8, "I16": np.int16,
           "I32": np.int32, "I64": np.int64, "BOOL": np.bool_}


class CheckpointError(ValueError):
  """A checkpoint directory that does not hold the model it claims (names every problem)."""


def _safetensors():
  try:
    import safetensors  # noqa: PLC0415 -- optional: only checkpoint import / export need it
    import safetensors.numpy  # noqa: PLC0415
  except ImportError as error:
    raise ImportError("Reading and writing Hugging Face checkpoints needs the safetensors package: "
                      "pip install safetensors==0.7.0 (it is in requirements.txt).") from error
  return safetensors


def read_tensors(path: str) -> dict[str, np.ndarray]:
  """Every tensor of a checkpoint directory: model.safetensors, or the shards that
  model.safetensors.index.json names (or every *.safetensors file when neither exists)."""
  st = _safetensors()
  if os.path.exists(os.path.join(path, INDEX)):
    with open(os.path.join(path, INDEX)) as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
  elif os.path.exists(os.path.join(path, SINGLE)):
    files = [SINGLE]
  else:
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
  if not files:
    raise CheckpointError(f"{path} holds no safetensors file ({SINGLE}, or shards named in "
                          f"{INDEX}).")
  missing = [name for name in files if not os.path.isfile(os.path.join(path, name))]
  if missing:
    raise CheckpointError(f"{path}: {INDEX} names {len(missing)} safetensors file(s) that are "
                          f"not there: {', '.join(missing)}; copy the whole checkpoint.")
  out = {}
  for name in files:
    file = os.path.join(path, name)
    try:  # memory-mapped, one tensor at a time
      with st.safe_open(file, framework="numpy") as f:
        out.update({key: f.get_tensor(key) for key in f.keys()})
    except (AttributeError, TypeError, KeyError):  # a dtype numpy lacks (FP8 scales): by hand
      out.update(_read_by_hand(st, file, name))
    except Exception as error:  # noqa: BLE001 -- safetensors' SafetensorError, an OSError
      raise CheckpointError(f"{file} is no readable safetensors file ({error}); copy it "
                            "again.") from None
  return out


def _read_by_hand(st, file: str, name: str) -> dict:
  """The tensors of one file, decoded here (a dtype numpy's safetensors reader lacks)."""
  out = {}
  with open(file, "rb") as f:
    for key, t in st.deserialize(f.read()):
      if t["dtype"] not in _DTYPES:
        raise CheckpointError(f"{name}: tensor {key} has dtype {t['dtype']}, which lpjax "
                              f"does not read ({', '.join(_DTYPES)}).") from None
      out[key] = np.frombuffer(bytes(t["data"]), _DTYPES[t["dtype"]]).reshape(t["shape"])
  return out


def write_checkpoint(path: str, config: dict, tensors: dict[str, np.ndarray],
                     max_shard_bytes: int | None = None, files: dict | None = None, *,
                     overwrite: bool = False) -> list[str]:
  """Writes config.json and the tensors (one model.safetensors, or shards of at most
  `max_shard_bytes` with model.safetensors.index.json), and `files` ({name: bytes or str}: the
  tokenizer's, generation_config.json); returns the safetensors file names.

  The directory is written whole beside `path` (a hidden temporary sibling) and renamed into
  place, so that an export never mixes with what `path` held before: a non-empty `path` is
  refused unless `overwrite`, and then replaced.
  """
  st = _safetensors()
  names = []
  write_directory(path, lambda tmp: names.extend(
      _write_into(st, tmp, config, tensors, max_shard_bytes, files)), overwrite=overwrite)
  return names


def write_directory(path: str, write, *, overwrite: bool = False) -> None:
  """Calls `write(tmp)` on a hidden temporary sibling of `path`, then renames it into place: a
  non-empty `path` is refused unless `overwrite`, and then replaced whole (never mixed)."""
  path = os.path.abspath(path)
  if os.path.exists(path) and not os.path.isdir(path):
    raise CheckpointError(f"{path} is a file; give a directory to write the checkpoint to.")
  if os.path.isdir(path) and os.listdir(path) and not overwrite:
    raise CheckpointError(f"{path} is not empty ({', '.join(sorted(os.listdir(path))[:4])}"
                          f"{', ...' if len(os.listdir(path)) > 4 else ''}); an export never "
                          "writes beside other files: give an empty or new directory, or "
                          "overwrite=True (python -m lpjax.export --overwrite) to replace it.")
  parent = os.path.dirname(path)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
  try:
    write(tmp)
    old = None
    if os.path.isdir(path) and os.listdir(path):
      old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.old-", dir=parent)
      os.rename(path, os.path.join(old, "checkpoint"))
    elif os.path.isdir(path):
      os.rmdir(path)
    os.rename(tmp, path)
    if old is not None:
      shutil.rmtree(old, ignore_errors=True)
  finally:
    if os.path.isdir(tmp):
      shutil.rmtree(tmp, ignore_errors=True)


def _write_into(st, path, config, tensors, max_shard_bytes, files) -> list[str]:
  for name, content in (files or {}).items():
    with open(os.path.join(path, name), "wb") as f:
      f.write(content.encode() if isinstance(content, str) else content)
  with open(os.path.join(path, CONFIG), "w") as f:
    json.dump(config, f, indent=2)
  shards, size = [{}], 0
  for key in sorted(tensors):
    n = tensors[key].nbytes
    if max_shard_bytes and shards[-1] and size + n > max_shard_bytes:
      shards.append({})
      size = 0
    # np.ascontiguousarray would make a 0-d array 1-d: a scalar stays a scalar
    t = np.asarray(tensors[key])
    shards[-1][key] = t if t.flags.c_contiguous else np.ascontiguousarray(t).reshape(t.shape)
    size += n
  if len(shards) == 1:
    names = [SINGLE]
  else:
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {k: name for name, shard in zip(names, shards) for k in shard}
    with open(os.path.join(path, INDEX), "w") as f:
      json.dump({"metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
                 "weight_map": weight_map}, f, indent=2)
  for name, shard in zip(names, shards):
    st.numpy.save_file(shard, os.path.join(path, name), metadata={"format": "pt"})
  return names
