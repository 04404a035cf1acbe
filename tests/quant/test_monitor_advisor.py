"""lpjax.quant.site_stats on lpjax's own LLaMA (scanned blocks, one row per block, the plain
run's bits) and lpjax.quant.advise on the planted-outlier MLP (monitor_mlp.py): the outlier site
kept, the loss gap closed, FLOPs budgets and budget errors. The other site_stats tests are in
test_monitor.py (two files, so that `pytest --dist loadfile` runs them side by side)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from monitor_mlp import mlp_batch, mlp_loss, mlp_params

from lpjax import quant


def test_lpjax_llama_scanned_blocks_one_row_per_block_and_the_same_bits():
  from lpjax.models import llama
  cfg = llama.LlamaConfig(vocab_size=64, hidden=64, intermediate=128, heads=2, layers=2,
                          max_seq_len=8)
  policy = quant.QuantPolicy(recipe="mxfp4_naive")
  graphdef, _ = llama.abstract_model(cfg, policy)
  params = llama.init_params(cfg, jax.random.key(0), policy)
  tokens = jax.random.randint(jax.random.key(1), (2, 8), 0, 64)

  def loss(params, tokens):
    logits = llama.apply(graphdef, cfg, params, tokens, policy, None)
    return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])

  t = quant.site_stats(loss, params, tokens)
  layers = ("attn/q_proj", "attn/k_proj", "attn/v_proj", "attn/o_proj", "mlp/gate_proj",
            "mlp/up_proj", "mlp/down_proj")  # the embedding, head and attention products: bf16
  assert {(r["path"], r["block"]) for r in t.rows} == {
      (f"layers/{name}", b) for name in layers for b in (0, 1)}
  assert len(t.rows) == 7 * 2 * 6
  assert all(10 < r["snr_db"] < 25 for r in t.rows)
  ref_loss, ref_grads = jax.jit(jax.value_and_grad(loss))(params, tokens)
  assert np.asarray(ref_loss).tobytes() == np.asarray(t.loss).tobytes()
  for a, b in zip(jax.tree.leaves(ref_grads), jax.tree.leaves(t.grads)):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


# -- the advisor ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def advice():
  params = mlp_params(jax.random.key(0), outlier=True)
  batches = [mlp_batch(seed) for seed in (11, 12)]
  return params, quant.advise(mlp_loss, params, batches, "mxfp4", budget=1,
                              quant_key=jax.random.key(4))


def _loss(policy, params, batch):
  return float(quant.quantized(mlp_loss, policy)(params, batch, quant_key=jax.random.key(8)))


def test_advisor_keeps_the_outlier_site_and_closes_the_loss_gap(advice):
  params, adv = advice
  policy, ranking = adv
  assert adv.kept == ("l2",) and ranking[0]["path"] == "l2" and ranking[0]["kept"]
  assert policy.recipe_for("l2").name == "auto" and policy.recipe_for("l1").name == "mxfp4"
  assert adv.kept_flops_fraction == pytest.approx(0.25)
  batch = mlp_batch(seed=21)  # held out
  hp = _loss(quant.QuantPolicy(recipe="bf16"), params, batch)
  unadvised = _loss(quant.QuantPolicy(recipe="mxfp4"), params, batch)
  by_name = _loss(quant.QuantPolicy(recipe="mxfp4", rules=((r"^l3$", "bf16"),)), params, batch)
  advised = _loss(policy, params, batch)
  assert abs(advised - hp) < 0.2 * abs(unadvised - hp)
  assert abs(advised - hp) < 0.2 * abs(by_name - hp)  # the last layer, kept by name: no help


def test_advisor_flops_budget_and_errors():
  params = mlp_params(jax.random.key(0), outlier=True)
  batches = [mlp_batch(11)]
  kw = dict(quant_key=jax.random.key(4))
  none = quant.advise(mlp_loss, params, batches, "mxfp4", budget=0.2, **kw)  # < one site (25%)
  assert none.kept == () and none.policy.rules == () and none.kept_flops_fraction == 0.0
  one = quant.advise(mlp_loss, params, batches, "mxfp4", budget=0.3, **kw)
  assert one.kept == ("l2",)
  with pytest.raises(ValueError, match="fraction of the GEMM FLOPs"):
    quant.advise(mlp_loss, params, batches, "mxfp4", budget=1.5, **kw)
  with pytest.raises(TypeError, match="budget must be an int"):
    quant.advise(mlp_loss, params, batches, "mxfp4", budget="2", **kw)
