"""Recipe variants from strings: each modifier changes exactly what it names; numerics; errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax.quant.formats import specs as formats
from lpjax.quant.gemm import operand
from lpjax.quant.recipes import variants as recipe_spec
from lpjax.quant import recipes
from lpjax.quant.recipes.gemm_recipe import GEMMS, GemmQuant, OperandQuant
from lpjax.quant.codec.qarray import dequantize, quantize
from lpjax.quant.recipes.variants import parse
from lpjax.train import config as cfg_lib

QUANTIZED = ("fp8", "mxfp8", "mxfp4", "mxfp4_bwd", "nvfp4", "mxfp4_e4m3scale", "mxfp4_naive")


def _operands(r):
  return {(g, s): getattr(getattr(r, g), s) for g in GEMMS for s in ("lhs", "rhs")}


def _fields(f: formats.QuantFormat) -> dict:
  """A format's fields without its display name."""
  return {k: v for k, v in dataclasses.asdict(f).items() if k != "name"}


def _describe(op):
  """Everything about an operand except the format's display name (None stays None)."""
  if not isinstance(op, OperandQuant):
    return op
  return (_fields(op.format), op.rounding, op.scale_mode, op.hadamard_block, op.sr_prescale)


def _expect_formats(preset, spec, new_format, scale_mode=lambda op: op.scale_mode):
  """parse(spec) == preset with every quantized operand's format -> new_format(format)."""
  base, got = recipes.get(preset), parse(f"{preset}:{spec}")
  assert got.name == f"{preset}:{spec}"
  assert (got.compute_dtype, got.residuals) == (base.compute_dtype, base.residuals)
  for where, op in _operands(base).items():
    new = _operands(got)[where]
    if not isinstance(op, OperandQuant):
      assert new == op, where
      continue
    expected = dataclasses.replace(op, fmt=new_format(op.format), scale_mode=scale_mode(op))
    assert _describe(new) == _describe(expected), where


# --- each modifier against dataclasses.replace of the preset ----------------------------------

@pytest.mark.parametrize("preset", QUANTIZED)
@pytest.mark.parametrize("mode", ["stochastic", "toward_zero", "toward_positive", "nearest_even"])
def test_grad_rounding_changes_only_the_dy_operands(preset, mode):
  base = recipes.get(preset)
  spec = f"{preset}:grad_rounding={mode}"
  expected = dataclasses.replace(
      base, name=spec,
      dgrad=GemmQuant(lhs=dataclasses.replace(base.dgrad.lhs, rounding=mode), rhs=base.dgrad.rhs),
      wgrad=GemmQuant(lhs=base.wgrad.lhs, rhs=dataclasses.replace(base.wgrad.rhs, rounding=mode)))
  assert parse(spec) == expected


@pytest.mark.parametrize("preset", ["mxfp4", "nvfp4", "mxfp4_naive", "fp8"])
@pytest.mark.parametrize("gemms,kept", [("fwd", {"fwd"}), ("bwd", {"dgrad", "wgrad"}),
                                        ("all", set(GEMMS)), ("dgrad+fwd", {"fwd", "dgrad"}),
                                        ("wgrad", {"wgrad"})])
def test_gemms_keeps_the_named_gemms(preset, gemms, kept):
  base = recipes.get(preset)
  spec = f"{preset}:gemms={gemms}"
  expected = dataclasses.replace(base, name=spec, **{g: GemmQuant() for g in GEMMS if g not in kept})
  assert parse(spec) == expected


# Written out from Y = X W, dX = dY W^T, dW = X^T dY (not from the module's table).
_WHERE = {"x": {("fwd", "lhs"), ("wgrad", "lhs")}, "w": {("fwd", "rhs"), ("dgrad", "rhs")},
          "dy": {("dgrad", "lhs"), ("wgrad", "rhs")}}


@pytest.mark.parametrize("preset", ["mxfp4", "nvfp4", "mxfp4_naive", "fp8"])
@pytest.mark.parametrize("operands", ["x", "w", "dy", "x+w", "dy+x", "all"])
def test_operands_keeps_the_named_tensors_in_every_gemm(preset, operands):
  base = recipes.get(preset)
  names = ["x", "w", "dy"] if operands == "all" else operands.split("+")
  kept = set().union(*(_WHERE[n] for n in names))
  got = _operands(parse(f"{preset}:operands={operands}"))
  for where, op in _operands(base).items():
    assert got[where] == (op if where in kept else None), where


def test_operands_and_gemms_isolate_one_operand_of_one_gemm():
  r = parse("mxfp4:gemms=wgrad,operands=dy")
  assert [w for w, op in _operands(r).items() if op is not None] == [("wgrad", "rhs")]
  assert r.wgrad.rhs == recipes.get("mxfp4").wgrad.rhs
  assert r.wgrad.hadamard_block == recipes.get("mxfp4").wgrad.hadamard_block  # the RHT stays


