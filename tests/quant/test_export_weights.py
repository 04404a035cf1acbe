"""lpjax.quant.export_weights: the packed weights are exactly what the policy's forward GEMM
multiplies (read back through dot_general itself), per block, with kept layers left out."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax import quant

K, N = 64, 48
DN = (((1,), (0,)), ((), ()))


def _kernel(seed=0, blocks=None):
  shape = (K, N) if blocks is None else (blocks, K, N)
  return jax.random.normal(jax.random.key(seed), shape) * jnp.linspace(0.1, 30.0, N)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4_16x16", "nvfp4", "mxfp8_e4m3"])
def test_the_packed_weight_is_what_the_forward_gemm_multiplies(fmt):
  w = _kernel()
  recipe = quant.GemmRecipe(fwd=quant.GemmQuant(rhs=quant.OperandQuant(fmt)), name=f"w_{fmt}")
  packed = quant.export_weights({"proj": {"kernel": w}},
                                quant.QuantPolicy(recipe=recipe, keep_high_precision=()))
  p = packed["proj/kernel"]
  assert p.shape == (N, K) and p.format == quant.get_format(fmt) and p.recipe == f"w_{fmt}"
  # X = I: the GEMM's output is its quantized W, every product and sum exact (a -0 sums to +0)
  used = quant.dot_general(jnp.eye(K), w, DN, recipe)
  assert np.array_equal(np.asarray(used), np.asarray(p.dequantize().T))
  assert np.array_equal(np.asarray(p.dequantize()), np.asarray(quant.fake_quant(w.T, fmt)))


def test_stacked_blocks_are_numbered_and_kept_ones_left_out():
  params = {"layers": {"mlp": {"up": {"kernel": _kernel(1, blocks=3)}}},
            "lm_head": {"kernel": _kernel(2)}, "norm": {"scale": jnp.ones(K)}}
  policy = quant.QuantPolicy.from_settings("nvfp4", keep_first=1).for_model(num_blocks=3)
  packed = quant.export_weights(params, policy)
  assert sorted(packed) == ["layers/1/mlp/up/kernel", "layers/2/mlp/up/kernel"]  # head kept
  w2 = params["layers"]["mlp"]["up"]["kernel"][2]
  want = quant.fake_quant(w2.T, "nvfp4_16x16")
  assert np.array_equal(np.asarray(packed["layers/2/mlp/up/kernel"].dequantize()), want)


@pytest.mark.parametrize("recipe,match", [("mxfp4", "Hadamard"), ("quartet", "Hadamard"),
                                          ("nvfp4_4over6", "scheme")])
def test_quantizers_a_served_layer_cannot_reproduce_are_refused(recipe, match):
  with pytest.raises(ValueError, match=match):
    quant.export_weights({"proj": {"kernel": _kernel()}},
                         quant.QuantPolicy(recipe=recipe, keep_high_precision=()))


def test_stochastic_weight_rounding_is_refused():
  op = quant.OperandQuant("mxfp4", rounding="stochastic")
  recipe = quant.GemmRecipe(fwd=quant.GemmQuant(rhs=op))
  with pytest.raises(ValueError, match="stochastic"):
    quant.export_weights({"proj": {"kernel": _kernel()}},
                         quant.QuantPolicy(recipe=recipe, keep_high_precision=()))


@pytest.mark.parametrize("recipe,fmt", [("mxfp4", "mxfp4"), ("quartet", "mxfp4"),
                                        ("nvfp4_4over6", "nvfp4_16x16")])
def test_requantize_packs_the_round_to_nearest_of_w_with_a_warning(recipe, fmt):
  """A forward that packed values cannot reproduce: refused with a pointer to requantize=True,
  which packs fake_quant(W^T) in the same format (plain RTN) and says so."""
  params = {"proj": {"kernel": _kernel()}}
  policy = quant.QuantPolicy(recipe=recipe, keep_high_precision=())
  with pytest.raises(ValueError, match="requantize=True"):
    quant.export_weights(params, policy)
  with pytest.warns(UserWarning, match="NOT the values the training forward multiplied"):
    p = quant.export_weights(params, policy, requantize=True)["proj/kernel"]
  assert p.recipe == recipe and p.requantized.startswith(f"{recipe}'s forward GEMM")
  assert p.format == quant.get_format(fmt)
  want = quant.fake_quant(params["proj"]["kernel"].T, fmt)  # round-to-nearest-even, OCP scales
  assert np.array_equal(np.asarray(p.dequantize()), np.asarray(want))


def test_requantize_changes_nothing_a_forward_reproduces_and_ssp_stays_refused():
  params = {"proj": {"kernel": _kernel()}}
  exact = quant.QuantPolicy(recipe="mxfp4_naive", keep_high_precision=())
  a = quant.export_weights(params, exact)["proj/kernel"]
  b = quant.export_weights(params, exact, requantize=True)["proj/kernel"]
  assert b.requantized == "" and np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)
  with pytest.raises(ValueError, match="SSP grid"):
    quant.export_weights(params, quant.QuantPolicy(recipe="ssp_fp4", keep_high_precision=()),
                         requantize=True)
