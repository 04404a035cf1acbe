"""GEMM recipes as data: which operand of which of a layer's three GEMMs gets which quantizer.

A linear layer Y = X W runs three GEMMs (docs/numerics.md §7), each with its own pair of operands:

| GEMM    | computes       | lhs | rhs | contraction (the blocked axis of both operands) |
|---------|----------------|-----|-----|--------------------------------------------------|
| `fwd`   | Y = X W        | X   | W   | input features K                                 |
| `dgrad` | dX = dY W^T    | dY  | W   | output features N                                |
| `wgrad` | dW = X^T dY    | X   | dY  | tokens M (every batch/sequence position)         |

A `GemmRecipe` holds one `GemmQuant(lhs=..., rhs=...)` per GEMM; each operand is an
`OperandQuant` (format, rounding, scale rule, Hadamard block, SR pre-scale), `None` (high
precision), or `REUSE_FWD` (backward operands only: reuse the forward GEMM's fake-quantized
X or W, i.e. autodiff through fake quantization with a straight-through estimator, as the
Stable-SPAM paper's code does).

Examples:
  >>> from lpjax.quant.recipes.gemm_recipe import GemmQuant, GemmRecipe, OperandQuant
  >>> rtn = OperandQuant("mxfp4")
  >>> sr = OperandQuant("mxfp4", rounding="stochastic", scale_mode="rceil", hadamard_block=32,
  ...                   sr_prescale=0.75)
  >>> r = GemmRecipe(fwd=GemmQuant(lhs=rtn, rhs=rtn), dgrad=(sr, sr), wgrad=(sr, sr),
  ...                compute_dtype="bfloat16")
  >>> r.dgrad.lhs.rounding, r.compute_dtype, r.needs_key
  ('stochastic', dtype(bfloat16), True)
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Union

import jax.numpy as jnp
import numpy as np

from lpjax.quant.formats import specs as formats
from lpjax.quant.schemes import ssp
from lpjax.quant.schemes.nvfp4 import BLOCK as SCHEME_BLOCK, SCHEMES as NVFP4_SCHEMES

SCHEMES = NVFP4_SCHEMES + ("quest",)  # OperandQuant.scheme values (docs/numerics.md §7b)

REUSE_FWD = "reuse_fwd"  # backward operand = the forward GEMM's fake-quantized X or W (STE)
RESIDUAL_MODES = ("high_precision", "quantized")
GEMMS = ("fwd", "dgrad", "wgrad")


@dataclasses.dataclass(frozen=True)
class OperandQuant:
  """How one GEMM operand is quantized, along the GEMM's contraction axis.

  Order of operations: x -> RHT (if `hadamard_block`) -> x * sr_prescale (if set) -> quantize
  with `fmt` / `rounding` / `scale_mode` -> dequantize -> / sr_prescale.

  The pre-scale (Tseng et al. 2025) keeps stochastic rounding unbiased by keeping every block
  inside the element range. The block scale is computed from the pre-scaled values, so with e8m0
  scales it needs scale_mode="rceil": ceil(log2(3/4 amax / 6)) = floor(log2 amax) - 2 (the OCP
  scale of the unscaled block) unless amax is a power of two, where it picks the next finer scale
  that still does not clip. The OCP "floor" rule would clip again (rejected).
  """

  fmt: Union[str, formats.QuantFormat]  # a core format name / QuantFormat, or an SSP name ("ssp_fp4_g256")
  _: dataclasses.KW_ONLY
  rounding: str = "nearest_even"  # any of formats.ROUNDING_MODES; "stochastic" needs a key
  scale_mode: str | None = None  # e8m0 scale rule (floor / ceil / even / rceil); None = format default
  hadamard_block: int | None = None  # RHT block along the contraction axis; both operands must agree
  sr_prescale: float | None = None  # multiply before rounding, divide after (Tseng et al.: 0.75)
  scheme: str | None = None  # "four_over_six" / "ms_eden" (NVFP4) / "quest" (MXFP4 fwd); numerics.md §7b
  from_fwd: bool = False  # backward W / X only: quantize the forward's fake-quantized operand

  def __post_init__(self):
    if isinstance(self.fmt, str) and self.fmt in ssp.NAMES:
      if self.rounding != "nearest_even" or self.scale_mode is not None:
        raise ValueError(f"SSP quantizer {self.fmt!r} rounds half to even with its own scales; "
                         "rounding and scale_mode cannot be changed.")
    else:
      fmt = formats.get_format(self.fmt)  # raises ValueError naming the valid formats
      formats.check_rounding(self.rounding)
      formats.check_scale_mode(fmt, self.scale_mode)
    if self.hadamard_block is not None:
      b = self.hadamard_block
      if not isinstance(b, int) or b < 2 or b & (b - 1):
        raise ValueError(f"hadamard_block must be a power of two >= 2, got {b!r}.")
    if self.sr_prescale is not None and not 0.0 < self.sr_prescale <= 1.0:
      raise ValueError(f"sr_prescale must be in (0, 1], got {self.sr_prescale!r}.")
    if self.scheme is not None:
      self._check_scheme()
    if (self.sr_prescale is not None and not self.is_ssp and self.format.scale == "e8m0"
        and self.scale_mode in (None, "floor", "even")):
      # The block scale is computed from the pre-scaled values: with a floor scale, a block whose
      # amax mantissa is below 4/3 drops one binade and clips again, and SR is biased.
      raise ValueError("sr_prescale with e8m0 scales needs a non-clipping scale_mode ('rceil' or "
                       "'ceil'): the scale is computed after pre-scaling, so the 'floor' rule can "
                       "still clip. With 'rceil', x 3/4 reproduces Tseng et al.'s scale.")

  def _check_scheme(self):
    if self.scheme not in SCHEMES:
      raise ValueError(f"scheme must be one of {SCHEMES} or None, got {self.scheme!r}.")
    fmt = None if self.is_ssp else self.format
    if self.scheme == "quest":
      self._check_quest(fmt)
      return
    if (fmt is None or (fmt.element.name, fmt.scale, fmt.block_size, fmt.tensor_scale)
        != ("e2m1", "ue4m3", SCHEME_BLOCK, True)):
      raise ValueError(f"scheme={self.scheme!r} quantizes to NVFP4: use fmt 'nvfp4' (or "
                       f"'nvfp4_16x16' for four_over_six), got {self.fmt!r}.")
    if self.scale_mode is not None or self.sr_prescale is not None:
      raise ValueError(f"scheme={self.scheme!r} chooses its own scales: scale_mode and "
                       "sr_prescale must stay None.")
    if self.scheme == "four_over_six":
      if self.rounding not in ("nearest_even", "nearest_away", "stochastic"):
        raise ValueError("scheme='four_over_six' rounds 'nearest_even' (Four over Six), "
                         f"'nearest_away' (Quartet II) or 'stochastic'; got {self.rounding!r}.")
    else:
      if fmt.tile:
        raise ValueError("scheme='ms_eden' uses 1x16 blocks: use fmt 'nvfp4'.")
      if self.rounding != "stochastic":
        raise ValueError("scheme='ms_eden' rounds its block scales stochastically: set "
                         "rounding='stochastic' (its elements round to nearest, ties away).")
      if not self.hadamard_block or self.hadamard_block % SCHEME_BLOCK:
        raise ValueError("scheme='ms_eden' corrects each Hadamard group: set hadamard_block to a "
                         f"multiple of {SCHEME_BLOCK} (Quartet II uses 128), got "
                         f"{self.hadamard_block!r}.")

  def _check_quest(self, fmt):
    if fmt is None or (fmt.element.name, fmt.scale, fmt.block_size, fmt.tile) != ("e2m1", "e8m0", 32, False):
      raise ValueError(f"scheme='quest' quantizes to MXFP4: use fmt 'mxfp4', got {self.fmt!r}.")
    if (self.rounding != "nearest_even" or self.scale_mode is not None
        or self.sr_prescale is not None):
      raise ValueError("scheme='quest' has its own scale (RMS-based) and rounding (to nearest, ties "
                       "toward zero, as Quartet's kernel): leave rounding, scale_mode and "
                       "sr_prescale at their defaults.")
    if not self.hadamard_block:
      raise ValueError("scheme='quest' quantizes after a Hadamard transform: set hadamard_block "
                       "(Quartet: 32).")

  @property
  def is_ssp(self) -> bool:
    return isinstance(self.fmt, str) and self.fmt in ssp.NAMES

  @property
  def format(self) -> formats.QuantFormat | None:
    """The core QuantFormat (None for SSP quantizers)."""
    return None if self.is_ssp else formats.get_format(self.fmt)

  @property
  def stochastic(self) -> bool:
    return self.rounding == "stochastic"


Operand = Union[OperandQuant, str, None]


def _check_operand(op, gemm: str, side: str, reusable: bool):
  if op is None or isinstance(op, OperandQuant):
    return op
  if op == REUSE_FWD:
    if not reusable:
      raise ValueError(f"{gemm}.{side}: REUSE_FWD only applies to dgrad.rhs (W) and wgrad.lhs (X).")
    return op
  raise TypeError(f"{gemm}.{side} must be an OperandQuant, None or REUSE_FWD, got {op!r}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GemmQuant:
  """The two operands of one GEMM (see the module docstring for which is lhs and rhs)."""

  lhs: Operand = None  # fwd: X; dgrad: dY; wgrad: X
  rhs: Operand = None  # fwd: W; dgrad: W;  wgrad: dY

  @property
  def hadamard_block(self) -> int | None:
    """The RHT block of this GEMM (shared by both operands), or None."""
    blocks = {op.hadamard_block for op in (self.lhs, self.rhs)
              if isinstance(op, OperandQuant) and op.hadamard_block}
    return blocks.pop() if blocks else None

  def operands(self):
    return (self.lhs, self.rhs)


def _as_gemm_quant(value, gemm: str) -> GemmQuant:
  if value is None:
    return GemmQuant()
  if isinstance(value, GemmQuant):
    g = value
  elif isinstance(value, (tuple, list)) and len(value) == 2:
    g = GemmQuant(lhs=value[0], rhs=value[1])
  else:
    raise TypeError(f"{gemm} must be a GemmQuant, an (lhs, rhs) pair or None, got {value!r}.")
  reusable = {"fwd": (False, False), "dgrad": (False, True), "wgrad": (True, False)}[gemm]
  lhs = _check_operand(g.lhs, gemm, "lhs", reusable[0])
  rhs = _check_operand(g.rhs, gemm, "rhs", reusable[1])
  for op, side, ok in ((lhs, "lhs", reusable[0]), (rhs, "rhs", reusable[1])):
    if isinstance(op, OperandQuant) and op.from_fwd and not ok:
      raise ValueError(f"{gemm}.{side}: from_fwd only applies to dgrad.rhs (W) and wgrad.lhs (X).")
  # The RHT must be the same on both sides of the contraction to cancel; a high-precision
  # operand opposite a rotated one is rotated too (without quantization).
  if all(isinstance(op, OperandQuant) for op in (lhs, rhs)) and lhs.hadamard_block != rhs.hadamard_block:
    raise ValueError(f"{gemm}: both quantized operands must use the same hadamard_block, got "
                     f"lhs={lhs.hadamard_block} and rhs={rhs.hadamard_block}.")
  return GemmQuant(lhs=lhs, rhs=rhs)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GemmRecipe:
  """Quantization of a layer's three GEMMs, the GEMM input dtype, and what the backward keeps.

  Hashable, so it can be a static argument of `jax.jit`.
  """

  fwd: GemmQuant = GemmQuant()  # Y = X W; blocks along K
  dgrad: GemmQuant = GemmQuant()  # dX = dY W^T; blocks along the output features N
  wgrad: GemmQuant = GemmQuant()  # dW = X^T dY; blocks along the tokens M
  compute_dtype: Any = None  # dtype the (fake-quantized) operands are fed to the GEMM in; None = as given
  residuals: str = "high_precision"  # "high_precision": keep X, W; "quantized": keep packed QArrays
  gemm_impl: str = "auto"  # FP4 GEMMs: "xla" emulated, "pallas" the exact kernel, "auto" (kernel_dispatch)
  name: str = ""  # preset name, for printing and logging

  def __post_init__(self):
    for gemm in GEMMS:
      object.__setattr__(self, gemm, _as_gemm_quant(getattr(self, gemm), gemm))
    if self.compute_dtype is not None:
      object.__setattr__(self, "compute_dtype", np.dtype(jnp.dtype(self.compute_dtype)))
    if self.residuals not in RESIDUAL_MODES:
      raise ValueError(f"residuals must be one of {RESIDUAL_MODES}, got {self.residuals!r}.")
    if self.gemm_impl not in ("auto", "xla", "pallas"):
      raise ValueError(f"gemm_impl must be 'auto', 'xla' or 'pallas', got {self.gemm_impl!r}.")
    self._check_quest()
    fwd_rht = self.fwd.hadamard_block is not None
    reuses = any(op == REUSE_FWD or (isinstance(op, OperandQuant) and op.from_fwd
                                     and not self.trust_masked)
                 for op in (self.dgrad.rhs, self.wgrad.lhs))
    if fwd_rht and reuses:
      raise ValueError("REUSE_FWD / from_fwd cannot be combined with a forward Hadamard transform: "
                       "the reused operand would be rotated along an axis the backward GEMM does "
                       "not contract.")

  def _check_quest(self):
    quest = {(g, side): isinstance(op, OperandQuant) and op.scheme == "quest"
             for g in GEMMS for side, op in zip(("lhs", "rhs"), getattr(self, g).operands())}
    if not any(quest.values()):
      return
    if not (quest[("fwd", "lhs")] and quest[("fwd", "rhs")]) or any(
        v for (g, _), v in quest.items() if g != "fwd"):
      raise ValueError("scheme='quest' is a forward quantizer: put it on both forward operands "
                       "(fwd.lhs and fwd.rhs) and nowhere else.")
    if REUSE_FWD in (self.dgrad.rhs, self.wgrad.lhs):
      raise ValueError("scheme='quest' backpropagates through its trust mask: use from_fwd=True "
                       "operands (or high precision) in the backward GEMMs, not REUSE_FWD.")
    if self.residuals == "quantized":
      raise ValueError("scheme='quest' recomputes its trust mask from the high-precision operands "
                       "in the backward pass: residuals='quantized' is not supported.")

  @property
  def trust_masked(self) -> bool:
    """True when the forward quantizer is QuEST: the backward GEMMs run in its rotated domain, and
    their results pass through its trust mask and the inverse Hadamard transform."""
    return isinstance(self.fwd.lhs, OperandQuant) and self.fwd.lhs.scheme == "quest"

  @property
  def is_high_precision(self) -> bool:
    """True when no operand of any GEMM is quantized."""
    return all(op is None for g in (self.fwd, self.dgrad, self.wgrad) for op in g.operands())

  @property
  def needs_key(self) -> bool:
    """True when some operand uses stochastic rounding (dot_general then needs `key`)."""
    return any(isinstance(op, OperandQuant) and op.stochastic
               for g in (self.fwd, self.dgrad, self.wgrad) for op in g.operands())

  def __str__(self):
    return self.name or repr(self)


def precision_rank(recipe: GemmRecipe) -> int:
  """How precise a recipe's GEMMs are, for comparing high-precision recipes: 0 for a quantized
  recipe, else the bits of its compute dtype (bf16 / fp16: 16, fp32: 32); 32 for "as given"
  ("auto"), which is, like "fp32", the model's own GEMM on the operands of a model (fp32, bf16
  or fp16: at most 32 bits; `lpjax.quant.intercept` runs both as the original op)."""
  if not recipe.is_high_precision:
    return 0
  if recipe.compute_dtype is None:
    return 32
  return 8 * recipe.compute_dtype.itemsize


def kept_recipe(high_precision: GemmRecipe, own: GemmRecipe) -> GemmRecipe:
  """The recipe of a kept layer: `high_precision`, unless the layer's own recipe (its rule's or
  the policy's `recipe`) is itself unquantized and at least as precise: a kept layer never runs
  below the recipe the run asked for (under "fp32" every layer, kept or not, runs fp32). With
  "auto" (as given, the default) a kept layer runs the model's own GEMM under every recipe.

  Examples:
    >>> from lpjax.quant import recipes
    >>> kept_recipe(recipes.get("bf16"), recipes.get("fp32")).name
    'fp32'
    >>> kept_recipe(recipes.get("bf16"), recipes.get("mxfp4")).name
    'bf16'
    >>> kept_recipe(recipes.get("auto"), recipes.get("bf16")).name   # not below the model's dtype
    'auto'
    >>> kept_recipe(recipes.get("auto"), recipes.get("fp32")).name   # both the original GEMM
    'fp32'
  """
  rank = precision_rank(own)
  return own if rank and rank >= precision_rank(high_precision) else high_precision


@functools.lru_cache(maxsize=None)
def with_residuals(recipe: GemmRecipe, residuals: str) -> GemmRecipe:
  """`recipe` with its backward residuals kept as `residuals` (one of RESIDUAL_MODES)."""
  return dataclasses.replace(recipe, residuals=residuals)


@functools.lru_cache(maxsize=None)
def forward_only(recipe: GemmRecipe) -> GemmRecipe:
  """`recipe` with high-precision backward GEMMs (its forward quantization kept)."""
  return dataclasses.replace(recipe, dgrad=GemmQuant(), wgrad=GemmQuant(),
                             name=f"{recipe.name or 'recipe'}:fwd_only")
