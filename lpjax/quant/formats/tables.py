"""Decode tables: the value of every code of an element format (docs/numerics.md §1).

Derived from the format parameters (sign, exponent field, mantissa field), not from ml_dtypes;
the tests check them against ml_dtypes.

Examples:
  >>> decode_table("e2m1").tolist()
  [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
"""

from __future__ import annotations

import functools

import numpy as np

from lpjax.quant.formats import specs as formats


@functools.lru_cache(maxsize=None)
def _table(name: str) -> np.ndarray:
  element = formats.ELEMENT_FORMATS[name]
  codes = np.arange(1 << element.bits, dtype=np.int64)
  if element.kind == "int":
    return np.where(codes >= (1 << (element.bits - 1)), codes - (1 << element.bits), codes).astype(np.float32)
  if element.kind == "uint":
    return codes.astype(np.float32)
  if element.kind == "lut":
    return formats.NF4_GRID.copy()
  mb, ebits = element.mbits, element.bits - 1 - element.mbits
  sign = np.where(codes >> (element.bits - 1), -1.0, 1.0)
  efield = (codes >> mb) & ((1 << ebits) - 1)
  mant = codes & ((1 << mb) - 1)
  magnitude = np.where(efield == 0, mant * 2.0 ** (element.emin - mb),
                       (2**mb + mant) * 2.0 ** (efield + element.emin - 1 - mb))
  values = sign * magnitude
  if name == "e4m3":
    values = np.where((codes & 0x7F) == 0x7F, sign * np.nan, values)
  if name == "e5m2":
    values = np.where((codes & 0x7F) > 0x7C, sign * np.nan, values)
    values = np.where((codes & 0x7F) == 0x7C, sign * np.inf, values)
  return values.astype(np.float32)


def decode_table(element: str) -> np.ndarray:
  """float32 values of all 2**bits codes of `element` (a name of formats.ELEMENT_FORMATS)."""
  name = element.name if isinstance(element, formats.ElementFormat) else element
  if name not in formats.ELEMENT_FORMATS:
    raise ValueError(f"Unknown element format {name!r}; valid: {', '.join(formats.ELEMENT_FORMATS)}.")
  return _table(name).copy()


def decode_bits_table(element) -> np.ndarray:
  """uint32 float32 bit patterns of decode_table(element) (for exact integer arithmetic)."""
  return decode_table(element).view(np.uint32)
