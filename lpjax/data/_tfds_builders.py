"""Finding a TFDS builder by name, including catalogue builders registered only on import.

Examples:
  >>> tfds_builder("no_such_dataset_xyz", None, ("text",), "'c4/en'")
  Traceback (most recent call last):
  ...
  ValueError: TFDS dataset 'no_such_dataset_xyz' is unknown (...). Check data.tfds_name, e.g. 'c4/en'.
"""

from __future__ import annotations

import importlib
import importlib.util


def tfds_builder(name: str, data_dir: str | None, packages: tuple[str, ...], example: str):
  """tfds.builder(name); on failure imports tensorflow_datasets.<package>.<name> for each package
  (catalogue builders register on import) and retries; else a ValueError naming `example`."""
  tfds = require_tfds()

  try:
    return tfds.builder(name, data_dir=data_dir)
  except Exception as first:
    base = name.split("/")[0].split(":")[0]
    for package in packages:
      try:
        importlib.import_module(f"tensorflow_datasets.{package}.{base}")
        return tfds.builder(name, data_dir=data_dir)
      except Exception:
        continue
    raise ValueError(f"TFDS dataset {name!r} is unknown ({first}). Check data.tfds_name, e.g. "
                     f"{example}.") from first


def text_builder(name: str, data_dir: str | None):
  """The TFDS builder of a text dataset (the readers of `_tfds_text` and `_tfds_text_tf` share it)."""
  return tfds_builder(name, data_dir, ("text", "datasets", "image_classification", "structured"),
                      "'c4/en' or 'wikipedia/20230601.en'")


# A stock CUDA JAX image has neither: only data.source='tfds' needs them (embedded / text do not).
TFDS_INSTALL_HINT = "pip install tensorflow-datasets array-record"


def require_tfds():
  """The tensorflow_datasets module, or a ModuleNotFoundError that names it and how to install it.

  Examples:
    >>> tfds = require_tfds()  # doctest: +SKIP
    >>> TFDS_INSTALL_HINT  # what the error tells a user whose environment lacks it
    'pip install tensorflow-datasets array-record'
  """
  try:
    import tensorflow_datasets as tfds
  except ImportError as e:
    raise ModuleNotFoundError(
        f"data.source='tfds' needs the tensorflow_datasets package (and array_record to read "
        f"array_record files), which is not installed here ({e}). Install them with:\n    "
        f"{TFDS_INSTALL_HINT}\nor train on data.source='embedded' or 'text', which need neither.",
        name="tensorflow_datasets") from e
  return tfds


def array_record_hint() -> str:
  """'' when array_record is importable, else a sentence saying how to install it."""
  if importlib.util.find_spec("array_record") is not None:
    return ""
  return f"\n(array_record, which reads these files, is not installed: {TFDS_INSTALL_HINT})"
