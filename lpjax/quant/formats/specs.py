"""Element, scale and block formats: the definitions of docs/numerics.md §1-3 as data.

Examples:
  >>> from lpjax.quant.formats import specs as formats
  >>> fmt = formats.get_format("mxfp4")
  >>> fmt.element.name, fmt.scale, fmt.block_size
  ('e2m1', 'e8m0', 32)
  >>> formats.get_format(formats.QuantFormat(element="e2m1", scale="ue4m3", block_size=32)).bits_per_element
  4.25
"""

from __future__ import annotations

import dataclasses
import difflib

import numpy as np

# Float32 facts used throughout (IEEE binary32).
F32_MANT_BITS = 23
F32_EMIN = -126  # exponent of the smallest normal
FLT_MAX = float(np.finfo(np.float32).max)


def _lookup(name, table, what):
  if name in table:
    return table[name]
  close = difflib.get_close_matches(str(name), list(table), n=1)
  hint = f" Did you mean {close[0]!r}?" if close else ""
  raise ValueError(f"Unknown {what} {name!r}.{hint} Valid: {', '.join(table)}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ElementFormat:
  """A scalar element format (docs/numerics.md §1)."""

  name: str
  kind: str  # "float" (sign-magnitude minifloat), "int" (two's complement, symmetric), "uint", "lut"
  bits: int  # storage width of one code, sign included
  mbits: int = 0  # float: mantissa bits
  emin: int = 0  # float: unbiased exponent of the smallest normal (= 1 - bias)
  emax: int = 0  # float: unbiased exponent of the largest normal (OCP's emax_elem)
  max_value: float = 0.0  # largest finite magnitude (float: max normal; int: qmax)
  max_magnitude_code: int = 0  # the magnitude code (sign bit off) of max_value
  nan_code: int | None = None  # the code ml_dtypes uses for NaN, if the format has one

  @property
  def sign_bit(self) -> int:
    return 1 << (self.bits - 1)

  @property
  def is_packed(self) -> bool:
    """4-bit codes are stored two per byte."""
    return self.bits == 4


def _float(name, ebits, mbits, max_value, max_code, nan_code=None):
  bias = (1 << (ebits - 1)) - 1
  emax = int(np.floor(np.log2(max_value)))
  return ElementFormat(name=name, kind="float", bits=1 + ebits + mbits, mbits=mbits,
                       emin=1 - bias, emax=emax, max_value=max_value,
                       max_magnitude_code=max_code, nan_code=nan_code)


ELEMENT_FORMATS: dict[str, ElementFormat] = {
    "e2m1": _float("e2m1", 2, 1, 6.0, 0x7),
    "e2m3": _float("e2m3", 2, 3, 7.5, 0x1F),
    "e3m2": _float("e3m2", 3, 2, 28.0, 0x1F),
    "e4m3": _float("e4m3", 4, 3, 448.0, 0x7E, nan_code=0x7F),  # "fn": S.1111.111 is NaN
    "e5m2": _float("e5m2", 5, 2, 57344.0, 0x7B, nan_code=0x7F),  # 0x7C is Inf
    "int8": ElementFormat(name="int8", kind="int", bits=8, max_value=127.0, max_magnitude_code=127),
    "int4": ElementFormat(name="int4", kind="int", bits=4, max_value=7.0, max_magnitude_code=7),
    "uint4": ElementFormat(name="uint4", kind="uint", bits=4, max_value=15.0, max_magnitude_code=15),
    "nf4": ElementFormat(name="nf4", kind="lut", bits=4, max_value=1.0, max_magnitude_code=15),
}

SCALE_FORMATS = ("e8m0", "ue4m3", "fp32")
GRANULARITIES = ("block", "channel", "tensor")
ROUNDING_MODES = ("nearest_even", "nearest_away", "toward_zero", "toward_positive",
                  "toward_negative", "stochastic")
E8M0_SCALE_MODES = ("floor", "ceil", "even", "rceil")

# The 16 NF4 levels of QLoRA (Dettmers et al. 2023, arXiv 2305.14314), index = code.
NF4_GRID = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=np.float32)


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantFormat:
  """A complete quantization format: element x scale x scaling granularity.

  Example: ``QuantFormat(element="e2m1", scale="ue4m3", block_size=32)`` is FP4 with E4M3 block
  scales at 32 (the E4M3-vs-E8M0 scale ablation).
  """

  element: str | ElementFormat  # element format name (ELEMENT_FORMATS) or an ElementFormat
  scale: str = "e8m0"  # "e8m0" (power of two), "ue4m3" (NVFP4-style), or "fp32"
  block_size: int | None = 32  # elements per block along the blocked axis ("block" granularity)
  granularity: str = "block"  # "block", "channel" (the whole blocked axis) or "tensor"
  tile: bool = False  # True: block_size x block_size tiles over the last two axes (Q(W)^T == Q(W^T))
  tensor_scale: bool = False  # ue4m3 only: fp32 second-level per-tensor scale from amax_t (NVFP4)
  fixed_scale_exponent: int | None = None  # e8m0 per tensor only: scale 2**k whatever the data
  name: str = ""  # preset name, for printing

  def __post_init__(self):
    if isinstance(self.element, str):
      object.__setattr__(self, "element", _lookup(self.element, ELEMENT_FORMATS, "element format"))
    if self.scale not in SCALE_FORMATS:
      raise ValueError(f"Unknown scale format {self.scale!r}; valid: {', '.join(SCALE_FORMATS)}.")
    if self.granularity not in GRANULARITIES:
      raise ValueError(f"Unknown granularity {self.granularity!r}; valid: {', '.join(GRANULARITIES)}.")
    if self.granularity == "block" and (not isinstance(self.block_size, int) or self.block_size < 1):
      raise ValueError(f"block_size must be a positive int for block granularity, got {self.block_size!r}.")
    if self.tile and self.granularity != "block":
      raise ValueError("tile=True needs granularity='block' (square tiles of block_size).")
    if self.scale == "e8m0" and self.element.kind != "float":
      raise ValueError(f"e8m0 scales need a float element format, not {self.element.name}.")
    if self.scale == "ue4m3" and self.element.kind != "float":
      raise ValueError(f"ue4m3 scales need a float element format, not {self.element.name}.")
    if self.element.kind in ("uint", "lut", "int") and self.scale != "fp32":
      raise ValueError(f"{self.element.name} elements need scale='fp32'.")
    if self.tensor_scale and self.scale != "ue4m3":
      raise ValueError("tensor_scale=True is the NVFP4 second level and needs scale='ue4m3'.")
    if self.fixed_scale_exponent is not None:
      k = self.fixed_scale_exponent
      if (self.scale != "e8m0" or self.granularity != "tensor" or isinstance(k, bool)
          or not isinstance(k, int) or not -127 <= k <= 127):
        raise ValueError(f"fixed_scale_exponent (a scale 2**k that ignores the data) needs "
                         f"scale='e8m0', granularity='tensor' and an int k in [-127, 127]; got "
                         f"k={k!r}, scale={self.scale!r}, granularity={self.granularity!r}.")

  @property
  def bits_per_element(self) -> float:
    """Storage bits per element, counting one block scale per block (not the tensor scale)."""
    scale_bits = 8 if self.scale in ("e8m0", "ue4m3") else 32
    if self.granularity != "block":
      return float(self.element.bits)
    per_block = self.block_size * self.block_size if self.tile else self.block_size
    return self.element.bits + scale_bits / per_block

  def __str__(self):
    return self.name or repr(self)


