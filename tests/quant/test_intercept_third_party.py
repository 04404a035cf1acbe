"""A Flax model that lpjax did not write, from the package registry, trained in MXFP4 through
`quant.quantize_model` with every GEMM reported (issue 37, "a model from a public package").

The model is NanoMoE from `nano-moe-jax` (PyPI; a linen causal LM: token and position
embeddings, pre-norm blocks of `nn.Dense` QKV attention with `jnp.matmul` scores and values, a
top-k router and `nn.Dense` expert FFNs, a `nn.Dense` head). It is an optional test extra
(`pip install -e .[thirdparty]`); without it these tests are skipped.

The report is checked against an independent count: the `dot_general` and
`conv_general_dilated` equations of the unquantized model's jaxpr, nested jaxprs included.
"""

import jax
import numpy as np
import optax
import pytest

from lpjax import quant

nano_moe = pytest.importorskip("nano_moe")

CFG = nano_moe.NanoMoEConfig(vocab_size=64, n_layers=2, n_heads=2, d_model=32, d_ff=64,
                             n_experts=2, top_k=1, block_size=16, dropout_rate=0.0)
TOKENS = jax.random.randint(jax.random.key(1), (2, 17), 0, CFG.vocab_size)
KEY = jax.random.key(2)
_GEMMS = ("dot_general", "conv_general_dilated")


def _gemm_equations(jaxpr) -> list:
  """The GEMM equations of `jaxpr` and of every jaxpr nested in its equations' params."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in _GEMMS:
      found.append(eqn)
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr holds a Jaxpr
        if hasattr(inner, "eqns"):
          found += _gemm_equations(inner)
  return found


@pytest.fixture(scope="module")
def model_and_params():
  model = nano_moe.NanoMoE(CFG)
  params = model.init(jax.random.key(0), TOKENS[:, :-1])["params"]
  return model, params


def _loss(apply, params, tokens, **kwargs):
  logits, aux_loss = apply({"params": params}, tokens[:, :-1], **kwargs)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
  return ce + CFG.aux_loss_coeff * aux_loss


def test_report_lists_every_gemm_of_the_model(model_and_params):
  model, params = model_and_params
  jaxpr = jax.make_jaxpr(lambda p, x: model.apply({"params": p}, x))(params, TOKENS[:, :-1])
  gemms = _gemm_equations(jaxpr.jaxpr)
  qmodel = quant.quantize_model(model, "mxfp4")
  report = quant.report(qmodel.apply, {"params": params}, TOKENS[:, :-1], quant_key=KEY)
  print(report)

  # per block: QKV, scores, values, out, router, 2 experts x 2; then the head
  assert len(report.sites) == len(gemms) == 2 * 9 + 1
  assert sorted((s.lhs_shape, s.rhs_shape) for s in report.sites) == sorted(
      (tuple(e.invars[0].aval.shape), tuple(e.invars[1].aval.shape)) for e in gemms)
  assert not report.unchanged
  weight_sites = [s for s in report.sites if s.weight != "none"]
  kernels = [jax.tree_util.keystr(p, simple=True, separator="/")
             for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  assert sorted(s.weight_path for s in weight_sites) == sorted(
      k for k in kernels if k.endswith("kernel"))  # every Dense kernel is the weight of a GEMM
  assert all(s.weight == "rhs" and s.recipe == "mxfp4" and s.status == "quantized"
             for s in weight_sites)
  products = [s for s in report.sites if s.weight == "none"]
  assert [s.path.rsplit("/", 1)[-1] for s in products] == ["attn_scores", "attn_values"] * 2
  assert all(s.status == "high precision" for s in products)  # the default attention rule
  assert [s.block for s in weight_sites if s.path.startswith("block_1/")] == ["1"] * 7
  # The head is a plain `nn.Dense` named Dense_0: the default rules keep heads by name
  # (lm_head, head, ...), so it is quantized like the rest; a rule would keep it.
  assert (report.sites[-1].path, report.sites[-1].status) == ("Dense_0", "quantized")


@pytest.mark.slow
def test_trains_three_steps_in_mxfp4(model_and_params):
  model, params = model_and_params
  tx = optax.adamw(3e-3)

  def grads_for(policy, params, key):
    apply = quant.quantize_model(model, policy).apply
    return jax.value_and_grad(lambda p: _loss(apply, p, TOKENS, quant_key=key))(params)

  @jax.jit
  def step(params, opt_state, key):
    loss, grads = grads_for("mxfp4", params, key)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, grads

  p, opt_state, losses = params, tx.init(params), []
  for i in range(3):
    p, opt_state, loss, grads = step(p, opt_state, jax.random.fold_in(KEY, i))
    losses.append(float(loss))
    if i == 0:
      first_grads = grads
  assert np.all(np.isfinite(losses)), losses
  assert losses[-1] < losses[0], losses

  # Quantization happened: the MXFP4 gradients differ from the BF16 recipe's on every kernel,
  # and the BF16 ones from the model's own (unintercepted, float32) gradients.
  bf16_loss, bf16_grads = jax.jit(lambda p: grads_for("bf16", p, None))(params)
  _, fp32_grads = jax.value_and_grad(lambda p: _loss(model.apply, p, TOKENS))(params)
  flat = lambda g: dict(jax.tree_util.tree_flatten_with_path(g)[0])
  mx, bf, fp = flat(first_grads), flat(bf16_grads), flat(fp32_grads)
  for path in (k for k in mx if jax.tree_util.keystr(k).endswith("['kernel']")):
    assert not np.array_equal(np.asarray(mx[path]), np.asarray(bf[path])), path
    assert np.all(np.isfinite(np.asarray(mx[path]))), path
  assert abs(losses[0] - float(bf16_loss)) < 0.1  # the same model, up to FP4 noise
  assert any(not np.array_equal(np.asarray(bf[k]), np.asarray(fp[k])) for k in bf)