def test_operands_x_gives_the_gemm_of_an_exact_high_precision_weight():
  """Only X quantized: the forward product is fake_quant(X) @ W with W only cast to the recipe's
  bf16 compute dtype."""
  x = jax.random.normal(jax.random.key(0), (8, 64))
  w = jax.random.normal(jax.random.key(1), (64, 16))
  from lpjax.quant import dot_general, fake_quant

  dn = (((1,), (0,)), ((), ()))
  got = dot_general(x, w, dn, recipe="mxfp4_naive:operands=x", key=jax.random.key(2))
  bf16 = jnp.bfloat16
  want = jnp.dot(fake_quant(x, "mxfp4").astype(bf16), w.astype(bf16),
                 preferred_element_type=jnp.float32)
  assert np.allclose(np.asarray(got, np.float32), np.asarray(want), rtol=1e-5, atol=1e-5)
  both = dot_general(x, w, dn, recipe="mxfp4_naive", key=jax.random.key(2))
  assert not np.allclose(np.asarray(got, np.float32), np.asarray(both, np.float32), rtol=1e-3,
                         atol=1e-3)


@pytest.mark.parametrize("preset", ["mxfp4", "mxfp4_naive", "mxfp4_bwd", "nvfp4", "mxfp8"])
@pytest.mark.parametrize("block", [16, 64])
def test_block_size(preset, block):
  _expect_formats(preset, f"block_size={block}", lambda f: dataclasses.replace(f, block_size=block))


def test_block_size_of_nvfp4_weights_is_the_tile_edge():
  r = parse("nvfp4:block_size=32")
  assert r.fwd.rhs.format.tile and r.fwd.rhs.format.block_size == 32
  assert not r.fwd.lhs.format.tile and r.fwd.lhs.format.block_size == 32


@pytest.mark.parametrize("preset", ["mxfp4", "mxfp4_naive", "mxfp4_bwd"])
def test_scale_ue4m3_adds_the_tensor_scale_and_drops_the_e8m0_rule(preset):
  _expect_formats(preset, "scale=ue4m3",
                  lambda f: dataclasses.replace(f, scale="ue4m3", tensor_scale=True),
                  scale_mode=lambda op: None)


def test_scale_e8m0_on_nvfp4_drops_the_tensor_scale():
  _expect_formats("nvfp4", "scale=e8m0",
                  lambda f: dataclasses.replace(f, scale="e8m0", tensor_scale=False),
                  scale_mode=lambda op: None)
  assert parse("nvfp4:scale=e8m0").dgrad.lhs.rounding == "stochastic"  # rounding untouched


def test_scale_fp32_blocks():
  _expect_formats("mxfp4_naive", "scale=fp32", lambda f: dataclasses.replace(f, scale="fp32"),
                  scale_mode=lambda op: None)


@pytest.mark.parametrize("gran", ["tensor", "channel"])
def test_granularity_tensor_and_channel_use_fp32_current_scales(gran):
  _expect_formats("mxfp4_naive", f"granularity={gran}",
                  lambda f: dataclasses.replace(f, granularity=gran, scale="fp32", block_size=None),
                  scale_mode=lambda op: None)


def test_granularity_tensor_with_e8m0_keeps_the_scale_rule():
  _expect_formats("mxfp4", "granularity=tensor,scale=e8m0",
                  lambda f: dataclasses.replace(f, granularity="tensor", block_size=None))
  assert parse("mxfp4:granularity=tensor,scale=e8m0").dgrad.lhs.scale_mode == "rceil"


@pytest.mark.parametrize("k", [None, -3])
def test_granularity_fixed(k):
  spec = "granularity=fixed" + (f",fixed_exponent={k}" if k is not None else "")
  _expect_formats("mxfp4_naive", spec,
                  lambda f: dataclasses.replace(f, granularity="tensor", block_size=None,
                                                fixed_scale_exponent=k or 0))


def test_granularity_block_changes_nothing_but_the_name():
  _expect_formats("nvfp4", "granularity=block", lambda f: f)


def test_modifiers_apply_in_a_fixed_order():
  a = parse("mxfp4:grad_rounding=toward_zero,block_size=16,gemms=bwd")
  b = parse("mxfp4:gemms=bwd,block_size=16,grad_rounding=toward_zero")
  assert dataclasses.replace(a, name="") == dataclasses.replace(b, name="")
  assert a.fwd == GemmQuant() and a.dgrad.lhs.rounding == "toward_zero"
  assert a.dgrad.rhs.rounding == "stochastic" and a.dgrad.lhs.format.block_size == 16