def _preset(name, element, scale, block_size=32, **kw):
  return QuantFormat(element=element, scale=scale, block_size=block_size, name=name, **kw)


PRESETS: dict[str, QuantFormat] = {f.name: f for f in [
    _preset("mxfp4", "e2m1", "e8m0"),
    _preset("mxfp6_e2m3", "e2m3", "e8m0"),
    _preset("mxfp6_e3m2", "e3m2", "e8m0"),
    _preset("mxfp8_e4m3", "e4m3", "e8m0"),
    _preset("mxfp8_e5m2", "e5m2", "e8m0"),
    _preset("nvfp4", "e2m1", "ue4m3", 16, tensor_scale=True),
    _preset("nvfp4_16x16", "e2m1", "ue4m3", 16, tile=True, tensor_scale=True),
    _preset("fp8_e4m3", "e4m3", "fp32", None, granularity="tensor"),
    _preset("fp8_e5m2", "e5m2", "fp32", None, granularity="tensor"),
    _preset("int8_channel", "int8", "fp32", None, granularity="channel"),
    _preset("int4_channel", "int4", "fp32", None, granularity="channel"),
    _preset("int8_g128", "int8", "fp32", 128),
    _preset("int4_g128", "int4", "fp32", 128),
    _preset("uint4_g128", "uint4", "fp32", 128),
    _preset("nf4", "nf4", "fp32", 64),
]}
FORMAT_NAMES = tuple(PRESETS)


def get_format(fmt: str | QuantFormat) -> QuantFormat:
  """Returns the QuantFormat for a preset name (FORMAT_NAMES) or passes a QuantFormat through."""
  if isinstance(fmt, QuantFormat):
    return fmt
  if not isinstance(fmt, str):
    raise TypeError(f"fmt must be a format name or a QuantFormat, got {type(fmt).__name__}.")
  return _lookup(fmt, PRESETS, "format")


def check_rounding(rounding: str) -> str:
  if rounding not in ROUNDING_MODES:
    _lookup(rounding, dict.fromkeys(ROUNDING_MODES), "rounding mode")
  return rounding


def check_scale_mode(fmt: QuantFormat, scale_mode: str | None) -> str | None:
  """Validates scale_mode against the format's scale format; returns the effective mode."""
  if fmt.scale == "e8m0":
    if scale_mode is None:
      return "floor"
    _lookup(scale_mode, dict.fromkeys(E8M0_SCALE_MODES), "e8m0 scale mode")
    return scale_mode
  if scale_mode is not None:
    raise ValueError(f"scale_mode={scale_mode!r} applies to e8m0 scales only ({', '.join(E8M0_SCALE_MODES)}); "
                     f"format {fmt} has {fmt.scale} scales: pass scale_mode=None.")
  return None
