"""Presets are what their documentation says (formats, rounding, RHT, sources), and recipes validate."""

import dataclasses
import doctest
import re

import jax.numpy as jnp
import pytest

from lpjax.quant.gemm import conv
from lpjax.quant.gemm import dot_general as gemm
from lpjax.quant.recipes import gemm_recipe as recipe
from lpjax.quant.gemm import operand
from lpjax.quant import policy
from lpjax.quant.schemes import ssp
from lpjax.quant import recipes
from lpjax.quant.recipes.gemm_recipe import REUSE_FWD, GemmQuant, GemmRecipe, OperandQuant

ALL_GEMMS = ("fwd", "dgrad", "wgrad")


def _ops(recipe, gemms=ALL_GEMMS):
  return [op for g in gemms for op in getattr(recipe, g).operands()]


def _fmt_name(op):
  return op.fmt if isinstance(op.fmt, str) else op.fmt.name


def test_names_and_lookup():
  assert set(recipes.NAMES) == {"fp32", "bf16", "fp8", "mxfp8", "mxfp4", "mxfp4_bwd", "nvfp4",
                                "mxfp4_e4m3scale", "mxfp4_naive", "quartet", "nvfp4_4over6", "quartet2",
                                "nvfp4_bwd_ms_eden", "ssp_fp4", "ssp_int4"}
  for name in recipes.NAMES:
    r = recipes.get(name)
    assert isinstance(r, GemmRecipe) and r.name == name and str(r) == name
    assert recipes.get(name) is r  # cached: one jit cache entry per preset
    assert hash(r) == hash(dataclasses.replace(r))  # usable as a static jit argument
  with pytest.raises(ValueError, match="Did you mean 'nvfp4'"):
    recipes.get("nvpf4")


@pytest.mark.parametrize("name", recipes.NAMES)
def test_every_preset_cites_its_source(name):
  doc = recipes._BUILDERS[name].__doc__ or ""
  assert re.search(r"arXiv \d{4}\.\d{4,5}|TransformerEngine|baseline|docs/numerics.md", doc), doc
  assert f"| {name} |" in recipes.__doc__  # and appears in the module's table


def test_high_precision_presets():
  assert recipes.get("fp32").is_high_precision and recipes.get("fp32").compute_dtype == jnp.float32
  assert recipes.get("bf16").is_high_precision and recipes.get("bf16").compute_dtype == jnp.bfloat16


def test_fp8_is_hybrid_per_tensor():
  r = recipes.get("fp8")
  assert [_fmt_name(o) for o in _ops(r)] == ["fp8_e4m3", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3",
                                             "fp8_e4m3", "fp8_e5m2"]  # e5m2 exactly on dY
  assert all(o.rounding == "nearest_even" for o in _ops(r))


def test_mxfp8_is_e4m3_everywhere_with_rceil():
  assert {(_fmt_name(o), o.scale_mode) for o in _ops(recipes.get("mxfp8"))} == {("mxfp8_e4m3", "rceil")}


def test_mxfp4_quartet_like():
  r = recipes.get("mxfp4")
  assert all(_fmt_name(o) == "mxfp4" for o in _ops(r))
  assert all(o.rounding == "nearest_even" and o.sr_prescale is None for o in _ops(r, ["fwd"]))
  for o in _ops(r, ["dgrad", "wgrad"]):
    assert (o.rounding, o.sr_prescale, o.hadamard_block, o.scale_mode) == ("stochastic", 0.75, 32, "rceil")
  assert r.fwd.hadamard_block == 32


def test_mxfp4_bwd_tseng():
  r = recipes.get("mxfp4_bwd")
  assert r.fwd == GemmQuant() and r.compute_dtype == jnp.bfloat16
  for o in _ops(r, ["dgrad", "wgrad"]):
    assert (_fmt_name(o), o.rounding, o.hadamard_block, o.sr_prescale) == ("mxfp4", "stochastic", 64, 0.75)