# --- numerics of the new granularities against numpy ------------------------------------------

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _e2m1_rne(v):
  """Nearest E2M1 value of each element (ties to the even code), saturating at ±6."""
  v = np.asarray(v, np.float64)
  out = np.empty_like(v)
  for i, a in np.ndenumerate(np.abs(v)):
    d = np.abs(E2M1 - a)
    best = np.flatnonzero(d == d.min())
    idx = best[0] if len(best) == 1 else best[best % 2 == 0][0]
    out[i] = E2M1[idx]
  return np.where(np.signbit(v), -out, out)


def _data():
  rng = np.random.default_rng(0)
  x = (rng.standard_normal((4, 16)) * 2.0).astype(np.float32)
  x[0, :6] = [0.25, 2.5, 5.0, 7.0, -100.0, 1e-3]  # ties at scale 1, saturation, flush
  return x


def _fake(spec, x):
  op = parse(spec).fwd.lhs  # mxfp4_naive: no RHT, no pre-scale
  return np.asarray(operand.fake(jnp.asarray(x), op, axis=-1, key=None))


def _fp32_scaled(x):
  """fl32(max_elem / amax) per group (rows of x), then round fl32(x * enc), times fl32(1 / enc)."""
  amax = np.abs(x).max(axis=-1, keepdims=True).astype(np.float32)
  enc = (np.float32(6.0) / amax).astype(np.float32)
  v = (x * enc).astype(np.float32)
  return (_e2m1_rne(v).astype(np.float32) * (np.float32(1.0) / enc)).astype(np.float32)


def test_granularity_tensor_numerics():
  x = _data()
  expected = _fp32_scaled(x.reshape(1, -1)).reshape(x.shape)
  np.testing.assert_array_equal(_fake("mxfp4_naive:granularity=tensor", x), expected)


def test_granularity_channel_numerics():
  x = _data()
  np.testing.assert_array_equal(_fake("mxfp4_naive:granularity=channel", x), _fp32_scaled(x))


def test_granularity_tensor_e8m0_numerics():
  x = _data()
  k = int(np.floor(np.log2(np.abs(x).max()))) - 2  # OCP floor rule: E(amax) - emax(e2m1)
  expected = _e2m1_rne(x.astype(np.float64) / 2.0**k) * 2.0**k
  np.testing.assert_array_equal(_fake("mxfp4_naive:granularity=tensor,scale=e8m0", x), expected)


@pytest.mark.parametrize("k", [0, -3, 2])
def test_granularity_fixed_numerics(k):
  x = _data()
  expected = _e2m1_rne(x.astype(np.float64) / 2.0**k) * 2.0**k  # saturates at ±6 * 2^k
  got = _fake(f"mxfp4_naive:granularity=fixed,fixed_exponent={k}", x)
  np.testing.assert_array_equal(got, expected)
  if k == 0:  # the hand-checked corner values at scale 1
    assert got[0, :6].tolist() == [0.0, 2.0, 4.0, 6.0, -6.0, 0.0]


def test_fixed_scale_is_stored_and_ignores_the_data():
  fmt = parse("mxfp4_naive:granularity=fixed,fixed_exponent=-4").fwd.lhs.format
  for scale in (1e-3, 1.0, 1e3):
    q = quantize(jnp.asarray(_data() * scale), fmt)
    assert q.scales.shape == () and int(q.scales) == 127 - 4
  nan = quantize(jnp.array([1.0, jnp.nan]), fmt)  # NaN still poisons the tensor (§4)
  assert int(nan.scales) == 0xFF and np.isnan(np.asarray(dequantize(nan))).all()


@pytest.mark.parametrize("kwargs", [dict(scale="ue4m3"), dict(scale="e8m0", granularity="block"),
                                    dict(scale="e8m0", granularity="tensor", block_size=None,
                                         fixed_scale_exponent_value=200)])
def test_fixed_scale_exponent_validation(kwargs):
  k = kwargs.pop("fixed_scale_exponent_value", 0)
  with pytest.raises(ValueError, match="fixed_scale_exponent"):
    formats.QuantFormat(element="e2m1", fixed_scale_exponent=k, **kwargs)


@pytest.mark.parametrize("spec", ["mxfp4:scale=ue4m3,block_size=16", "mxfp4_naive:granularity=fixed",
                                  "nvfp4:gemms=bwd,grad_rounding=toward_zero",
                                  "mxfp4:operands=dy", "quartet:operands=dy",
                                  "nvfp4:operands=x+w"])
