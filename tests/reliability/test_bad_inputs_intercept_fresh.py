"""The interception's case table, the fresh adversarial pass of issue 48 (item 8): MoE, gated
MLPs, grouped / dilated / transposed convs, named scopes, other leaf names, bf16 / fp16 models,
models called twice, scans, conds, one-hot embeddings... each row with its expected outcome.
The first part of the table (items 1-7) is test_bad_inputs_intercept.py; both share
intercept_checks.py and the models of intercept_models.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

from bad_input_cases import Case, Holds, Raises, check
import intercept_checks as H
import intercept_models as M

from lpjax import quant

KEY, F32 = H.KEY, H.F32
D, V = M.D, M.V


# --- item 8: a fresh adversarial pass ------------------------------------------------------------


def _moe():
  rep = H.linen_report(M.MoE(), "mxfp4", M.X)
  st = H.status(rep)
  return (st["router"][0] == "quantized" and st["experts"][0] == "quantized"
          and len(rep.sites) == 3)


def _moe_fp32():
  return H.fp32_bit_identical(H.built_linen(M.MoE(), "fp32", M.X), M.X)


def _gated_mlp():
  rep = H.linen_report(M.Gated(), "nvfp4", M.X)
  return [(s.path, s.status) for s in rep.sites] == [
      ("gate", "quantized"), ("up", "quantized"), ("down", "quantized")]


def _convs():
  rep = H.linen_report(M.Convs(), "mxfp4", M.IMG)
  st = H.status(rep)
  return (all(st[n] == ("quantized", "") for n in ("stem", "grouped", "dilated", "depthwise"))
          and st["head"][0] == "high precision")


def _depthwise_1x1_quartet():
  """A 1x1 depthwise conv has K = 1: under quartet it is kept, with the reason."""
  class DW(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Conv(3, (1, 1), feature_group_count=3, name="dw")(x)

  st = H.status(H.linen_report(DW(), "quartet", M.IMG))
  return st["dw"][0] == "high precision" and "K=1" in st["dw"][1]


def _convs_fp32():
  return H.fp32_bit_identical(H.built_linen(M.Convs(), "fp32", M.IMG), M.IMG)


def _convs_run_and_grad():
  apply, q, variables = H.built_linen(M.Convs(), "mxfp4", M.IMG)
  (l0, g0), (l1, g1) = (H.value_and_grad(apply, variables, M.IMG),
                        H.value_and_grad(lambda v, x: q(v, x, quant_key=KEY), variables, M.IMG))
  rel = abs(float(l1 - l0)) / abs(float(l0))
  return rel < 0.2 and all(bool(jnp.any(g != 0)) for g in jax.tree.leaves(g1))


def _named_scope_paths():
  def f(p, x):
    with jax.named_scope("encoder"):
      h = jnp.einsum("btd,bsd->bts", x @ p["enc"]["wq"], x @ p["enc"]["wk"])
    return h
  p = {"enc": {"wq": jnp.ones((D, D)), "wk": jnp.ones((D, D))}}
  rep = H.report(quant.quantized(f, "mxfp4"), p, M.X)
  return [(s.path, s.status) for s in rep.sites] == [
      ("enc/wq", "quantized"), ("enc/wk", "quantized"), ("encoder/act_product", "high precision")]


def _plain_leaf_names():
  rep = H.report(quant.quantized(M.plain_lm, "mxfp4"), M.plain_params(), M.TOKENS)
  st = H.status(rep)
  return (st["mlp/up"][0] == st["mlp/down"][0] == "quantized" and st["lm_head"][0] == "high precision"
          and st["attn/wq"][0] == "quantized" and "wte" not in st)


def _bf16_model_sites():
  """A bf16 model: kept sites run as given (bf16, its own dtype: the original op), quantized
  sites mxfp4; output bf16."""
  apply, q, variables = H.built_linen(M.LinenLM(dtype=jnp.bfloat16), "mxfp4", M.TOKENS)
  y = q(variables, M.TOKENS, quant_key=KEY)
  rep = H.report(quant.quantize_model(M.LinenLM(dtype=jnp.bfloat16), "mxfp4"), variables, M.TOKENS)
  return (y.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(y.astype(F32))))
          and all(s.recipe == ("auto" if s.status == "high precision" else "mxfp4")
                  for s in rep.sites)
          and all("the original op" in s.reason for s in rep.sites if s.recipe == "auto"))


def _fp16_model():
  apply, q, variables = H.built_linen(M.LinenLM(dtype=jnp.float16), "nvfp4", M.TOKENS)
  y, y0 = q(variables, M.TOKENS, quant_key=KEY), apply(variables, M.TOKENS)
  rel = float(jnp.linalg.norm((y - y0).astype(F32)) / jnp.linalg.norm(y0.astype(F32)))
  return y.dtype == jnp.float16 and rel < 0.3


def _called_twice_per_step():
  """A layer applied twice gets a site per call, and each its own stochastic-rounding key."""
  q = quant.quantize_model(M.NNXTied(nnx.Rngs(0)), "mxfp4")
  rep = H.report(q, M.TOKENS)
  mix = [s for s in rep.sites if s.path == "mix"]
  y1, y2 = q(M.TOKENS, quant_key=KEY), q(M.TOKENS, quant_key=KEY)
  return len(mix) == 2 and np.array_equal(y1, y2)


def _model_called_twice_in_loss():
  """Two forward passes of one model in one loss (e.g. two views): both intercepted."""
  apply, q, variables = H.built_linen(M.Gated(), "mxfp4", M.X)
  loss = lambda v: jnp.sum(q(v, M.X, quant_key=KEY) * q(v, 2 * M.X, quant_key=KEY))
  g = jax.grad(loss)(variables)
  rep = H.report(quant.quantized(lambda v, x: apply(v, x) * apply(v, 2 * x), "mxfp4"), variables, M.X)
  return len(rep.sites) == 6 and all(bool(jnp.any(x != 0)) for x in jax.tree.leaves(g))


def _mixed_dense_einsum():
  rep = H.linen_report(M.MixedDenseEinsum(), "mxfp4", M.X)
  return [(s.path, s.weight, s.status) for s in rep.sites] == [
      ("dense", "rhs", "quantized"), ("einsum", "rhs", "quantized"), ("out", "rhs", "quantized")]


def _mixed_fp32():
  return H.fp32_bit_identical(H.built_linen(M.MixedDenseEinsum(), "fp32", M.X), M.X)


def _tied_encoder():
  rep = H.linen_report(M.TiedEncoderDecoder(), "mxfp4", M.X)
  return [(s.path, s.weight, s.status) for s in rep.sites] == [
      ("tied", "rhs", "quantized"), ("tied", "rhs", "quantized")]


def _scalar_feature_dense():
  """A Dense on one scalar feature (K = 1) is kept with the reason, never zeroed."""
  model = nn.Dense(8)
  x = jnp.linspace(-1, 1, 16)[:, None]
  apply, q, variables = H.built_linen(model, "quartet", x)
  y, y0 = q(variables, x, quant_key=KEY), apply(variables, x)
  rep = H.linen_report(model, "quartet", x)
  s, = rep.sites
  return (s.status == "high precision" and "contraction" in s.reason
          and float(jnp.max(jnp.abs(y - y0))) < 1e-2 * float(jnp.max(jnp.abs(y0))))


def _vmap_per_example_weights():
  f = lambda p, x: jax.vmap(lambda w, xi: xi @ w)(p["w"], x)
  rep = H.report(quant.quantized(f, "mxfp4"), {"w": jnp.ones((2, D, 4))}, M.X)
  s, = rep.sites
  return s.status == "unchanged" and "batch dimensions" in s.reason


def _integer_gemm():
  f = lambda p, x: x.astype(jnp.int32) @ p["w"].astype(jnp.int32)
  rep = H.report(quant.quantized(f, "mxfp4"), {"w": jnp.ones((D, 4))}, M.X)
  return rep.sites[0].status == "unchanged"


def _nnx_lm_default():
  rep = H.nnx_report(M.NNXLM(nnx.Rngs(0)), "mxfp4", M.TOKENS)
  st = H.status(rep)
  return (st["head"][0] == "high precision" and st["up"][0] == "quantized"
          and sum(s.weight == "none" and s.status == "high precision" for s in rep.sites) == 2)


def _jit_inside():
  f = lambda p, x: jax.jit(lambda w, x: jnp.tanh(x @ w))(p["dense"]["kernel"], x)
  p = {"dense": {"kernel": jnp.ones((D, 8))}}
  return H.fp32_bit_identical(H.built_plain(f, "fp32", p), M.X) and (
      H.report(quant.quantized(f, "mxfp4"), p, M.X).sites[0].path == "dense")


def _scanned_fp32():
  return H.fp32_bit_identical(H.built_linen(M.ScannedLM(), "fp32", M.TOKENS), M.TOKENS)


def _scanned_sites():
  st = H.status(H.linen_report(M.ScannedLM(), "mxfp4", M.TOKENS))
  return (st["layers/up"][0] == "quantized" and st["head"][0] == "high precision"
          and len(st) == 4)


def _cond_branches():
  def f(p, x, flag):
    return jax.lax.cond(flag, lambda x: x @ p["a"]["kernel"], lambda x: -(x @ p["a"]["kernel"]), x)
  p = {"a": {"kernel": jnp.ones((D, 8)) / D}}
  flag = jnp.array(True)
  ok = H.fp32_bit_identical(H.built_plain(lambda p, x: f(p, x, flag), "fp32", p), M.X)
  rep = H.report(quant.quantized(f, "mxfp4"), p, M.X, flag)
  return ok and [s.status for s in rep.sites] == ["quantized", "quantized"]


def _one_hot_embedding():
  """An embedding written as one_hot(tokens) @ table (no gather): kept like a lookup."""
  p = {"table": jax.random.normal(jax.random.key(0), (V, D))}
  f = lambda p, t: jax.nn.one_hot(t, V) @ p["table"]
  st = H.status(H.report(quant.quantized(f, "mxfp4"), p, M.TOKENS))
  return st["table"][0] == "high precision"


def _binarized_input_is_not_a_lookup():
  """(x > 0) cast to float @ W: a comparison that is not an equality, so not one-hot."""
  f = lambda p, x: (x > 0).astype(F32) @ p["proj"]["kernel"]
  st = H.status(H.report(quant.quantized(f, "mxfp4"), {"proj": {"kernel": jnp.ones((D, 8))}}, M.X))
  return st["proj"] == ("quantized", "")


def _params_as_keyword():
  q = quant.quantized(lambda params, x: x @ params["w"], "mxfp4_naive")
  q(params={"w": jnp.ones((D, 4))}, x=M.X)


def _nnx_mha():
  class Net(nnx.Module):
    def __init__(self, rngs):
      self.mha = nnx.MultiHeadAttention(2, D, D, decode=False, rngs=rngs)

    def __call__(self, x):
      return self.mha(x)

  rep = H.nnx_report(Net(nnx.Rngs(0)), "nvfp4", M.X)
  products = [s for s in rep.sites if s.weight == "none"]
  return (len(products) == 2 and all(s.status == "high precision" for s in products)
          and {s.path for s in rep.sites if s.status == "quantized"}
          == {"mha/query", "mha/key", "mha/value", "mha/out"})


def _bf16_params_fp32_compute():
  model = M.LinenLM()
  variables = jax.tree.map(lambda a: a.astype(jnp.bfloat16), model.init(jax.random.key(0), M.TOKENS))
  return H.fp32_bit_identical((model.apply, quant.quantize_model(model, "fp32").apply, variables),
                             M.TOKENS)


def _weight_on_the_left_einsum():
  f = lambda p, x: jnp.einsum("dk,btk->btd", p["proj"]["kernel"], x)
  st = H.status(H.report(quant.quantized(f, "mxfp4"), {"proj": {"kernel": jnp.ones((16, D))}}, M.X))
  return st["proj"][0] == "quantized"


def _conv_transpose():
  class Up(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.ConvTranspose(16, (3, 3), strides=(2, 2), name="up")(nn.Conv(32, (3, 3), name="c")(x))

  ok = H.fp32_bit_identical(H.built_linen(Up(), "fp32", M.IMG), M.IMG)
  st = H.status(H.linen_report(Up(), "mxfp4", M.IMG))
  return ok and st["up"][0] == "quantized" and st["c"][0] == "quantized"


def _vmapped_fp32():
  f = jax.vmap(M.plain_lm, in_axes=(None, 0))
  return H.fp32_bit_identical(H.built_plain(f, "fp32", M.plain_params()), M.TOKENS[:, None])


def _variant_and_case_in_rules():
  p = quant.QuantPolicy(recipe="mxfp4", rules=((r"mlp", "mxfp4:block_size=16"),))
  st = H.status(H.report(quant.quantized(M.plain_lm, p), M.plain_params(), M.TOKENS))
  return st["mlp/up"][0] == "quantized" and st["attn/wq"][0] == "quantized"


def _dict_output_report():
  f = lambda p, x: {"a": x @ p["a"]["w"], "b": (x @ p["b"]["w"]).sum()}
  p = {"a": {"w": jnp.ones((D, 4))}, "b": {"w": jnp.ones((D, 4))}}
  rep = H.report(quant.quantized(f, "nvfp4"), p, M.X)
  return [s.path for s in rep.sites] == ["a", "b"]


def _grad_under_bf16_model():
  apply, q, variables = H.built_linen(M.LinenLM(dtype=jnp.bfloat16), "nvfp4", M.TOKENS)
  _, g = H.value_and_grad(lambda v, t: q(v, t, quant_key=KEY), variables, M.TOKENS)
  return all(bool(jnp.all(jnp.isfinite(x))) and bool(jnp.any(x != 0)) for x in jax.tree.leaves(g))


CASES = [
    Case("fresh", "MoE: router and stacked experts", lambda _: _moe(), Holds("3 sites quantized")),
    Case("fresh", "MoE fp32", lambda _: _moe_fp32(), Holds("bit-identical")),
    Case("fresh", "gated MLP", lambda _: _gated_mlp(), Holds("gate, up, down quantized")),
    Case("fresh", "grouped, dilated, depthwise convs", lambda _: _convs(),
         Holds("stem (K=27), grouped, dilated, depthwise (K=9) quantized; head kept")),
    Case("fresh", "1x1 depthwise conv under quartet", lambda _: _depthwise_1x1_quartet(),
         Holds("kept, reason K=1")),
    Case("fresh", "convs fp32", lambda _: _convs_fp32(), Holds("bit-identical")),
    Case("fresh", "convs mxfp4 loss and gradients", lambda _: _convs_run_and_grad(),
         Holds("loss within 20%, no zero gradient")),
    Case("fresh", "jax.named_scope attention path", lambda _: _named_scope_paths(),
         Holds("encoder/act_product kept (Q K^T with no softmax after it: not attention's)")),
    Case("fresh", "plain pytree leaf names w / weight", lambda _: _plain_leaf_names(),
         Holds("mlp/up, mlp/down quantized; lm_head kept")),
    Case("fresh", "bf16 model under mxfp4", lambda _: _bf16_model_sites(),
         Holds("bf16 output, kept as given (bf16), quantized mxfp4")),
    Case("fresh", "fp16 model under nvfp4", lambda _: _fp16_model(), Holds("fp16 output, close")),
    Case("fresh", "layer applied twice", lambda _: _called_twice_per_step(),
         Holds("2 sites, reproducible")),
    Case("fresh", "model called twice in one loss", lambda _: _model_called_twice_in_loss(),
         Holds("6 sites, nonzero grads")),
    Case("fresh", "mixed Dense / Einsum / DenseGeneral", lambda _: _mixed_dense_einsum(),
         Holds("three weight sites quantized")),
    Case("fresh", "mixed Dense / Einsum fp32", lambda _: _mixed_fp32(), Holds("bit-identical")),
    Case("fresh", "encoder with tied (transposed) weights", lambda _: _tied_encoder(),
         Holds("both uses quantized as the weight")),
    Case("fresh", "Dense on one scalar feature under quartet", lambda _: _scalar_feature_dense(),
         Holds("kept with reason, close to the model")),
    Case("fresh", "per-example weights under vmap", lambda _: _vmap_per_example_weights(),
         Holds("unchanged, reason")),
    Case("fresh", "integer GEMM", lambda _: _integer_gemm(), Holds("unchanged")),
    Case("fresh", "NNX LM default keeps", lambda _: _nnx_lm_default(),
         Holds("head and products kept, up quantized")),
    Case("fresh", "jit inside the function", lambda _: _jit_inside(),
         Holds("fp32 bit-identical, path dense")),
    Case("fresh", "nn.scan + nn.remat blocks fp32", lambda _: _scanned_fp32(), Holds("bit-identical")),
    Case("fresh", "nn.scan + nn.remat blocks sites", lambda _: _scanned_sites(),
         Holds("layers/up quantized, head kept")),
    Case("fresh", "lax.cond branches", lambda _: _cond_branches(),
         Holds("fp32 bit-identical, both branches quantized")),
    Case("fresh", "one-hot embedding product", lambda _: _one_hot_embedding(),
         Holds("table kept")),
    Case("fresh", "binarized input (x > 0) @ W", lambda _: _binarized_input_is_not_a_lookup(),
         Holds("quantized")),
    Case("fresh", "params passed by keyword", lambda _: _params_as_keyword(),
         Raises(TypeError, "weights_argnums")),
    Case("fresh", "nnx.MultiHeadAttention", lambda _: _nnx_mha(),
         Holds("q/k/v/out quantized, products kept")),
    Case("fresh", "bf16 params, fp32 model, fp32 recipe", lambda _: _bf16_params_fp32_compute(),
         Holds("bit-identical")),
    Case("fresh", "weight on the left of an einsum", lambda _: _weight_on_the_left_einsum(),
         Holds("proj quantized")),
    Case("fresh", "ConvTranspose", lambda _: _conv_transpose(),
         Holds("fp32 bit-identical, up and c quantized")),
    Case("fresh", "vmap over examples, fp32", lambda _: _vmapped_fp32(), Holds("bit-identical")),
    Case("fresh", "a recipe variant in rules", lambda _: _variant_and_case_in_rules(),
         Holds("quantized")),
    Case("fresh", "upper-case recipe name in a policy",
         lambda _: quant.QuantPolicy(recipe="MXFP4"),
         Raises(ValueError, "Invalid QuantPolicy: recipe: Unknown recipe 'MXFP4'")),
    Case("fresh", "dict output", lambda _: _dict_output_report(), Holds("two sites a, b")),
    Case("fresh", "bf16 model nvfp4 gradients", lambda _: _grad_under_bf16_model(),
         Holds("finite, nonzero")),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.group}-{c.name}")
def test_intercept_case(case, tmp_path):
  check(case, lambda: case.run(tmp_path))
