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
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

from bad_input_cases import Case, Holds, Raises, check
import intercept_models as M

from lpjax import quant

KEY = jax.random.key(7)
F32 = jnp.float32
D, V = M.D, M.V


# --- helpers ------------------------------------------------------------------------------------


def _same(a, b) -> bool:
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(
      x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


def _value_and_grad(fn, params, *args):
  """Loss and gradient of a fixed scalar function of `fn`'s output (every output entry counts)."""
  def loss(p):
    y = fn(p, *args).astype(F32)
    return jnp.sum(jnp.sin(y) * jnp.arange(y.size, dtype=F32).reshape(y.shape) / y.size)
  return jax.jit(jax.value_and_grad(loss))(params)


def _linen(model, policy, *args):
  """(unwrapped apply, quantized apply, variables) of a linen model."""
  variables = model.init(jax.random.key(0), *args)
  return model.apply, quant.quantize_model(model, policy).apply, variables


def _nnx(model, policy):
  graphdef, state = nnx.split(model)
  plain = lambda s, *a: nnx.merge(graphdef, s)(*a)
  q = lambda s, *a: quant.quantize_model(nnx.merge(graphdef, s), policy)(*a, quant_key=KEY)
  return plain, q, state


def _plain(fn, policy, params):
  return fn, (lambda p, *a: quant.quantized(fn, policy)(p, *a, quant_key=KEY)), params


def _fp32_bit_identical(built, *args) -> bool:
  """`fp32` gives back the unwrapped model: loss and gradients, bit for bit."""
  plain, q, params = built
  return _same(_value_and_grad(plain, params, *args), _value_and_grad(q, params, *args))


def _report(target, *args, **kw):
  return quant.report(target, *args, quant_key=KEY, **kw)


def _status(rep) -> dict:
  """{path: (status, reason)} of a report (the last site of a path wins)."""
  return {s.path: (s.status, s.reason) for s in rep.sites}


def _kept(rep, path) -> bool:
  return _status(rep)[path][0] == "high precision"


def _linen_report(model, policy, *args):
  variables = model.init(jax.random.key(0), *args)
  return _report(quant.quantize_model(model, policy), variables, *args)


def _nnx_report(model, policy, *args):
  return _report(quant.quantize_model(model, policy), *args)


def _no_warning(call) -> bool:
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    call()
  return True


# --- item 1: fp32 gives back the model ------------------------------------------------------------


def _fp32_linen_lm(dtype=F32):
  return _fp32_bit_identical(_linen(M.LinenLM(dtype=dtype), "fp32", M.TOKENS), M.TOKENS)


def _fp32_nnx(model):
  return _fp32_bit_identical(_nnx(model, "fp32"), M.TOKENS)


def _fp32_plain(fn, params, policy="fp32"):
  return _fp32_bit_identical(_plain(fn, policy, params), M.TOKENS)


def _fp32_all_unchanged():
  rep = _linen_report(M.LinenLM(), "fp32", M.TOKENS)
  return len(rep.sites) == 10 and all(s.status == "unchanged" and s.recipe == "fp32"
                                      for s in rep.sites)


def _kept_runs_fp32_under_fp32_rule():
  """A rule that sends some layers to fp32 also lifts the kept layers it matches."""
  p = quant.QuantPolicy(recipe="mxfp4", rules=((r"attn", "fp32"),))
  return (p.recipe_for("attn/attn_scores").name, p.recipe_for("mlp/up").name,
          p.recipe_for("embed").name) == ("fp32", "mxfp4", "bf16")


def _fp16_kept_under_bf16_recipe_is_the_model():
  """bf16 recipe on a bf16 model: every site, kept or not, is the model's own GEMM."""
  rep = _linen_report(M.LinenLM(dtype=jnp.bfloat16), "bf16", M.TOKENS)
  return all(s.recipe == "bf16" for s in rep.sites)


# --- item 3: the keep list: names, case, data flow -------------------------------------------------


def _linen_auto_embed_tied_kept():
  rep = _linen_report(M.LinenLM(), "mxfp4", M.TOKENS)
  st = _status(rep)
  return st["Embed_0"][0] == "high precision" and st["Dense_0"][0] == "quantized"


class _VocabTied(nn.Module):
  """A tied embedding whose name says nothing ("vocab"): kept by the data flow."""

  @nn.compact
  def __call__(self, tokens):
    table = nn.Embed(V, D, name="vocab")
    return table.attend(nn.Dense(D, name="mix")(table(tokens)))


def _linen_tied_by_data_flow():
  st = _status(_linen_report(_VocabTied(), "mxfp4", M.TOKENS))
  return (st["vocab"][0] == "high precision" and "gather" in st["vocab"][1]
          and st["mix"][0] == "quantized")


def _case_insensitive_names():
  rep = _linen_report(M.LinenFlaxAttention(), "mxfp4", M.TOKENS)
  st = _status(rep)
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
  rep = _report(quant.quantized(M.plain_tied_lm, "mxfp4"), M.tied_params(), M.TOKENS)
  st = _status(rep)
  return st["table"][0] == "high precision" and st["mix"][0] == "quantized"


def _nnx_tied_attend():
  rep = _nnx_report(M.NNXTied(nnx.Rngs(0)), "mxfp4", M.TOKENS)
  st = _status(rep)
  return st["tok"][0] == "high precision" and st["mix"][0] == "quantized"


def _lora_merged_is_a_weight():
  """x @ (W + A @ B): the operand computed from parameters only is the weight (path "W")."""
  k = jax.random.split(jax.random.key(0), 3)
  p = {"proj": {"kernel": jax.random.normal(k[0], (D, D)), "lora_a": jax.random.normal(k[1], (D, 4)),
                "lora_b": jax.random.normal(k[2], (4, D)) * 0.01}}
  f = lambda p, x: x @ (p["proj"]["kernel"] + p["proj"]["lora_a"] @ p["proj"]["lora_b"])
  rep = _report(quant.quantized(f, "mxfp4"), p, M.X)
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
  return _no_warning(lambda: q(M.X, p)) and quant.report(q, M.X, p).sites[0].path == "dense"


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
  rep = _linen_report(M.LinenLM(), policy, M.TOKENS)
  st = _status(rep)
  return (st["Dense_0"][1:] == ("",) and st["Dense_0"][0] == "quantized"
          and st["Dense_5"][0] == "unchanged" and st["Embed_0"][0] == "unchanged")


# --- item 8: a fresh adversarial pass ------------------------------------------------------------


class _MoE(nn.Module):
  """A top-1 router (kept: a gate with few outputs still quantizes; routing reads its argmax) and
  two experts as one stacked einsum weight."""

  @nn.compact
  def __call__(self, x):
    logits = nn.Dense(2, name="router")(x)
    experts = self.param("experts", nn.initializers.normal(0.1), (2, D, D))
    y = jnp.einsum("btd,edf->btef", x, experts)
    gate = jax.nn.one_hot(jnp.argmax(logits, -1), 2) * jax.nn.softmax(logits, -1)
    return jnp.einsum("btef,bte->btf", y, gate)


def _moe():
  rep = _linen_report(_MoE(), "mxfp4", M.X)
  st = _status(rep)
  return (st["router"][0] == "quantized" and st["experts"][0] == "quantized"
          and len(rep.sites) == 3)


def _moe_fp32():
  return _fp32_bit_identical(_linen(_MoE(), "fp32", M.X), M.X)


class _Gated(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(D, name="down")(nn.silu(nn.Dense(64, name="gate")(x)) * nn.Dense(64, name="up")(x))


def _gated_mlp():
  rep = _linen_report(_Gated(), "nvfp4", M.X)
  return [(s.path, s.status) for s in rep.sites] == [
      ("gate", "quantized"), ("up", "quantized"), ("down", "quantized")]


class _Convs(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Conv(32, (3, 3), name="stem")(x)
    x = nn.Conv(32, (3, 3), feature_group_count=4, name="grouped")(x)
    x = nn.Conv(32, (3, 3), kernel_dilation=2, name="dilated")(x)
    x = nn.Conv(32, (3, 3), feature_group_count=32, name="depthwise")(x)
    return nn.Dense(10, name="head")(x.mean((1, 2)))


IMG = jax.random.normal(jax.random.key(8), (2, 8, 8, 3))


def _convs():
  rep = _linen_report(_Convs(), "mxfp4", IMG)
  st = _status(rep)
  return (all(st[n] == ("quantized", "") for n in ("stem", "grouped", "dilated", "depthwise"))
          and st["head"][0] == "high precision")


def _depthwise_1x1_quartet():
  """A 1x1 depthwise conv has K = 1: under quartet it is kept, with the reason."""
  class DW(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Conv(3, (1, 1), feature_group_count=3, name="dw")(x)

  st = _status(_linen_report(DW(), "quartet", IMG))
  return st["dw"][0] == "high precision" and "K=1" in st["dw"][1]


def _convs_fp32():
  return _fp32_bit_identical(_linen(_Convs(), "fp32", IMG), IMG)


def _convs_run_and_grad():
  apply, q, variables = _linen(_Convs(), "mxfp4", IMG)
  (l0, g0), (l1, g1) = (_value_and_grad(apply, variables, IMG),
                        _value_and_grad(lambda v, x: q(v, x, quant_key=KEY), variables, IMG))
  rel = abs(float(l1 - l0)) / abs(float(l0))
  return rel < 0.2 and all(bool(jnp.any(g != 0)) for g in jax.tree.leaves(g1))


def _named_scope_paths():
  def f(p, x):
    with jax.named_scope("encoder"):
      h = jnp.einsum("btd,bsd->bts", x @ p["enc"]["wq"], x @ p["enc"]["wk"])
    return h
  p = {"enc": {"wq": jnp.ones((D, D)), "wk": jnp.ones((D, D))}}
  rep = _report(quant.quantized(f, "mxfp4"), p, M.X)
  return [(s.path, s.status) for s in rep.sites] == [
      ("enc/wq", "quantized"), ("enc/wk", "quantized"), ("encoder/attn_scores", "high precision")]


def _plain_leaf_names():
  rep = _report(quant.quantized(M.plain_lm, "mxfp4"), M.plain_params(), M.TOKENS)
  st = _status(rep)
  return (st["mlp/up"][0] == st["mlp/down"][0] == "quantized" and st["lm_head"][0] == "high precision"
          and st["attn/wq"][0] == "quantized" and "wte" not in st)


def _bf16_model_sites():
  """A bf16 model: kept sites run bf16 (its own dtype), quantized sites mxfp4; output bf16."""
  apply, q, variables = _linen(M.LinenLM(dtype=jnp.bfloat16), "mxfp4", M.TOKENS)
  y = q(variables, M.TOKENS, quant_key=KEY)
  rep = _report(quant.quantize_model(M.LinenLM(dtype=jnp.bfloat16), "mxfp4"), variables, M.TOKENS)
  return (y.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(y.astype(F32))))
          and all(s.recipe == ("bf16" if s.status == "high precision" else "mxfp4")
                  for s in rep.sites))


def _fp16_model():
  apply, q, variables = _linen(M.LinenLM(dtype=jnp.float16), "nvfp4", M.TOKENS)
  y, y0 = q(variables, M.TOKENS, quant_key=KEY), apply(variables, M.TOKENS)
  rel = float(jnp.linalg.norm((y - y0).astype(F32)) / jnp.linalg.norm(y0.astype(F32)))
  return y.dtype == jnp.float16 and rel < 0.3


def _called_twice_per_step():
  """A layer applied twice gets a site per call, and each its own stochastic-rounding key."""
  q = quant.quantize_model(M.NNXTied(nnx.Rngs(0)), "mxfp4")
  rep = _report(q, M.TOKENS)
  mix = [s for s in rep.sites if s.path == "mix"]
  y1, y2 = q(M.TOKENS, quant_key=KEY), q(M.TOKENS, quant_key=KEY)
  return len(mix) == 2 and np.array_equal(y1, y2)


def _model_called_twice_in_loss():
  """Two forward passes of one model in one loss (e.g. two views): both intercepted."""
  apply, q, variables = _linen(_Gated(), "mxfp4", M.X)
  loss = lambda v: jnp.sum(q(v, M.X, quant_key=KEY) * q(v, 2 * M.X, quant_key=KEY))
  g = jax.grad(loss)(variables)
  rep = _report(quant.quantized(lambda v, x: apply(v, x) * apply(v, 2 * x), "mxfp4"), variables, M.X)
  return len(rep.sites) == 6 and all(bool(jnp.any(x != 0)) for x in jax.tree.leaves(g))


class _MixedDenseEinsum(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Dense(D, name="dense")(x)
    x = nn.Einsum((D, 2, 16), "btd,dhk->bthk", name="einsum")(x)
    return nn.DenseGeneral(D, axis=(-2, -1), name="out")(x)


def _mixed_dense_einsum():
  rep = _linen_report(_MixedDenseEinsum(), "mxfp4", M.X)
  return [(s.path, s.weight, s.status) for s in rep.sites] == [
      ("dense", "rhs", "quantized"), ("einsum", "rhs", "quantized"), ("out", "rhs", "quantized")]


def _mixed_fp32():
  return _fp32_bit_identical(_linen(_MixedDenseEinsum(), "fp32", M.X), M.X)


class _TiedEncoderDecoder(nn.Module):
  """An autoencoder whose decoder is the encoder's kernel transposed (tied weights)."""

  @nn.compact
  def __call__(self, x):
    w = self.param("tied", nn.initializers.normal(0.1), (D, 16))
    return jnp.tanh(x @ w) @ w.T


def _tied_encoder():
  rep = _linen_report(_TiedEncoderDecoder(), "mxfp4", M.X)
  return [(s.path, s.weight, s.status) for s in rep.sites] == [
      ("tied", "rhs", "quantized"), ("tied", "rhs", "quantized")]


def _scalar_feature_dense():
  """A Dense on one scalar feature (K = 1) is kept with the reason, never zeroed."""
  model = nn.Dense(8)
  x = jnp.linspace(-1, 1, 16)[:, None]
  apply, q, variables = _linen(model, "quartet", x)
  y, y0 = q(variables, x, quant_key=KEY), apply(variables, x)
  rep = _linen_report(model, "quartet", x)
  s, = rep.sites
  return (s.status == "high precision" and "contraction" in s.reason
          and float(jnp.max(jnp.abs(y - y0))) < 1e-2 * float(jnp.max(jnp.abs(y0))))


def _vmap_per_example_weights():
  f = lambda p, x: jax.vmap(lambda w, xi: xi @ w)(p["w"], x)
  rep = _report(quant.quantized(f, "mxfp4"), {"w": jnp.ones((2, D, 4))}, M.X)
  s, = rep.sites
  return s.status == "unchanged" and "batch dimensions" in s.reason


def _integer_gemm():
  f = lambda p, x: x.astype(jnp.int32) @ p["w"].astype(jnp.int32)
  rep = _report(quant.quantized(f, "mxfp4"), {"w": jnp.ones((D, 4))}, M.X)
  return rep.sites[0].status == "unchanged"


def _nnx_lm_default():
  rep = _nnx_report(M.NNXLM(nnx.Rngs(0)), "mxfp4", M.TOKENS)
  st = _status(rep)
  return (st["head"][0] == "high precision" and st["up"][0] == "quantized"
          and sum(s.weight == "none" and s.status == "high precision" for s in rep.sites) == 2)


def _pure_quantizes_tied():
  rep = _report(quant.quantized(M.plain_tied_lm, quant.QuantPolicy(recipe="mxfp4", pure=True)),
                M.tied_params(), M.TOKENS)
  return all(s.status == "quantized" for s in rep.sites)


def _high_precision_fp32_under_fp4():
  """high_precision="fp32" on an fp32 model: the kept sites are the model's own GEMMs."""
  rep = _linen_report(M.LinenLM(), quant.QuantPolicy(recipe="mxfp4", high_precision="fp32"), M.TOKENS)
  kept = [s for s in rep.sites if s.status != "quantized"]
  return len(kept) == 3 and all(s.status == "unchanged" and s.recipe == "fp32" for s in kept)


def _jit_inside():
  f = lambda p, x: jax.jit(lambda w, x: jnp.tanh(x @ w))(p["dense"]["kernel"], x)
  p = {"dense": {"kernel": jnp.ones((D, 8))}}
  return _fp32_bit_identical(_plain(f, "fp32", p), M.X) and (
      _report(quant.quantized(f, "mxfp4"), p, M.X).sites[0].path == "dense")


def _embedding_in_jit_tied():
  """The embedding lookup inside its own jit (no GEMM there) still marks the table."""
  def f(p, tokens):
    x = jax.jit(lambda t, i: jnp.take(t, i, axis=0))(p["table"], tokens)
    return jnp.tanh(x @ p["mix"]) @ p["table"].T
  rep = _report(quant.quantized(f, "mxfp4"), M.tied_params(), M.TOKENS)
  return _status(rep)["table"][0] == "high precision"


class _ScannedLM(nn.Module):
  """nn.scan over two remat'd blocks, auto-named Embed_0 and Dense head."""

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(V, D)(tokens)
    block = nn.remat(_Gated)
    Scanned = nn.scan(lambda m, c, _: (c + m(c), None), variable_axes={"params": 0},
                      split_rngs={"params": True}, length=2)
    x, _ = Scanned(block(name="layers"), x, None)
    return nn.Dense(V, name="head")(x)


def _scanned_fp32():
  return _fp32_bit_identical(_linen(_ScannedLM(), "fp32", M.TOKENS), M.TOKENS)


def _scanned_sites():
  st = _status(_linen_report(_ScannedLM(), "mxfp4", M.TOKENS))
  return (st["layers/up"][0] == "quantized" and st["head"][0] == "high precision"
          and len(st) == 4)


def _cond_branches():
  def f(p, x, flag):
    return jax.lax.cond(flag, lambda x: x @ p["a"]["kernel"], lambda x: -(x @ p["a"]["kernel"]), x)
  p = {"a": {"kernel": jnp.ones((D, 8)) / D}}
  flag = jnp.array(True)
  ok = _fp32_bit_identical(_plain(lambda p, x: f(p, x, flag), "fp32", p), M.X)
  rep = _report(quant.quantized(f, "mxfp4"), p, M.X, flag)
  return ok and [s.status for s in rep.sites] == ["quantized", "quantized"]


def _one_hot_embedding():
  """An embedding written as one_hot(tokens) @ table (no gather): kept like a lookup."""
  p = {"table": jax.random.normal(jax.random.key(0), (V, D))}
  f = lambda p, t: jax.nn.one_hot(t, V) @ p["table"]
  st = _status(_report(quant.quantized(f, "mxfp4"), p, M.TOKENS))
  return st["table"][0] == "high precision"


def _binarized_input_is_not_a_lookup():
  """(x > 0) cast to float @ W: a comparison that is not an equality, so not one-hot."""
  f = lambda p, x: (x > 0).astype(F32) @ p["proj"]["kernel"]
  st = _status(_report(quant.quantized(f, "mxfp4"), {"proj": {"kernel": jnp.ones((D, 8))}}, M.X))
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

  rep = _nnx_report(Net(nnx.Rngs(0)), "nvfp4", M.X)
  products = [s for s in rep.sites if s.weight == "none"]
  return (len(products) == 2 and all(s.status == "high precision" for s in products)
          and {s.path for s in rep.sites if s.status == "quantized"}
          == {"mha/query", "mha/key", "mha/value", "mha/out"})


def _bf16_params_fp32_compute():
  model = M.LinenLM()
  variables = jax.tree.map(lambda a: a.astype(jnp.bfloat16), model.init(jax.random.key(0), M.TOKENS))
  return _fp32_bit_identical((model.apply, quant.quantize_model(model, "fp32").apply, variables),
                             M.TOKENS)


def _weight_on_the_left_einsum():
  f = lambda p, x: jnp.einsum("dk,btk->btd", p["proj"]["kernel"], x)
  st = _status(_report(quant.quantized(f, "mxfp4"), {"proj": {"kernel": jnp.ones((16, D))}}, M.X))
  return st["proj"][0] == "quantized"


def _conv_transpose():
  class Up(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.ConvTranspose(16, (3, 3), strides=(2, 2), name="up")(nn.Conv(32, (3, 3), name="c")(x))

  ok = _fp32_bit_identical(_linen(Up(), "fp32", IMG), IMG)
  st = _status(_linen_report(Up(), "mxfp4", IMG))
  return ok and st["up"][0] == "quantized" and st["c"][0] == "quantized"


def _vmapped_fp32():
  f = jax.vmap(M.plain_lm, in_axes=(None, 0))
  return _fp32_bit_identical(_plain(f, "fp32", M.plain_params()), M.TOKENS[:, None])


def _variant_and_case_in_rules():
  p = quant.QuantPolicy(recipe="mxfp4", rules=((r"mlp", "mxfp4:block_size=16"),))
  st = _status(_report(quant.quantized(M.plain_lm, p), M.plain_params(), M.TOKENS))
  return st["mlp/up"][0] == "quantized" and st["attn/wq"][0] == "quantized"


def _dict_output_report():
  f = lambda p, x: {"a": x @ p["a"]["w"], "b": (x @ p["b"]["w"]).sum()}
  p = {"a": {"w": jnp.ones((D, 4))}, "b": {"w": jnp.ones((D, 4))}}
  rep = _report(quant.quantized(f, "nvfp4"), p, M.X)
  return [s.path for s in rep.sites] == ["a", "b"]


def _grad_under_bf16_model():
  apply, q, variables = _linen(M.LinenLM(dtype=jnp.bfloat16), "nvfp4", M.TOKENS)
  _, g = _value_and_grad(lambda v, t: q(v, t, quant_key=KEY), variables, M.TOKENS)
  return all(bool(jnp.all(jnp.isfinite(x))) and bool(jnp.any(x != 0)) for x in jax.tree.leaves(g))


CASES = [
    # item 1: fp32 is the model, bit for bit
    Case("fp32", "linen LM: tied Embed_0, attention, gated MLP", lambda _: _fp32_linen_lm(),
         Holds("loss and grads bit-identical")),
    Case("fp32", "linen LM in bf16", lambda _: _fp32_linen_lm(jnp.bfloat16),
         Holds("loss and grads bit-identical")),
    Case("fp32", "linen LM in fp16", lambda _: _fp32_linen_lm(jnp.float16),
         Holds("loss and grads bit-identical")),
    Case("fp32", "linen SelfAttention + LM_Head",
         lambda _: _fp32_bit_identical(_linen(M.LinenFlaxAttention(), "fp32", M.TOKENS), M.TOKENS),
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
         lambda _: _kept_runs_fp32_under_fp32_rule(), Holds("fp32 / mxfp4 / bf16")),
    Case("fp32", "high_precision='fp32' under mxfp4: kept sites are the model's",
         lambda _: _high_precision_fp32_under_fp4(), Holds("3 kept sites, unchanged fp32")),
    Case("fp32", "bf16 recipe on a bf16 model", lambda _: _fp16_kept_under_bf16_recipe_is_the_model(),
         Holds("every site bf16")),
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
    # item 8: a fresh pass
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
         Holds("encoder/attn_scores kept")),
    Case("fresh", "plain pytree leaf names w / weight", lambda _: _plain_leaf_names(),
         Holds("mlp/up, mlp/down quantized; lm_head kept")),
    Case("fresh", "bf16 model under mxfp4", lambda _: _bf16_model_sites(),
         Holds("bf16 output, kept bf16, quantized mxfp4")),
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