def test_variants_train_through_a_quantized_gemm(spec):
  x = jax.random.normal(jax.random.key(0), (2, 8, 64))
  w = jax.random.normal(jax.random.key(1), (64, 32)) * 0.5
  from lpjax.quant.gemm.einsum import einsum

  loss = lambda w: einsum("bsd,df->bsf", x, w, recipe=spec, key=jax.random.key(2)).sum()
  g = jax.jit(jax.grad(loss))(w)
  assert g.shape == w.shape and bool(jnp.isfinite(g).all()) and float(jnp.abs(g).sum()) > 0


# --- names, lookup, config --------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["mxfp4_naive:grad_rounding=toward_zero", "mxfp4:block_size=16",
                                  "mxfp4:scale=ue4m3", "mxfp4:gemms=fwd",
                                  "mxfp4_naive:granularity=tensor,scale=e8m0",
                                  "mxfp4_naive:granularity=fixed,fixed_exponent=-2"])
def test_name_round_trip_and_lookup(spec):
  r = parse(spec)
  assert r.name == spec and str(r) == spec
  assert parse(r.name) == r
  assert recipes.get(spec) == r and recipes.get(spec) is recipes.get(spec)  # cached for jit
  c = cfg_lib.llama_config("tiny", recipe=spec)
  c.quant.high_precision_recipe = spec
  cfg_lib.validate(c, device_count=1)


def test_whitespace_is_dropped_and_a_bare_preset_is_the_preset():
  assert parse(" mxfp4 : block_size = 16 ").name == "mxfp4:block_size=16"
  assert parse("mxfp4") is recipes.get("mxfp4")


@pytest.mark.parametrize("spec,match", [
    ("mxfp4:blocksize=16", r"unknown modifier 'blocksize'\. Did you mean 'block_size'\? Valid: gemms, "),
    ("mxfp4:block_size=abc", r"block_size='abc' is not valid; valid: an integer"),
    ("mxfp4:block_size=0", r"an integer in \[1, "),
    ("mxfp4:scale=e4m3", r"Did you mean 'ue4m3'\? Valid: e8m0, ue4m3, fp32"),
    ("mxfp4:grad_rounding=truncate", r"Valid: nearest_even, nearest_away, toward_zero"),
    ("mxfp4:gemms=forward", r"valid: all, fwd, bwd"),
    ("mxfp4:gemms=fwd+fwd", r"valid: all, fwd, bwd"),
    ("mxfp4:granularity=row", r"Valid: block, channel, tensor, fixed"),
    ("mxfp8:scale=ue4m3", r"defined for e2m1 elements, not e4m3"),
    ("mxfp5:block_size=16", r"Unknown recipe 'mxfp5'.*Valid: fp32, bf16"),
    ("mxfp4:", r"nothing after ':'"),
    ("mxfp4:block_size", r"is not key=value"),
    ("mxfp4:block_size=16,block_size=32", r"given twice"),
    ("bf16:block_size=16", r"no quantized operand"),
    ("ssp_fp4:block_size=16", r"SSP quantizer"),
    ("ssp_fp4:gemms=fwd", r"REUSE_FWD"),
    ("mxfp4:fixed_exponent=2", r"fixed_exponent needs granularity=fixed"),
    ("mxfp4:granularity=fixed,fixed_exponent=200", r"an integer in \[-127, 127\]"),
    ("mxfp4:granularity=fixed,scale=fp32", r"drop scale=fp32"),
    ("mxfp4:granularity=tensor,block_size=16", r"block_size applies to block granularity"),
    ("fp8:block_size=16", r"block_size applies to block granularity"),
    ("mxfp4:gemms=fwd,grad_rounding=stochastic", r"no quantized gradient operand"),
    ("mxfp4_bwd:gemms=fwd", r"leaves no quantized operand"),
    ("mxfp4:operands=z", r"operands='z' is not valid; valid: all, or a '\+'-joined subset of x, w, dy"),
    ("mxfp4:operands=x+x", r"operands='x\+x' is not valid"),
    ("mxfp4:gemms=fwd,operands=dy", r"operands=dy leaves no quantized operand"),
    ("ssp_fp4:operands=x", r"REUSE_FWD"),
    ("quartet:operands=w", r"invalid recipe: scheme='quest' is a forward quantizer: put it on both"),
])
def test_bad_specs_name_the_problem(spec, match):
  with pytest.raises(ValueError, match=match):
    parse(spec)
  with pytest.raises(cfg_lib.ConfigError, match="quant.recipe"):
    cfg_lib.validate(cfg_lib.llama_config("tiny", recipe=spec), device_count=1)


def test_every_modifier_is_documented():
  for key in recipe_spec.MODIFIERS:
    assert f"| {key} |" in recipe_spec.__doc__