def test_nvfp4_recipe():
  r = recipes.get("nvfp4")
  assert _fmt_name(r.fwd.lhs) == "nvfp4" and _fmt_name(r.fwd.rhs) == "nvfp4_16x16"
  assert _fmt_name(r.dgrad.rhs) == "nvfp4_16x16"  # weights: 16x16 tiles in both GEMMs
  sr = {(g, i) for g in ALL_GEMMS for i, o in enumerate(getattr(r, g).operands()) if o.stochastic}
  assert sr == {("dgrad", 0), ("wgrad", 1)}  # SR exactly on the two dY operands
  assert (r.fwd.hadamard_block, r.dgrad.hadamard_block, r.wgrad.hadamard_block) == (None, None, 16)
  assert all(o.sr_prescale is None for o in _ops(r))


def test_mxfp4_e4m3scale_changes_only_the_scale():
  r, ref = recipes.get("mxfp4_e4m3scale"), recipes.get("mxfp4")
  for o, o_ref in zip(_ops(r), _ops(ref)):
    f = o.format
    assert (f.element.name, f.scale, f.block_size, f.tensor_scale) == ("e2m1", "ue4m3", 32, True)
    assert (o.rounding, o.hadamard_block) == (o_ref.rounding, o_ref.hadamard_block)


def test_mxfp4_naive():
  ops = _ops(recipes.get("mxfp4_naive"))
  assert all((_fmt_name(o), o.rounding, o.hadamard_block, o.sr_prescale) ==
             ("mxfp4", "nearest_even", None, None) for o in ops)


@pytest.mark.parametrize("name,x_fmt,w_fmt", [("ssp_fp4", "ssp_fp4_g256", "ssp_fp4_g256"),
                                              ("ssp_int4", "ssp_int4_g256", "ssp_uint4_g256")])
def test_ssp_recipes_are_forward_only_with_ste(name, x_fmt, w_fmt):
  r = recipes.get(name)
  assert (r.fwd.lhs.fmt, r.fwd.rhs.fmt) == (x_fmt, w_fmt)
  assert r.dgrad == GemmQuant(lhs=None, rhs=REUSE_FWD)  # bf16 dY times the forward's Q(W)
  assert r.wgrad == GemmQuant(lhs=REUSE_FWD, rhs=None)  # the forward's Q(X) times bf16 dY


def test_recipe_validation():
  sr = OperandQuant("mxfp4", rounding="stochastic")
  with pytest.raises(ValueError, match="same hadamard_block"):
    GemmRecipe(fwd=(OperandQuant("mxfp4", hadamard_block=32), OperandQuant("mxfp4", hadamard_block=64)))
  with pytest.raises(ValueError, match="REUSE_FWD only applies"):
    GemmRecipe(dgrad=(REUSE_FWD, None))
  with pytest.raises(ValueError, match="forward Hadamard"):
    GemmRecipe(fwd=(OperandQuant("mxfp4", hadamard_block=32),) * 2, dgrad=(None, REUSE_FWD))
  with pytest.raises(ValueError, match="residuals"):
    GemmRecipe(residuals="fp4")
  with pytest.raises(ValueError, match="non-clipping scale_mode"):
    OperandQuant("mxfp4", rounding="stochastic", sr_prescale=0.75)  # floor would clip again
  with pytest.raises(ValueError, match="power of two"):
    OperandQuant("mxfp4", hadamard_block=24)
  with pytest.raises(ValueError, match="Unknown format"):
    OperandQuant("mxfp5")
  with pytest.raises(ValueError, match="SSP quantizer"):
    OperandQuant("ssp_fp4_g256", rounding="stochastic")
  with pytest.raises(TypeError):
    GemmRecipe(fwd=(sr, sr, sr))
  r = GemmRecipe(fwd=(sr, None))  # a tuple is accepted for a GemmQuant
  assert r.fwd == GemmQuant(lhs=sr, rhs=None) and r.needs_key and not r.is_high_precision
  # an unquantized operand opposite a rotated one is rotated too: allowed
  assert GemmRecipe(wgrad=(None, OperandQuant("nvfp4", hadamard_block=16))).wgrad.hadamard_block == 16


@pytest.mark.parametrize("module", [recipe, recipes, ssp, operand, gemm, conv, policy],
                         ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_docstring_examples_run(module):
  result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
  assert result.attempted > 0 and result.failed == 0
