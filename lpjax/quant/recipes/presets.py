"""The preset GEMM recipes of the literature, one builder each (the table is in
`lpjax.quant.recipes`, the public module that resolves names through `preset`).

Examples:
  >>> preset("mxfp4_bwd").fwd.lhs is None   # forward in bf16
  True
  >>> preset("auto").is_high_precision, preset("auto").compute_dtype   # "auto": as given
  (True, None)
"""

from __future__ import annotations

import dataclasses
import difflib

import jax.numpy as jnp

from lpjax.quant.formats.specs import QuantFormat
from lpjax.quant.recipes.gemm_recipe import REUSE_FWD, GemmQuant, GemmRecipe, OperandQuant

BF16 = jnp.bfloat16


def _same(op):
  return GemmQuant(lhs=op, rhs=op)


def _fp32():
  """Full fp32 GEMMs (operands cast to float32): the numerics baseline."""
  return GemmRecipe(compute_dtype=jnp.float32, name="fp32")


def _bf16():
  """bf16 operands, fp32 accumulation: standard mixed precision (Micikevicius et al. 2018,
  arXiv 1710.03740). The baseline of every speed ratio."""
  return GemmRecipe(compute_dtype=BF16, name="bf16")


def _fp8():
  """Per-tensor FP8 with current scaling: e4m3 forward operands, e5m2 gradients (the HYBRID format
  of TransformerEngine's `Float8CurrentScaling`; Micikevicius et al. 2022, arXiv 2209.05433)."""
  e4m3, e5m2 = OperandQuant("fp8_e4m3"), OperandQuant("fp8_e5m2")
  return GemmRecipe(fwd=_same(e4m3), dgrad=GemmQuant(lhs=e5m2, rhs=e4m3),
                    wgrad=GemmQuant(lhs=e4m3, rhs=e5m2), compute_dtype=BF16, name="fp8")


def _mxfp8():
  """MXFP8 e4m3 for all tensors, gradients included, with round-up (rceil) e8m0 scales:
  TransformerEngine's `MXFP8BlockScaling` default and Mishra et al. 2025, "Recipes for
  pre-training LLMs with MXFP8" (arXiv 2506.08027)."""
  op = OperandQuant("mxfp8_e4m3", scale_mode="rceil")
  return GemmRecipe(fwd=_same(op), dgrad=_same(op), wgrad=_same(op), compute_dtype=BF16, name="mxfp8")


def _mxfp4():
  """MXFP4 for all three GEMMs, Quartet-like (Castro et al. 2025, arXiv 2505.14669; docs/numerics.md §7):
  forward RTN after a Hadamard-32 transform; dgrad and wgrad stochastic rounding with the 3/4
  pre-scale (Tseng et al. 2025; with the rceil scale rule so the pre-scaled block cannot clip)
  and RHT-32 along each GEMM's contraction axis."""
  fwd = OperandQuant("mxfp4", hadamard_block=32)
  sr = OperandQuant("mxfp4", rounding="stochastic", scale_mode="rceil", hadamard_block=32,
                    sr_prescale=0.75)
  return GemmRecipe(fwd=_same(fwd), dgrad=_same(sr), wgrad=_same(sr), compute_dtype=BF16, name="mxfp4")


def _quartet():
  """Quartet as released (Castro et al. 2025, arXiv 2505.14669, §4; IST-DASLab/Quartet
  `main_setup.sh`: QuestMXFP4Quantizer for W and A, AlbertTseng SR gradients, backward scheme
  "Q(E)Q(Wt)t_Q(Et)Q(Xt)t"): forward QuEST on X and W after a fixed Hadamard-32 (RMS-based scale,
  ties toward zero, trust-masked straight-through gradient); backward MXFP4 SR x3/4 with a random
  Hadamard-32 on dY and on the forward's Q(W) / Q(X) (docs/numerics.md §7b)."""
  fwd = OperandQuant("mxfp4", scheme="quest", hadamard_block=32)
  sr = OperandQuant("mxfp4", rounding="stochastic", scale_mode="rceil", hadamard_block=32,
                    sr_prescale=0.75)
  from_fwd = dataclasses.replace(sr, from_fwd=True)
  return GemmRecipe(fwd=_same(fwd), dgrad=GemmQuant(lhs=sr, rhs=from_fwd),
                    wgrad=GemmQuant(lhs=from_fwd, rhs=sr), compute_dtype=BF16, name="quartet")


