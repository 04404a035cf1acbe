"""Rules that cannot miss silently, and labels that say what a product is (issue 57, items 5, 6,
7 and 10): a case table with models lpjax did not write (linen and NNX modules written here, a
raw `m.apply`, `nnx.state`, an einsum MoE, a `model.factory` model), each row with its expected
outcome, then fresh adversarial cases in the same areas.

- item 5: one name per layer everywhere: `advise` on a loss that calls a raw linen `m.apply`
  writes a rule that matches the site of `quantize_model(m, advice.policy)`;
- item 6: a `quant.rules` entry that matches no site is a ConfigError at start-up naming the rule
  and the nearest site paths (and, for a block of a scanned stack, why and the fix); a matched
  per-layer rule runs; every run writes quant_report.txt; `report` lists unmatched rules;
- item 7: `report` traces stochastic-rounding recipes without a key;
- item 10: products of two activations are attention's only for the Q K^T -> softmax -> P V
  pattern; others (an MoE's dispatch, combine, gathered experts) are "act_product".
"""

from __future__ import annotations

import dataclasses
import re
import shlex

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

from bad_input_cases import Case, Holds, Raises, check
from config_helpers import small
from rule_case_models import D, X, EinsumMoE, Gram, LinenAttention, LinenMLP, NNXMLP, ScannedLinen

from lpjax import quant
from lpjax.train import ConfigError
from lpjax.train.loop._trainer import Trainer

# --- helpers -----------------------------------------------------------------------------------


def _variables(model, x=X):
  return model.init(jax.random.key(1), x)


def _paths(report):
  return [s.path for s in report.sites]


def _status(report):
  return {s.path: s.status for s in report.sites}


def _raw_apply_report(model, policy, x=X):
  """The report of `quantized` on a loss that calls the model's raw `m.apply`."""
  v = _variables(model, x)
  return quant.report(quant.quantized(lambda v, x: model.apply(v, x), policy), v, x)


def _model_report(model, policy, x=X):
  return quant.report(quant.quantize_model(model, policy).apply, _variables(model, x), x)


def _trainer(tmp_path, **overrides):
  return Trainer(small("mxfp4_naive", steps=1, **overrides), str(tmp_path / "run"))


def _config_error(tmp_path, **overrides):
  _trainer(tmp_path, **overrides)
  return "no error"


