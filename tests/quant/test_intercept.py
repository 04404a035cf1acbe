"""The interception (`quant.quantized`, `quant.quantize_model`, `quant.report`) against
independent references: lpjax's own LLaMA (one GEMM path, two ways in), the unintercepted
model, `quant.dot_general` called by hand, and per-example loops."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

from lpjax import quant
from lpjax.models import llama
from plain_llama import PlainLlama

CFG = llama.LlamaConfig(vocab_size=61, hidden=64, intermediate=96, heads=4, layers=3,
                        max_seq_len=16)
TOKENS = jax.random.randint(jax.random.key(3), (2, 16), 0, CFG.vocab_size)
KEY = jax.random.key(7)


def _same(a, b) -> bool:
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y))
                                    for x, y in zip(la, lb))


def _lpjax_and_plain(policy, scan_plain=True):
  """(loss and grads of lpjax's LLaMA, the same of the plain-Flax LLaMA intercepted), on the
  same weights (lpjax's init loaded into the plain model), tokens and key."""
  graphdef, _ = llama.abstract_model(CFG, policy)
  params = llama.init_params(CFG, jax.random.key(0), policy)
  lp = jax.jit(jax.value_and_grad(
      lambda p: llama.apply(graphdef, CFG, p, TOKENS, None, KEY).sum()))(params)
  plain = PlainLlama(CFG, scan=scan_plain, rngs=nnx.Rngs(0))
  if scan_plain == CFG.scanned(policy):
    nnx.update(plain, params)
  else:  # lpjax's model unrolled its blocks: stack them the way the plain model scans them
    flat = nnx.to_flat_state(params)
    stacked = {}
    for path, v in flat:
      if path[0] == "layers":
        stacked.setdefault(path[:1] + path[2:], []).append((path[1], v.get_value()))
    state = nnx.state(plain, nnx.Param)
    for path, v in nnx.to_flat_state(state):
      if path[0] == "layers":
        v.set_value(jnp.stack([x for _, x in sorted(stacked[path])]))
      else:
        v.set_value(dict(flat)[path].get_value())
    nnx.update(plain, state)
  pg, pstate = nnx.split(plain, nnx.Param)

  def loss(state):
    return quant.quantize_model(nnx.merge(pg, state), policy)(TOKENS, quant_key=KEY).sum()

  ours = jax.jit(jax.value_and_grad(loss))(pstate)
  return lp, ours, params


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["mxfp4", "nvfp4", "quartet", "nvfp4_4over6", "quartet2"])
def test_plain_flax_llama_is_bit_identical_to_lpjax_llama(recipe):
  (loss_a, grads_a), (loss_b, grads_b), _ = _lpjax_and_plain(quant.QuantPolicy.from_settings(recipe))
  assert float(loss_a) == float(loss_b)
  grads_b = nnx.to_flat_state(grads_b)
  grads_a = dict(nnx.to_flat_state(grads_a))
  assert len(grads_a) == len(grads_b) == 3 + 9
  for path, g in grads_b:
    assert np.array_equal(np.asarray(g.get_value()), np.asarray(grads_a[path].get_value())), path


def test_kept_blocks_unroll_the_scan_and_match_lpjax_unrolled_llama():
  """keep_first / keep_last: lpjax's LLaMA unrolls its blocks; the intercepted plain model's
  nnx.scan is unrolled by the interception so that each block gets its own recipe."""
  policy = quant.QuantPolicy.from_settings("mxfp4", keep_first=1, keep_last=1)
  (loss_a, _), (loss_b, _), _ = _lpjax_and_plain(policy, scan_plain=True)
  assert float(loss_a) == float(loss_b)
  plain = PlainLlama(CFG, scan=True, rngs=nnx.Rngs(0))
  rep = quant.report(quant.quantize_model(plain, policy), TOKENS, quant_key=KEY)
  q_proj = {s.block: s.recipe for s in rep.sites if s.path == "layers/attn/q_proj"}
  assert q_proj == {"0": "auto", "1": "mxfp4", "2": "auto"}  # kept blocks: as given (fp32)
  bf16 = quant.QuantPolicy.from_settings("mxfp4", keep_first=1, keep_last=1, high_precision="bf16")
  (loss_a, _), (loss_b, _), _ = _lpjax_and_plain(bf16, scan_plain=True)
  assert float(loss_a) == float(loss_b)


def test_unquantized_paths_are_bit_identical_to_the_model_without_interception():
  plain = PlainLlama(CFG, scan=True, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(plain, nnx.Param)
  fp32 = quant.QuantPolicy(recipe="fp32", high_precision="fp32")
  f = lambda s: nnx.merge(graphdef, s)(TOKENS).sum()
  g = lambda s: quant.quantize_model(nnx.merge(graphdef, s), fp32)(TOKENS).sum()
  assert _same(jax.jit(jax.value_and_grad(f))(state), jax.jit(jax.value_and_grad(g))(state))
  rep = quant.report(quant.quantize_model(plain, fp32), TOKENS)
  assert len(rep.sites) == 10 and all(s.status == "unchanged" for s in rep.sites)


def test_report_names_attention_products_and_the_weight_operand():
  plain = PlainLlama(CFG, scan=False, rngs=nnx.Rngs(0))
  rep = quant.report(quant.quantize_model(plain, "nvfp4"), TOKENS, quant_key=KEY)
  rows = {(s.path, s.block): s for s in rep.sites}
  assert len(rep.sites) == 3 * 9 + 1
  scores, values = rows[("layers/1/attn/attn_scores", "1")], rows[("layers/1/attn/attn_values", "1")]
  assert scores.weight == values.weight == "none" and scores.recipe == values.recipe == "auto"
  up = rows[("layers/2/mlp/up_proj", "2")]
  assert (up.weight, up.weight_path, up.recipe, up.status) == (
      "rhs", "layers/2/mlp/up_proj/kernel", "nvfp4", "quantized")
  assert rows[("lm_head", "")].recipe == "auto"
  assert rows[("lm_head", "")].reason == "kept by the policy; the original op (operands as given)"
  assert "28 GEMM call sites: 21 quantized, 7 high precision, 0 unchanged" in str(rep)


def test_the_weight_is_found_from_the_params_not_from_argument_order():
  """W (N, K) as the lhs of the product: the interception runs it as the recipe's W, so NVFP4
  gives it 16x16 blocks; the reference is quant.dot_general with the operands in recipe order."""
  x = jax.random.normal(jax.random.key(1), (32, 64))
  w = jax.random.normal(jax.random.key(2), (48, 64))
  policy = quant.QuantPolicy(recipe="nvfp4")
  f = quant.quantized(lambda p, x: jnp.dot(p["proj"]["w"], x.T), policy)
  got = f({"proj": {"w": w}}, x, quant_key=KEY)
  key = policy.site_key(KEY, "proj")
  dn = (((1,), (1,)), ((), ()))
  want = quant.dot_general(x, w, dn, "nvfp4", key=key).T
  wrong = quant.dot_general(w, x, dn, "nvfp4", key=key)  # x treated as the weight
  assert np.array_equal(got, want)
  assert not np.array_equal(got, wrong)
  site, = quant.report(f, {"proj": {"w": w}}, x, quant_key=KEY).sites
  assert (site.path, site.weight) == ("proj", "lhs")


def test_keys_are_reproducible_and_no_two_sites_share_bits():
  w = jax.random.normal(jax.random.key(1), (64, 64))
  x = jax.random.normal(jax.random.key(2), (8, 64))

  def f(p, x):  # the same weight values at two paths, and one layer applied twice
    return x @ p["a"]["w"], x @ p["b"]["w"], x @ p["a"]["w"]

  qf = quant.quantized(f, "mxfp4")
  a, b, a2 = qf({"a": {"w": w}, "b": {"w": w}}, x, quant_key=KEY)
  again = qf({"a": {"w": w}, "b": {"w": w}}, x, quant_key=KEY)
  assert _same((a, b, a2), again)
  assert not np.array_equal(a, b) and not np.array_equal(a, a2)
  other = qf({"a": {"w": w}, "b": {"w": w}}, x, quant_key=jax.random.key(8))[0]
  assert not np.array_equal(a, other)
  with pytest.raises(ValueError, match=r"GEMM at 'a' runs recipe mxfp4.*quant_key"):
    qf({"a": {"w": w}, "b": {"w": w}}, x)


def test_unattributable_gemms_keep_their_op_and_are_listed():
  w = jax.random.normal(jax.random.key(1), (4, 16, 16))
  x = jax.random.normal(jax.random.key(2), (4, 2, 16))

  @jax.custom_jvp
  def custom(a, b):
    return a @ b
  custom.defjvp(lambda p, t: (custom(*p), t[0] @ p[1] + p[0] @ t[1]))

  def f(p, x):
    per_example = jnp.einsum("bmk,bkn->bmn", x, p["w"])  # a weight with batch dims
    ints = jax.lax.dot(x[0].astype(jnp.int8), p["w"][0].astype(jnp.int8),
                       preferred_element_type=jnp.int32)
    both = p["w"][0] @ p["w"][1]
    looped = jax.lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1] @ p["w"][c[0]]),
                                (0, x[0]))[1]
    return per_example, ints, both, custom(x[0], p["w"][2]), looped

  qf = quant.quantized(f, "mxfp4_naive")
  got = qf({"w": w}, x)
  assert _same(got, f({"w": w}, x))  # all of them ran as written
  reasons = [s.reason for s in quant.report(qf, {"w": w}, x).sites]
  assert any("batch dimensions" in r for r in reasons)
  assert any("integer" in r for r in reasons)
  assert any("both operands are parameters" in r for r in reasons)
  assert any("custom_jvp" in r for r in reasons)
  assert any("while" in r for r in reasons)
  assert len(reasons) == 5 and all(reasons)