def _mxfp4_bwd():
  """Backward-only MXFP4 (Tseng, Yu, Park 2025, "Training LLMs with MXFP4", arXiv 2502.20586):
  forward bf16; dgrad and wgrad MXFP4 with RHT-64 and stochastic rounding with the 3/4 pre-scale."""
  sr = OperandQuant("mxfp4", rounding="stochastic", scale_mode="rceil", hadamard_block=64,
                    sr_prescale=0.75)
  return GemmRecipe(dgrad=_same(sr), wgrad=_same(sr), compute_dtype=BF16, name="mxfp4_bwd")


def _nvfp4():
  """NVIDIA's NVFP4 recipe ("Pretraining LLMs with NVFP4", arXiv 2509.25149): all three GEMMs
  NVFP4; 1x16 blocks for activations and gradients, 16x16 tiles for weights (so Q(W)^T == Q(W^T));
  stochastic rounding on gradients only; RHT-16 on the wgrad operands only. (Its other parts,
  the last ~15% of layers and attention BMMs in bf16, belong to the QuantPolicy.)"""
  act = OperandQuant("nvfp4")
  weight = OperandQuant("nvfp4_16x16")
  grad = OperandQuant("nvfp4", rounding="stochastic")
  wg_x = OperandQuant("nvfp4", hadamard_block=16)
  wg_dy = OperandQuant("nvfp4", rounding="stochastic", hadamard_block=16)
  return GemmRecipe(fwd=GemmQuant(lhs=act, rhs=weight), dgrad=GemmQuant(lhs=grad, rhs=weight),
                    wgrad=GemmQuant(lhs=wg_x, rhs=wg_dy), compute_dtype=BF16, name="nvfp4")


# e2m1 elements with ue4m3 block scales at 32. The fp32 per-tensor second level (as NVFP4's) is
# kept: without it an E4M3 scale cannot go below 2^-9 and gradient blocks would flush to zero.
MXFP4_E4M3_SCALE = QuantFormat(element="e2m1", scale="ue4m3", block_size=32, tensor_scale=True,
                               name="e2m1_ue4m3_b32")


def _mxfp4_e4m3scale():
  """The E4M3-vs-E8M0 scale ablation (as in the NVFP4 paper, arXiv 2509.25149): `mxfp4` with the
  e8m0 block scales replaced by ue4m3 scales (block 32, fp32 tensor scale). No 3/4 pre-scale: an
  E4M3 scale maps the block amax onto 6 instead of clipping it."""
  fwd = OperandQuant(MXFP4_E4M3_SCALE, hadamard_block=32)
  sr = OperandQuant(MXFP4_E4M3_SCALE, rounding="stochastic", hadamard_block=32)
  return GemmRecipe(fwd=_same(fwd), dgrad=_same(sr), wgrad=_same(sr), compute_dtype=BF16,
                    name="mxfp4_e4m3scale")


def _mxfp4_naive():
  """MXFP4 round-to-nearest-even on every operand of all three GEMMs, no RHT, no SR: the naive
  baseline that published recipes improve on (e.g. Tseng et al. 2025, Table 1)."""
  op = OperandQuant("mxfp4")
  return GemmRecipe(fwd=_same(op), dgrad=_same(op), wgrad=_same(op), compute_dtype=BF16,
                    name="mxfp4_naive")


def _nvfp4_4over6():
  """`nvfp4` with "Four over Six" adaptive block scales on every operand (Cook et al. 2025,
  arXiv 2512.02010, §3-4; mit-han-lab/fouroversix `quantize/pytorch/reference.py`, whose training
  configuration applies the MSE rule to activations, weights (16x16) and gradients (SR)): each
  block keeps the better of its map-to-6 and map-to-4 encodings (docs/numerics.md §7b)."""
  def with_4over6(op):
    return dataclasses.replace(op, scheme="four_over_six")
  base = _nvfp4()
  return GemmRecipe(**{g: GemmQuant(lhs=with_4over6(getattr(base, g).lhs),
                                    rhs=with_4over6(getattr(base, g).rhs))
                       for g in ("fwd", "dgrad", "wgrad")},
                    compute_dtype=BF16, name="nvfp4_4over6")


QUARTET2_HADAMARD = 128  # Quartet II's backward RHT block (its scripts' HADAMARD_DIM)


def _eden(**kw):
  return OperandQuant("nvfp4", rounding="stochastic", scheme="ms_eden",
                      hadamard_block=QUARTET2_HADAMARD, **kw)


