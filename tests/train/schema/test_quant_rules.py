"""`quant.rules`: per-path recipes from the config (lpjax/train/schema/_quant_rules.py), validated at config
time, built into the run's QuantPolicy, and honoured by lpjax's LLaMA (scanned and unrolled),
ResNet, U-Net and a `model.factory` model quantized by interception."""

import re

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn
from flax import nnx

from lpjax import quant
from lpjax.models import llama, resnet, unet
from lpjax.train import ConfigError, build_policy, validate
from lpjax.train.schema._quant_rules import format_rules, parse_rules
from lpjax.train.config import llama_config


def _config(rules, **quant_keys):
  c = llama_config("tiny", recipe="mxfp4")
  c.quant.rules = rules
  for k, v in quant_keys.items():
    c.quant[k] = v
  return c


def test_rules_parse_in_order_and_format_back():
  text = " ^layers/mlp/down_proj$ -> bf16 ;attn/(q|k)_proj->mxfp4:block_size=16,stochastic_fwd=true;;"
  rules = parse_rules(text)
  assert rules == (("^layers/mlp/down_proj$", "bf16"),
                   ("attn/(q|k)_proj", "mxfp4:block_size=16,stochastic_fwd=true"))
  assert parse_rules(format_rules(rules)) == rules
  assert parse_rules(format_rules([("a;b", "bf16")])) == ((r"a\x3bb", "bf16"),)
  assert re.search(parse_rules(format_rules([("a;b", "bf16")]))[0][0], "a;b")
  assert parse_rules("") == () and parse_rules("  ") == ()
  assert parse_rules("a->b->bf16") == (("a->b", "bf16"),)  # split at the last arrow


def test_build_policy_keeps_the_rules_in_order_after_the_keeps():
  c = validate(_config("down_proj->bf16;mlp->mxfp8;lm_head->mxfp4"), device_count=1)
  policy = build_policy(c)
  assert policy.rules == (("down_proj", "bf16"), ("mlp", "mxfp8"), ("lm_head", "mxfp4"))
  assert policy.recipe_for("layers/mlp/down_proj").name == "bf16"  # first match wins
  assert policy.recipe_for("layers/mlp/up_proj").name == "mxfp8"
  assert policy.recipe_for("layers/attn/q_proj").name == "mxfp4"  # no rule: quant.recipe
  assert policy.recipe_for("lm_head").name == "bf16"  # kept by name: the keeps come first
  assert build_policy(validate(_config(""), device_count=1)).rules == ()


def test_validation_names_each_bad_entry_and_the_fix():
  with pytest.raises(ConfigError) as e:
    validate(_config("(((->bf16;mlp->nope;ok->NVFP4"), device_count=1)
  text = str(e.value)
  assert "2 problems" in text
  assert "quant.rules entry 1 '(((->bf16': bad regex" in text and "fix the regex" in text
  assert "quant.rules entry 2 'mlp->nope': unknown recipe 'nope'; valid:" in text
  with pytest.raises(ConfigError, match=r"entry 1 'down_proj=bf16' has no '->'.*REGEX->RECIPE"):
    validate(_config("down_proj=bf16"), device_count=1)
  with pytest.raises(ConfigError, match="entry 2 '->bf16' has an empty regex"):
    validate(_config("a->bf16;->bf16"), device_count=1)
  # a recipe in any case runs as lpjax names it, like quant.recipe
  assert validate(_config("mlp->NVFP4"), device_count=1).quant.rules == "mlp->nvfp4"


def _recipes(model, policy):
  return dict(model.set_policy(policy))


RULES = "mlp/down_proj->bf16;attn/o_proj->mxfp8"


@pytest.mark.parametrize("scan", [True, False])
def test_llama_honours_the_rules_scanned_and_unrolled(scan):
  cfg = llama.LlamaConfig(vocab_size=64, hidden=32, intermediate=64, heads=2, layers=2,
                          max_seq_len=8, scan_layers=scan)
  policy = build_policy(validate(_config(RULES), device_count=1))
  model = nnx.eval_shape(lambda: llama.Llama(cfg, policy, rngs=nnx.Rngs(params=0)))
  got = _recipes(model, policy)
  blocks = ["layers"] if scan else ["layers/0", "layers/1"]  # a scan names a layer once
  for b in blocks:
    assert got[f"{b}/mlp/down_proj"] == "bf16" and got[f"{b}/attn/o_proj"] == "mxfp8"
    assert got[f"{b}/mlp/up_proj"] == "mxfp4"
  # under a scan a rule naming one block matches no layer: every block shares the layer's path
  one = build_policy(validate(_config(r"^layers/1/mlp/down_proj$->bf16"), device_count=1))
  got = _recipes(model, one)
  assert got[f"{blocks[-1]}/mlp/down_proj"] == ("mxfp4" if scan else "bf16")
  assert got[f"{blocks[0]}/mlp/down_proj"] == "mxfp4"


def test_resnet_and_unet_honour_the_rules():
  cfg = resnet.ResNetConfig(name="resnet_tiny", num_classes=10, in_channels=1, stem="small")
  model = nnx.eval_shape(lambda: resnet.ResNet(cfg, rngs=nnx.Rngs(params=0)))
  plain = _recipes(model, quant.QuantPolicy(recipe="mxfp4"))
  convs = [p for p, r in plain.items() if r == "mxfp4" and "conv" in p]
  assert len(convs) >= 2
  got = _recipes(model, quant.QuantPolicy(recipe="mxfp4", rules=((f"^{convs[1]}$", "mxfp8"),)))
  assert got[convs[1]] == "mxfp8" and got[convs[0]] == "mxfp4"
  assert {p for p, r in got.items() if r != plain[p]} == {convs[1]}

  ucfg = unet.UNetConfig(image_size=8, channels=1, base_width=8, channel_mults=(1, 2),
                         num_res_blocks=1, attention_resolutions=(), norm_groups=4)
  model = nnx.eval_shape(lambda: unet.UNet(ucfg, rngs=nnx.Rngs(params=0)))
  plain = _recipes(model, quant.QuantPolicy(recipe="mxfp4"))
  target = next(p for p, r in plain.items() if r == "mxfp4" and p.startswith("up/"))
  got = _recipes(model, quant.QuantPolicy(recipe="mxfp4", rules=((f"^{target}$", "bf16"),)))
  assert {p for p, r in got.items() if r != plain[p]} == {target} and got[target] == "bf16"


class _MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(8, name="down")(nn.relu(nn.Dense(16, name="up")(x)))


def test_an_intercepted_model_factory_model_honours_the_rules():
  x = jnp.ones((4, 32))
  module = _MLP()
  variables = module.init(jax.random.key(0), x)
  policy = build_policy(validate(_config("^down$->mxfp8"), device_count=1))
  rep = quant.report(quant.quantize_model(module, policy).apply, variables, x,
                     rngs={"quant": jax.random.key(1)})
  recipe = {s.path: str(s.recipe) for s in rep.sites}
  assert recipe == {"up": "mxfp4", "down": "mxfp8"}, recipe