def test_vmap_jit_grad_and_checkpoint():
  w = {"dense": {"kernel": jax.random.normal(jax.random.key(1), (64, 32))}}
  xs = jax.random.normal(jax.random.key(2), (3, 4, 64))
  loss = lambda p, x: jnp.sum(jnp.tanh(x @ p["dense"]["kernel"]) ** 2)
  qloss = quant.quantized(loss, "mxfp4_naive")
  per_example = jnp.stack([qloss(w, x) for x in xs])
  assert np.array_equal(jax.vmap(qloss, in_axes=(None, 0))(w, xs), per_example)
  remat = quant.quantized(jax.checkpoint(loss), "mxfp4_naive")
  g1 = jax.jit(jax.grad(qloss))(w, xs[0])
  assert _same(jax.jit(jax.grad(remat))(w, xs[0]), g1)
  manual = jax.grad(lambda p: jnp.sum(jnp.tanh(quant.dot_general(
      xs[0], p["dense"]["kernel"], (((1,), (0,)), ((), ())), "mxfp4_naive")) ** 2))(w)
  assert _same(g1, manual)


class _LinenBlock(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.MultiHeadDotProductAttention(num_heads=2, name="attn")(x)
    return x + nn.Dense(32, name="mlp")(nn.gelu(nn.Dense(64, name="up")(h)))


class _LinenModel(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Dense(32, name="embed_proj")(x)
    Scanned = nn.scan(lambda m, c, _: (m(c), None), variable_axes={"params": 0},
                      split_rngs={"params": True}, length=2)
    x, _ = Scanned(_LinenBlock(name="layers"), x, None)
    return nn.Conv(8, (3,), name="head_conv")(x)


def test_linen_model_apply_and_report():
  model = _LinenModel()
  x = jax.random.normal(jax.random.key(1), (2, 8, 16))
  variables = model.init(jax.random.key(0), x)
  qmodel = quant.quantize_model(model, quant.QuantPolicy(recipe="mxfp4_naive", keep_high_precision=()))
  assert jax.tree.structure(qmodel.init(jax.random.key(0), x)) == jax.tree.structure(variables)
  y = jax.jit(qmodel.apply)(variables, x)
  assert y.shape == (2, 8, 8) and not np.array_equal(y, model.apply(variables, x))
  rep = quant.report(qmodel, variables, x)
  paths = [s.path for s in rep.sites]
  assert paths[0] == "embed_proj" and paths[-1] == "head_conv" and rep.sites[-1].op == "conv_general_dilated"
  assert "layers/attn/query" in paths and "layers/up" in paths
  products = [s for s in rep.sites if s.weight == "none"]
  assert [s.path.rsplit("/", 1)[-1] for s in products] == ["attn_scores", "attn_values"]
  assert all(s.block == "scan" for s in rep.sites if s.path.startswith("layers/"))
  default = quant.quantize_model(model, "mxfp4_naive")  # the default keeps: attention products, embed
  kept = {s.path for s in quant.report(default, variables, x).sites if s.status == "high precision"}
  assert {"embed_proj"} | {s.path for s in products} <= kept


def test_nnx_model_state_updates_and_rngs_stream():
  class Net(nnx.Module):
    def __init__(self, rngs):
      self.up, self.bn = nnx.Linear(16, 32, rngs=rngs), nnx.BatchNorm(32, rngs=rngs)

    def __call__(self, x):
      return self.bn(self.up(x))

  net = Net(nnx.Rngs(0))
  q = quant.quantize_model(net, "mxfp4", rngs=nnx.Rngs(quant=3))
  x = jax.random.normal(jax.random.key(1), (8, 16))
  y1, y2 = q(x), q(x)
  assert not np.array_equal(y1, y2)  # a fresh SR key per call (and updated batch statistics)
  assert not np.array_equal(net.bn.mean[...], jnp.zeros(32))  # the wrapped model's state moved
  step = nnx.jit(lambda m, x: nnx.grad(lambda m: jnp.sum(m(x) ** 2))(m))
  grads = step(q, x)
  assert grads["model"]["up"]["kernel"][...].shape == (16, 32)


def test_remat_blocks_match_lpjax_llama_with_remat():
  """nnx.remat around each scanned block (a checkpoint inside the scan) is rewritten inside."""
  cfg = CFG.__class__(**{**CFG.__dict__, "remat": True})
  policy = quant.QuantPolicy.from_settings("mxfp4")
  graphdef, _ = llama.abstract_model(cfg, policy)
  params = llama.init_params(cfg, jax.random.key(0), policy)
  want = jax.jit(lambda p: llama.apply(graphdef, cfg, p, TOKENS, None, KEY).sum())(params)
  plain = PlainLlama(cfg, scan=True, remat=True, rngs=nnx.Rngs(0))
  nnx.update(plain, params)
  got = quant.quantize_model(plain, policy)(TOKENS, quant_key=KEY).sum()
  assert float(got) == float(want)


def test_inside_shard_map_each_shard_runs_the_intercepted_function():
  from jax.sharding import Mesh, PartitionSpec as P
  mesh = Mesh(np.array(jax.devices()), ("data",))
  w = {"dense": {"kernel": jax.random.normal(jax.random.key(1), (64, 32))}}
  x = jax.random.normal(jax.random.key(2), (8, 4, 64))
  qf = quant.quantized(lambda p, x: jnp.tanh(x @ p["dense"]["kernel"]), "mxfp4_naive")
  sharded = jax.jit(jax.shard_map(lambda p, x: qf(p, x[0])[None], mesh=mesh,
                                  in_specs=(P(), P("data")), out_specs=P("data")))
  assert np.array_equal(sharded(w, x), jnp.stack([qf(w, xi) for xi in x]))


def test_computed_weights_and_parameter_names_are_sites():
  """A weight computed from parameters alone (weight normalisation) is still the weight; a
  parameter with its own name (not "kernel") names its own site."""
  class Net(nnx.Module):
    def __init__(self, rngs):
      self.wq = nnx.Param(jax.random.normal(rngs.params(), (64, 64)))
      self.wk = nnx.Param(jax.random.normal(rngs.params(), (64, 64)))
      self.g = nnx.Param(jnp.ones((64,)))

    def __call__(self, x):
      wk = self.wk[...] * (self.g[...] / jnp.linalg.norm(self.wk[...], axis=0))
      return (x @ self.wq[...]) @ wk

  rep = quant.report(quant.quantize_model(Net(nnx.Rngs(0)), "mxfp4_naive"), jnp.ones((4, 64)))
  assert [(s.path, s.weight, s.recipe) for s in rep.sites] == [
      ("wq", "rhs", "mxfp4_naive"), ("wk", "rhs", "mxfp4_naive")]


def test_linen_self_attention_products_are_named_once_under_the_module():
  """linen's SelfAttention.__call__ calls its parent class's __call__, so the name stack holds
  the module twice ("SelfAttention_0/SelfAttention_0/..."); its products are named once."""

  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.SelfAttention(num_heads=2)(nn.Dense(32)(x))

  x = jnp.ones((2, 8, 16))
  variables = Model().init(jax.random.key(0), x)
  report = quant.report(quant.quantize_model(Model(), "mxfp4_naive").apply, variables, x)
  assert [s.path for s in report.sites] == [
      "Dense_0", "SelfAttention_0/query", "SelfAttention_0/key", "SelfAttention_0/value",
      "SelfAttention_0/attn_scores", "SelfAttention_0/attn_values", "SelfAttention_0/out"]