def _quartet2():
  """Quartet II (Panferov et al. 2026, arXiv 2601.22813; IST-DASLab/Quartet-II
  `src/models/quantization/schemes/quartet_2.py`): forward NVFP4 1x16 on X and W with Four over
  Six scales and round-half-away (its Triton kernel); backward MS-EDEN after a random
  Hadamard-128 on all four operands, the weight and activation re-quantized from the forward's
  Q(W) and Q(X) (docs/numerics.md §7b)."""
  fwd = OperandQuant("nvfp4", rounding="nearest_away", scheme="four_over_six")
  return GemmRecipe(fwd=_same(fwd), dgrad=GemmQuant(lhs=_eden(), rhs=_eden(from_fwd=True)),
                    wgrad=GemmQuant(lhs=_eden(from_fwd=True), rhs=_eden()), compute_dtype=BF16,
                    name="quartet2")


def _nvfp4_bwd_ms_eden():
  """Backward-only Quartet II: forward bf16; dgrad and wgrad MS-EDEN after a random
  Hadamard-128 (arXiv 2601.22813; its `disable_forward_quant` setting)."""
  return GemmRecipe(dgrad=_same(_eden()), wgrad=_same(_eden()), compute_dtype=BF16,
                    name="nvfp4_bwd_ms_eden")


def _ssp(x_fmt, w_fmt, name):
  # The paper's autograd: Y = Q(X) Q(W) with a straight-through estimator, so the backward GEMMs
  # multiply the bf16 dY with the forward's Q(W) and Q(X) (TianjinYellow/StableSPAM, utils/).
  return GemmRecipe(fwd=GemmQuant(lhs=OperandQuant(x_fmt), rhs=OperandQuant(w_fmt)),
                    dgrad=GemmQuant(lhs=None, rhs=REUSE_FWD), wgrad=GemmQuant(lhs=REUSE_FWD, rhs=None),
                    compute_dtype=BF16, name=name)


def _ssp_fp4():
  """Stable-SPAM paper "FP4" (Huang et al. 2025, arXiv 2502.17055; docs/numerics.md §7): forward-only
  W4A4 fake quantization, groups of 256 with the top-2 |x| kept, 9-level grid; gradients bf16."""
  return _ssp("ssp_fp4_g256", "ssp_fp4_g256", "ssp_fp4")


def _ssp_int4():
  """Stable-SPAM paper "INT4" (arXiv 2502.17055; docs/numerics.md §7): asymmetric uint4 weights
  (min/max, group 256) and symmetric absmax int4 activations (group 256, top-2 kept), forward
  only; gradients bf16."""
  return _ssp("ssp_int4_g256", "ssp_uint4_g256", "ssp_int4")


AUTO = "auto"  # the "as given" recipe: not a preset (not in NAMES), QuantPolicy's kept-layer default


def _as_given():
  """No quantization and no cast: each GEMM runs on its operands as given (fp32 operands: an fp32
  GEMM, bf16: bf16), i.e. the original program's GEMM. `QuantPolicy`'s default `high_precision`:
  a kept layer never runs below the model's own dtype."""
  return GemmRecipe(name=AUTO)


_BUILDERS = {
    "fp32": _fp32, "bf16": _bf16, "fp8": _fp8, "mxfp8": _mxfp8, "mxfp4": _mxfp4,
    "mxfp4_bwd": _mxfp4_bwd, "nvfp4": _nvfp4, "mxfp4_e4m3scale": _mxfp4_e4m3scale,
    "mxfp4_naive": _mxfp4_naive, "quartet": _quartet, "nvfp4_4over6": _nvfp4_4over6, "quartet2": _quartet2,
    "nvfp4_bwd_ms_eden": _nvfp4_bwd_ms_eden, "ssp_fp4": _ssp_fp4, "ssp_int4": _ssp_int4,
}
NAMES = tuple(_BUILDERS)
_CACHE: dict[str, GemmRecipe] = {}
_AS_GIVEN = _as_given()


def preset(name: str) -> GemmRecipe:
  """The preset recipe `name`, one of `NAMES` (built once), or "auto" (operands as given); a
  ValueError naming the presets otherwise. `lpjax.quant.recipes.get` is the resolver to call (it
  also takes variants)."""
  if name == AUTO:
    return _AS_GIVEN
  if name not in _BUILDERS:
    close = difflib.get_close_matches(str(name), NAMES, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"Unknown recipe {name!r}.{hint} Valid: {', '.join(NAMES)}, 'auto' (the "
                     "operands as given), or a variant '<preset>:key=value,...' (docs/gemm.md, "
                     "\"Recipe variants\").")
  if name not in _CACHE:
    _CACHE[name] = _BUILDERS[name]()
  return _CACHE[name]
