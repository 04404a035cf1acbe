"""Finding a TFDS builder by name, including catalogue builders registered only on import.

Examples:
  >>> tfds_builder("no_such_dataset_xyz", None, ("text",), "'c4/en'")
  Traceback (most recent call last):
  ...
  ValueError: TFDS dataset 'no_such_dataset_xyz' is unknown (...). Check data.tfds_name, e.g. 'c4/en'.
"""

from __future__ import annotations

import importlib


def tfds_builder(name: str, data_dir: str | None, packages: tuple[str, ...], example: str):
  """tfds.builder(name); on failure imports tensorflow_datasets.<package>.<name> for each package
  (catalogue builders register on import) and retries; else a ValueError naming `example`."""
  import tensorflow_datasets as tfds

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