def _nnx_state_report(policy):
  model = NNXMLP(nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  fn = quant.quantized(lambda s, x: nnx.merge(graphdef, s)(x), policy)
  return quant.report(fn, state, X)


# --- item 5: advise writes rules that match the model's sites ---------------------------------


def _advise_raw_apply_rule_keeps_the_layer(_):
  """A loss calling the raw m.apply (the distance to the model's own output, so that every
  quantized site hurts): the advice keeps one layer, and quantize_model(m, advice.policy) runs
  that layer in high precision, the other one in FP4."""
  model = LinenMLP()
  v = _variables(model)
  target = model.apply(v, X)
  loss = lambda v, x: jnp.mean((model.apply(v, x) - target) ** 2)
  advice = quant.advise(loss, v, [X], "mxfp4_naive", budget=1, quant_key=jax.random.key(2))
  kept, = advice.kept
  rep = quant.report(quant.quantize_model(model, advice.policy).apply, v, X)
  other, = {"a", "b"} - {kept}
  # the kept layer runs the policy's high-precision recipe ("auto": its own GEMM, as given)
  return (advice.policy.rules[0][0] == f"^{kept}$" and rep.unmatched_rules == ()
          and {s.path: (s.recipe, s.status) for s in rep.sites} == {
              kept: ("auto", "unchanged"), other: ("mxfp4_naive", "quantized")})


def _raw_apply_names_as_quantize_model():
  return _paths(_raw_apply_report(Gram(), "mxfp4_naive")) == _paths(
      _model_report(Gram(), "mxfp4_naive")) == ["proj", "act_product", "act_product"]


def _site_stats_raw_apply_paths():
  model = LinenMLP()
  v = _variables(model)
  t = quant.site_stats(lambda v, x: jnp.mean(model.apply(v, x) ** 2), v, X,
                       policy="mxfp4_naive")
  return sorted({r["path"] for r in t.rows}) == ["a", "b"]


def _export_linen_variables_by_rule():
  """export_weights on a linen variables dict: the rule "^a$" keeps "a" (not exported)."""
  v = _variables(LinenMLP())
  policy = quant.QuantPolicy(recipe="mxfp4_naive", rules=(("^a$", "bf16"),))
  return sorted(quant.export_weights(v, policy)) == ["b/kernel"]


CASES = [
    Case("item 5", "advise on a raw m.apply loss: its rule keeps the layer in quantize_model",
         _advise_raw_apply_rule_keeps_the_layer, Holds("the advised layer runs high precision")),
    Case("item 5", "quantized(raw m.apply) names sites as quantize_model(m) does",
         lambda _: _raw_apply_names_as_quantize_model(), Holds("same paths, no params/ or M/")),
    Case("item 5", "site_stats on a raw m.apply loss: the layers' paths",
         lambda _: _site_stats_raw_apply_paths(), Holds("paths a, b")),
    Case("item 5", "export_weights of a linen variables dict honours the model's rules",
         lambda _: _export_linen_variables_by_rule(), Holds("a kept, b exported")),
    Case("item 5", "nnx.state through quantized: the NNX model's own paths and rules",
         lambda _: _status(_nnx_state_report(quant.QuantPolicy(
             recipe="mxfp4_naive", rules=(("^a$", "bf16"),)))) == {
                 "a": "high precision", "b": "quantized"}, Holds("a ruled bf16")),
    # item 6: rules that match nothing
    Case("item 6", "a per-block rule on the scanned LLaMA is a start-up error",
         lambda t: _config_error(t, **{"quant.rules": "^layers/3/mlp/down_proj$->bf16"}),
         Raises(ConfigError, "names block 3 of the scanned stack that holds "
                             "'layers/mlp/down_proj'")),
    Case("item 6", "the error names the rule and the fix",
         lambda t: _config_error(t, **{"quant.rules": "^layers/3/mlp/down_proj$->bf16"}),
         Raises(ConfigError, "'^layers/3/mlp/down_proj$->bf16' matches no GEMM site")),
    Case("item 6", "a factory model: an unmatched rule is a start-up error",
         lambda t: _config_error(t, **{"model.factory": "rule_case_models:linen_lm",
                                       "quant.rules": "^mixer$->bf16"}),
         Raises(ConfigError, "nearest site paths: mix")),
    Case("item 6", "report lists the unmatched rules of the traced policy",
         lambda _: "rule '^c$' -> bf16 matches no site" in str(_model_report(
             LinenMLP(), quant.QuantPolicy(recipe="mxfp4_naive", rules=(("^c$", "bf16"),)))),
         Holds("the report's last line names the rule")),
    Case("item 6", "Report.check_rules raises on an unmatched rule",
         lambda _: _model_report(LinenMLP(), quant.QuantPolicy(
             recipe="mxfp4_naive", rules=(("^layers/a$", "bf16"),))).check_rules(),
         Raises(ValueError, "'^layers/a$': nearest site paths: a")),
    Case("item 6", "default keep-list regexes that miss (no attention in an MLP) are no error",
         lambda _: _model_report(LinenMLP(), "mxfp4_naive").check_rules().unmatched_rules == (),
         Holds("no unmatched rule")),
    # item 7: report only traces
    Case("item 7", "report of a stochastic-rounding recipe without quant_key (quantized)",
         lambda _: _paths(quant.report(quant.quantized(
             lambda w, x: jnp.tanh(x @ w["a"]["kernel"]), "mxfp4"),
             {"a": {"kernel": jnp.ones((D, D))}}, X)) == ["a"], Holds("traced")),
    Case("item 7", "report of a stochastic-rounding recipe without quant_key (linen model)",
         lambda _: _paths(_model_report(LinenMLP(), "mxfp4")) == ["a", "b"], Holds("traced")),
    Case("item 7", "report of an NNX quantize_model without rngs, stochastic rounding",
         lambda _: _paths(quant.report(quant.quantize_model(NNXMLP(nnx.Rngs(0)), "mxfp4"), X))
         == ["a", "b"], Holds("traced")),
    # item 10: what a product of two activations is
    Case("item 10", "an einsum MoE: dispatch, combine and the gathered expert are act_product",
         lambda _: [p for p in _paths(_model_report(EinsumMoE(), "mxfp4_naive"))
                    if p not in ("router", "w_in", "out")] == ["act_product"] * 3,
         Holds("no attn_* label")),
    Case("item 10", "linen's MultiHeadDotProductAttention stays attn_scores / attn_values",
         lambda _: _paths(_model_report(LinenAttention(), "mxfp4_naive", jnp.ones((2, 8, D))))
         == ["mha/query", "mha/key", "mha/value", "mha/attn_scores", "mha/attn_values",
             "mha/out"], Holds("attention labelled as attention")),
]


# --- fresh adversarial cases -------------------------------------------------------------------


def _typo(t):
  return _config_error(t, **{"quant.rules": "^layers/mlp/down_prj$->bf16"})


def _unrolled_beyond_stack(t):
  return _config_error(t, **{"model.scan_layers": False,
                             "quant.rules": "^layers/4/mlp/down_proj$->bf16"})


def _advice_round_trip(tmp_path):
  """The advisor's rule for a site it measured, printed as the CLI prints it (shell-quoted), read
  back into the trainer: accepted, and the site runs the advised recipe."""
  from lpjax import advise as cli
  from lpjax.quant.monitor.site_stats import discover

  trainer = _trainer(tmp_path)
  task, policy = trainer.task, trainer.precision.policy
  params, _ = jax.eval_shape(task.init_variables, jax.random.key(0))
  batch = next(iter(task.batches(0, 1, 0, 1)))[1]
  loss = lambda p, b: task.loss(p, None, b, jax.random.key(0), policy)[0]
  measured = sorted({k.path for k in discover(loss, params, batch)})
  advised = dataclasses.replace(policy, rules=((f"^{re.escape(measured[-1])}$", "bf16"),))
  flag = shlex.split(cli.shell_line(cli.config_lines(advised, pure=False)))[0]
  again = _trainer(tmp_path / "again", **{"quant.rules": flag.partition("=")[2]})
  recipes = {s.path: s.recipe for s in again.quant_sites.sites}
  return "layers/mlp/up_proj" in measured and recipes[measured[-1]] == "bf16"


def _nnx_and_linen_same_names():
  linen = _paths(_raw_apply_report(LinenMLP(), "mxfp4_naive"))
  return linen == _paths(_nnx_state_report("mxfp4_naive")) == ["a", "b"]


class GatedGram(nn.Module):
  """A Gram matrix h h^T gated by a softmax of a router (a weight GEMM), then times h: a softmax
  sits between the two products of activations, but not on the path from one to the other."""

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(D, name="proj")(x)
    gate = jax.nn.softmax(nn.Dense(x.shape[0], name="router")(x), axis=-1)
    return ((h @ h.T) * gate) @ h


def _softmax_router_is_not_attention():
  return [p for p in _paths(_raw_apply_report(GatedGram(), "mxfp4_naive"))
          if p not in ("proj", "router")] == ["act_product", "act_product"]


def _scanned_linen_block_rule():
  model = ScannedLinen()
  rep = _model_report(model, quant.QuantPolicy(recipe="mxfp4_naive",
                                               rules=(("^layers/1/up$", "bf16"),)))
  with pytest.raises(ValueError, match="names block 1 of the scanned stack that holds 'layers/up'"):
    rep.check_rules()
  return _paths(rep) == ["layers/up"]


FRESH = [
    Case("fresh", "a rule with a typo names the nearest path", _typo,
         Raises(ConfigError, "nearest site paths: layers/mlp/down_proj")),
    Case("fresh", "a block index beyond the (unrolled) stack", _unrolled_beyond_stack,
         Raises(ConfigError, "it names block 4, and the model's blocks are 0-3")),
    Case("fresh", "a rule with a trailing /kernel",
         lambda t: _config_error(t, **{"quant.rules": "^layers/mlp/up_proj/kernel$->bf16"}),
         Raises(ConfigError, "drop the trailing '/kernel'")),
    Case("fresh", "a regex that matches only a bias",
         lambda _: _model_report(LinenMLP(), quant.QuantPolicy(
             recipe="mxfp4_naive", rules=(("a/bias", "bf16"),))).check_rules(),
         Raises(ValueError, "drop the trailing '/bias'")),
    Case("fresh", "a rule in another case",
         lambda t: _config_error(t, **{"quant.rules": "^LM_HEAD$->bf16"}),
         Raises(ConfigError, "matched case-sensitively")),
    Case("fresh", "one good and one bad entry: only the bad one is named",
         lambda t: _config_error(t, **{"quant.rules": "^lm_head$->bf16;^layers/mlp/gat$->bf16"}),
         Raises(ConfigError, "quant.rules entry 2 '^layers/mlp/gat$->bf16'")),
    Case("fresh", "NNX and linen name the same module the same way",
         lambda _: _nnx_and_linen_same_names(), Holds("a, b in both")),
    Case("fresh", "a router's softmax gating a Gram product is no attention",
         lambda _: _softmax_router_is_not_attention(), Holds("act_product twice, no attn_*")),
    Case("fresh", "h h^T h (no softmax) is act_product, kept by the default policy",
         lambda _: {s.path: s.status for s in _raw_apply_report(Gram(), "mxfp4_naive").sites}
         == {"proj": "quantized", "act_product": "high precision"}, Holds("act_product kept")),
    Case("fresh", "a per-block rule on an nn.scan stack: the report explains",
         lambda _: _scanned_linen_block_rule(), Holds("scanned explained")),
    Case("fresh", "the advisor's printed rule, read back by the trainer, runs",
         _advice_round_trip, Holds("accepted, the site in bf16")),
    Case("fresh", "a raw m.apply inside a named scope still names sites as quantize_model",
         lambda _: _paths(quant.report(quant.quantized(
             lambda v, x: _scoped_apply(Gram(), v, x), "mxfp4_naive"), _variables(Gram()), X))
         == ["proj", "act_product", "act_product"], Holds("no scope/Gram prefix")),
]


def _scoped_apply(model, v, x):
  with jax.named_scope("loss"):
    return model.apply(v, x)


@pytest.mark.parametrize("case", CASES + FRESH, ids=lambda c: f"{c.group}: {c.name}")
def test_case(case, tmp_path):
  check(case, lambda: case.run(tmp_path))


# --- item 6: a matched per-layer rule runs, and the run writes quant_report.txt ------------------


def test_a_matched_per_layer_rule_runs_and_the_run_writes_quant_report(tmp_path):
  from lpjax.train import train_and_evaluate

  config = small("mxfp4_naive", steps=1, **{"model.scan_layers": False,
                                              "quant.rules": "^layers/1/mlp/down_proj$->bf16"})
  results = train_and_evaluate(config, str(tmp_path / "run"))
  assert results["steps"] == 1 and np.isfinite(results["final_train_loss"])
  rows = {line.split()[0]: line.split() for line in
          (tmp_path / "run" / "quant_report.txt").read_text().splitlines()[1:]}
  assert rows["layers/1/mlp/down_proj"][-3:] == ["bf16", "high", "precision"]
  assert rows["layers/0/mlp/down_proj"][-2:] == ["mxfp4_naive", "quantized"]
  assert " ".join(rows["lm_head"]).endswith("high precision (kept by the policy)")
  assert len(rows) == 1 + 4 * 9 + 1 + 1  # header, 9 GEMMs in each of 4 blocks, head, summary
  assert rows["37"][:2] == ["37", "GEMM"]


def test_image_tasks_report_their_own_layers():
  """quant_report.txt of a ResNet (classification) and a U-Net (diffusion) run: each layer with
  its recipe under the run's policy (before: None, nothing written)."""
  from types import SimpleNamespace

  from lpjax.models import resnet, unet
  from lpjax.train.tasks.classification import ClassificationTask
  from lpjax.train.tasks.diffusion import DiffusionTask

  policy = quant.QuantPolicy.from_settings("mxfp4_naive", high_precision="bf16")
  cfg = resnet.ResNetConfig(name="resnet_tiny", num_classes=10, in_channels=1, stem="small")
  cls = ClassificationTask.quant_report(SimpleNamespace(user=None, model_config=cfg), policy)
  dif = DiffusionTask.quant_report(SimpleNamespace(model_config=unet.unet_tiny()), policy)
  for rep in (cls, dif):
    assert {s.op for s in rep.sites} == {"conv_general_dilated", "dot_general"}
    assert {s.recipe for s in rep.sites} == {"mxfp4_naive", "bf16"}
    assert all((s.recipe == "bf16") == (s.status == "high precision") for s in rep.sites)
  recipes = {s.path: s.recipe for s in dif.sites}
  assert recipes["mid_attn/attn_scores"] == recipes["mid_attn/attn_values"] == "bf16"
  assert recipes["mid_attn/q"] == "mxfp4_naive"
