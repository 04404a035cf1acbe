"""The interception's case table (issue 48, items 1-8 and a fresh adversarial pass): user models
(linen, NNX, plain JAX) through `quant.quantized` / `quant.quantize_model`, each row with its
expected outcome: an exception and a message substring, or a property that holds.

Properties are checked against independent references: the unwrapped model (bit for bit, for
"fp32"), and the report's per-site status and reason. The models are in intercept_models.py;
each is tiny, so a row costs a compile or two. Short contractions (item 2) for every preset are
in tests/quant/test_intercept_short_k.py.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn
from flax import nnx

from bad_input_cases import Case, Holds, Raises, check
import intercept_checks as H
import intercept_models as M

from lpjax import quant

KEY, F32 = H.KEY, H.F32
D, V = M.D, M.V


# --- item 1: fp32 gives back the model ------------------------------------------------------------


def _fp32_linen_lm(dtype=F32):
  return H.fp32_bit_identical(H.built_linen(M.LinenLM(dtype=dtype), "fp32", M.TOKENS), M.TOKENS)


def _fp32_nnx(model):
  return H.fp32_bit_identical(H.built_nnx(model, "fp32"), M.TOKENS)


def _fp32_plain(fn, params, policy="fp32"):
  return H.fp32_bit_identical(H.built_plain(fn, policy, params), M.TOKENS)


def _fp32_all_unchanged():
  rep = H.linen_report(M.LinenLM(), "fp32", M.TOKENS)
  return len(rep.sites) == 10 and all(s.status == "unchanged" and s.recipe == "fp32"
                                      for s in rep.sites)


def _kept_runs_fp32_under_fp32_rule():
  """A rule that sends some layers to fp32 also lifts the kept layers it matches."""
  p = quant.QuantPolicy(recipe="mxfp4", rules=((r"attn", "fp32"),))
  return (p.recipe_for("attn/attn_scores").name, p.recipe_for("mlp/up").name,
          p.recipe_for("embed").name) == ("fp32", "mxfp4", "auto")


def _fp16_kept_under_bf16_recipe_is_the_model():
  """bf16 recipe on a bf16 model: every site runs bf16, the kept ones as given (the model's own)."""
  rep = H.linen_report(M.LinenLM(dtype=jnp.bfloat16), "bf16", M.TOKENS)
  return all(s.recipe == ("auto" if s.reason else "bf16") for s in rep.sites) and any(
      s.recipe == "auto" and s.status == "unchanged" for s in rep.sites)


# --- item 3: the keep list: names, case, data flow -------------------------------------------------


def _linen_auto_embed_tied_kept():
  rep = H.linen_report(M.LinenLM(), "mxfp4", M.TOKENS)
  st = H.status(rep)
  return st["Embed_0"][0] == "high precision" and st["Dense_0"][0] == "quantized"


class _VocabTied(nn.Module):
  """A tied embedding whose name says nothing ("vocab"): kept by the data flow."""

  @nn.compact
  def __call__(self, tokens):
    table = nn.Embed(V, D, name="vocab")
    return table.attend(nn.Dense(D, name="mix")(table(tokens)))


def _linen_tied_by_data_flow():
  st = H.status(H.linen_report(_VocabTied(), "mxfp4", M.TOKENS))
  return (st["vocab"][0] == "high precision" and "gather" in st["vocab"][1]
          and st["mix"][0] == "quantized")


def _case_insensitive_names():
  rep = H.linen_report(M.LinenFlaxAttention(), "mxfp4", M.TOKENS)
  st = H.status(rep)
  return (st["LM_Head"][0] == "high precision"
          and st["MultiHeadDotProductAttention_0/query"][0] == "quantized"
          and [s.status for s in rep.sites if s.weight == "none"] == ["high precision"] * 2)


def _default_regexes():
  p = quant.QuantPolicy(recipe="mxfp4")
  kept = ["Embed_0", "embed", "token_embed", "LM_Head", "Head_1", "model/WTE", "blocks/0/LayerNorm_0",
          "attn/ATTN_SCORES"]
  not_kept = ["Dense_0", "mlp/up", "headless/up", "blocks/0/heads_proj"]
  return (all(p.kept_high_precision(x) for x in kept)
          and not any(p.kept_high_precision(x) for x in not_kept))


def _plain_tied_by_data_flow():
  rep = H.report(quant.quantized(M.plain_tied_lm, "mxfp4"), M.tied_params(), M.TOKENS)
  st = H.status(rep)
  return st["table"][0] == "high precision" and st["mix"][0] == "quantized"


def _nnx_tied_attend():
  rep = H.nnx_report(M.NNXTied(nnx.Rngs(0)), "mxfp4", M.TOKENS)
  st = H.status(rep)
  return st["tok"][0] == "high precision" and st["mix"][0] == "quantized"


def _lora_merged_is_a_weight():
  """x @ (W + A @ B): the operand computed from parameters only is the weight (path "W")."""
  k = jax.random.split(jax.random.key(0), 3)
  p = {"proj": {"kernel": jax.random.normal(k[0], (D, D)), "lora_a": jax.random.normal(k[1], (D, 4)),
                "lora_b": jax.random.normal(k[2], (4, D)) * 0.01}}
  f = lambda p, x: x @ (p["proj"]["kernel"] + p["proj"]["lora_a"] @ p["proj"]["lora_b"])
  rep = H.report(quant.quantized(f, "mxfp4"), p, M.X)
  sites = [(s.path, s.weight, s.status) for s in rep.sites]
  return (sites == [("proj/lora_b", "both", "unchanged"), ("proj", "rhs", "quantized")]
          and "LoRA" in rep.sites[0].reason)


# --- items 4-7: report, weights_argnums, policy validation, wrappers -------------------------------


def _report_static_arg():
  f = lambda p, x, act: getattr(jnp, act)(x @ p["dense"]["kernel"])
  p = {"dense": {"kernel": jnp.ones((D, 4))}}
  q = quant.quantized(f, "mxfp4_naive")
  out = q(p, M.X, "tanh")
  rep = quant.report(q, p, M.X, "tanh")
  return out.shape == (2, M.T, 4) and [s.path for s in rep.sites] == ["dense"]


def _params_second():
  f = lambda x, p: x @ p["dense"]["kernel"]
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # the warning, raised, is what the row checks
    quant.quantized(f, "mxfp4_naive")(M.X, {"dense": {"kernel": jnp.ones((D, 4))}})


def _params_second_fixed():
  f = lambda x, p: x @ p["dense"]["kernel"]
  q = quant.quantized(f, "mxfp4_naive", weights_argnums=1)
  p = {"dense": {"kernel": jnp.ones((D, 4))}}
  return H.no_warning(lambda: q(M.X, p)) and quant.report(q, M.X, p).sites[0].path == "dense"


def _missing_weights_argument():
  quant.quantized(lambda p, x: x @ p, "mxfp4_naive", weights_argnums=2)(jnp.ones((D, 4)), M.X)


def _bad_rule_regex():
  quant.QuantPolicy(recipe="mxfp4", rules=((r"mlp/(up", "bf16"),))


def _unknown_high_precision():
  quant.QuantPolicy(recipe="mxfp4", high_precision="bf61")


def _several_problems_one_message():
  try:
    quant.QuantPolicy(recipe="mxfp5", rules=((r"[", "bf16"),), keep_last_fraction=1.5)
  except ValueError as e:
    m = str(e)
    return all(w in m for w in ("recipe: Unknown recipe 'mxfp5'", "rules[0] '['",
                                "keep_last_fraction"))
  return False


def _quantized_on_linen_module():
  quant.quantized(M.LinenLM(), "mxfp4")


def _quantized_on_nnx_module():
  quant.quantized(M.NNXTied(nnx.Rngs(0)), "mxfp4")


def _linen_submodule():
  class Outer(nn.Module):
    @nn.compact
    def __call__(self, x):
      return quant.quantize_model(nn.Dense(4), "mxfp4")(x)

  Outer().init(jax.random.key(0), M.X)


def _part_of_a_model_by_rules():
  """What the submodule error says to do: quantize the whole model, rules pick the part."""
  policy = quant.QuantPolicy(recipe="fp32", rules=((r"^Dense_[0-3](/|$)", "mxfp4"),))
  rep = H.linen_report(M.LinenLM(), policy, M.TOKENS)
  st = H.status(rep)
  return (st["Dense_0"][1:] == ("",) and st["Dense_0"][0] == "quantized"
          and st["Dense_5"][0] == "unchanged" and st["Embed_0"][0] == "unchanged")


def _high_precision_fp32_under_fp4():
  """high_precision="fp32" on an fp32 model: the kept sites are the model's own GEMMs."""
  rep = H.linen_report(M.LinenLM(), quant.QuantPolicy(recipe="mxfp4", high_precision="fp32"), M.TOKENS)
  kept = [s for s in rep.sites if s.status != "quantized"]
  return len(kept) == 3 and all(s.status == "high precision" and s.recipe == "fp32"
                                and s.reason.endswith("fp32 recipe: the original op") for s in kept)


def _embedding_in_jit_tied():
  """The embedding lookup inside its own jit (no GEMM there) still marks the table."""
  def f(p, tokens):
    x = jax.jit(lambda t, i: jnp.take(t, i, axis=0))(p["table"], tokens)
    return jnp.tanh(x @ p["mix"]) @ p["table"].T
  rep = H.report(quant.quantized(f, "mxfp4"), M.tied_params(), M.TOKENS)
  return H.status(rep)["table"][0] == "high precision"


def _pure_quantizes_tied():
  rep = H.report(quant.quantized(M.plain_tied_lm, quant.QuantPolicy(recipe="mxfp4", pure=True)),
                M.tied_params(), M.TOKENS)
  return all(s.status == "quantized" for s in rep.sites)


CASES = [
    # item 1: fp32 is the model, bit for bit
    Case("fp32", "linen LM: tied Embed_0, attention, gated MLP", lambda _: _fp32_linen_lm(),
         Holds("loss and grads bit-identical")),
    Case("fp32", "linen LM in bf16", lambda _: _fp32_linen_lm(jnp.bfloat16),
         Holds("loss and grads bit-identical")),
    Case("fp32", "linen LM in fp16", lambda _: _fp32_linen_lm(jnp.float16),
         Holds("loss and grads bit-identical")),
    Case("fp32", "linen SelfAttention + LM_Head",
         lambda _: H.fp32_bit_identical(H.built_linen(M.LinenFlaxAttention(), "fp32", M.TOKENS), M.TOKENS),
         Holds("loss and grads bit-identical")),
    Case("fp32", "NNX LM with head", lambda _: _fp32_nnx(M.NNXLM(nnx.Rngs(0))),
         Holds("loss and grads bit-identical")),
    Case("fp32", "NNX tied attend, layer used twice", lambda _: _fp32_nnx(M.NNXTied(nnx.Rngs(0))),
         Holds("loss and grads bit-identical")),
    Case("fp32", "NNX LM in bf16", lambda _: _fp32_nnx(M.NNXLM(nnx.Rngs(0), dtype=jnp.bfloat16)),
         Holds("loss and grads bit-identical")),
    Case("fp32", "plain LM", lambda _: _fp32_plain(M.plain_lm, M.plain_params()),
         Holds("loss and grads bit-identical")),
    Case("fp32", "plain LM with bf16 params",
         lambda _: _fp32_plain(M.plain_lm, M.plain_params(dtype=jnp.bfloat16)),
         Holds("loss and grads bit-identical")),
    Case("fp32", "plain tied LM", lambda _: _fp32_plain(M.plain_tied_lm, M.tied_params()),
         Holds("loss and grads bit-identical")),
    Case("fp32", "QuantPolicy(recipe='fp32') with high_precision='bf16'",
         lambda _: _fp32_plain(M.plain_lm, M.plain_params(),
                               quant.QuantPolicy(recipe="fp32", high_precision="bf16")),
         Holds("loss and grads bit-identical")),
    Case("fp32", "report: every site unchanged, recipe fp32", lambda _: _fp32_all_unchanged(),
         Holds("10 sites, all unchanged fp32")),
    Case("fp32", "a rule to fp32 lifts the kept layers it matches",
         lambda _: _kept_runs_fp32_under_fp32_rule(), Holds("fp32 / mxfp4 / auto")),
    Case("fp32", "high_precision='fp32' under mxfp4: kept sites are the model's",
         lambda _: _high_precision_fp32_under_fp4(), Holds("3 kept sites, fp32: the original op")),
    Case("fp32", "bf16 recipe on a bf16 model", lambda _: _fp16_kept_under_bf16_recipe_is_the_model(),
         Holds("every site bf16, kept ones as given")),
    # item 3: what the defaults keep
    Case("keep", "linen auto-named Embed_0 tied through attend", lambda _: _linen_auto_embed_tied_kept(),
         Holds("Embed_0 kept (gather), Dense_0 quantized")),
    Case("keep", "linen tied embedding named 'vocab'", lambda _: _linen_tied_by_data_flow(),
         Holds("vocab kept (gather), mix quantized")),
    Case("keep", "LM_Head, token_embed, SelfAttention products", lambda _: _case_insensitive_names(),
         Holds("LM_Head kept, query quantized, products kept")),
    Case("keep", "default regexes: case and auto-names", lambda _: _default_regexes(),
         Holds("kept / not kept as listed")),
    Case("keep", "plain tied table named 'table'", lambda _: _plain_tied_by_data_flow(),
         Holds("table kept by data flow, mix quantized")),
    Case("keep", "NNX tied attend", lambda _: _nnx_tied_attend(), Holds("tok kept, mix quantized")),
    Case("keep", "embedding lookup inside its own jit", lambda _: _embedding_in_jit_tied(),
         Holds("table kept")),
    Case("keep", "merged LoRA x @ (W + A @ B)", lambda _: _lora_merged_is_a_weight(),
         Holds("A @ B unchanged (both parameters), proj quantized as a weight")),
    Case("keep", "pure=True quantizes the tied head", lambda _: _pure_quantizes_tied(),
         Holds("every site quantized")),
    # items 4-7
    Case("report", "static string argument", lambda _: _report_static_arg(),
         Holds("call and report work")),
    Case("weights", "params passed second", lambda _: _params_second(),
         Raises(UserWarning, "weights_argnums")),
    Case("weights", "params second with weights_argnums=1", lambda _: _params_second_fixed(),
         Holds("no warning, path 'dense'")),
    Case("weights", "weights_argnums past the arguments", lambda _: _missing_weights_argument(),
         Raises(TypeError, "weights_argnums=(2,)")),
    Case("policy", "bad regex in rules", lambda _: _bad_rule_regex(),
         Raises(ValueError, "rules[0] 'mlp/(up': bad regex")),
    Case("policy", "unknown high_precision", lambda _: _unknown_high_precision(),
         Raises(ValueError, "high_precision: Unknown recipe 'bf61'")),
    Case("policy", "several problems in one message", lambda _: _several_problems_one_message(),
         Holds("all three named")),
    Case("wrapper", "quantized(linen module)", lambda _: _quantized_on_linen_module(),
         Raises(TypeError, "quantize_model(model, policy)")),
    Case("wrapper", "quantized(nnx module)", lambda _: _quantized_on_nnx_module(),
         Raises(TypeError, "quantize_model(model, policy)")),
    Case("wrapper", "quantize_model linen module as a submodule", lambda _: _linen_submodule(),
         Raises(TypeError, "rules=")),
    Case("wrapper", "part of a model by rules (recipe fp32 + rule)", lambda _: _part_of_a_model_by_rules(),
         Holds("Dense_0 quantized, Dense_5 and Embed_0 unchanged")),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.group}-{c.name}")
def test_intercept_case(case, tmp_path):
  check(case, lambda: case.run(tmp_path))
