"""QuantPolicy: which layer gets which recipe (the precision schedule is tested in tests/train)."""

import pytest

from lpjax.quant import QuantPolicy, path_str, recipes

LLAMA_PATHS = ["embed_tokens", "layers/0/input_norm", "layers/0/attn/q_proj", "layers/0/attn/attn_scores",
               "layers/0/attn/attn_values", "layers/0/attn/o_proj", "layers/0/mlp/gate_proj",
               "layers/0/mlp/down_proj", "layers/3/mlp/up_proj", "layers/7/mlp/up_proj", "final_norm",
               "lm_head"]


def names(policy, paths=LLAMA_PATHS):
  return {p: policy.recipe_for(p).name for p in paths}


def test_defaults_keep_embeddings_head_norms_and_attention_products_high_precision():
  got = names(QuantPolicy(recipe="mxfp4"))
  hp = {"embed_tokens", "layers/0/input_norm", "layers/0/attn/attn_scores", "layers/0/attn/attn_values",
        "final_norm", "lm_head"}
  assert {p for p, n in got.items() if n == "auto"} == hp  # the default: operands as given
  assert {n for p, n in got.items() if p not in hp} == {"mxfp4"}
  assert {p for p, n in names(QuantPolicy(recipe="mxfp4", high_precision="bf16")).items()
          if n == "bf16"} == hp


def test_default_high_precision_is_the_original_gemm_never_below_the_model_dtype():
  """Kept layers run "auto": no cast, so an fp32 model's kept GEMMs stay fp32 under FP4 recipes
  and under bf16; an explicit high_precision (as the trainer passes) is kept."""
  auto = recipes.get("auto")
  assert auto.is_high_precision and auto.compute_dtype is None and "auto" not in recipes.NAMES
  assert QuantPolicy().high_precision == QuantPolicy.from_settings().high_precision == "auto"
  for recipe in ("mxfp4", "nvfp4", "quartet", "fp8", "bf16"):
    assert QuantPolicy(recipe=recipe).recipe_for("lm_head") is auto, recipe
    assert QuantPolicy(recipe=recipe, high_precision="bf16").recipe_for("lm_head").name == "bf16"
  assert QuantPolicy(recipe="fp32").recipe_for("lm_head").name == "fp32"  # both the original op
  assert hash(QuantPolicy()) == hash(QuantPolicy(high_precision="auto"))
  with pytest.raises(ValueError, match="high_precision: Unknown recipe 'autoo'"):
    QuantPolicy(high_precision="autoo")


def test_pure_quantizes_everything():
  assert set(names(QuantPolicy(recipe="nvfp4", pure=True)).values()) == {"nvfp4"}
  # pure also ignores the kept blocks
  p = QuantPolicy(recipe="nvfp4", pure=True, keep_first_blocks=1, keep_last_blocks=1, num_blocks=8)
  assert p.recipe_for("layers/0/mlp/up").name == "nvfp4"


def test_first_and_last_blocks_and_block_patterns():
  p = QuantPolicy(recipe="mxfp4", keep_first_blocks=1, keep_last_blocks=2, num_blocks=8)
  got = names(p)
  assert got["layers/0/mlp/gate_proj"] == "auto" and got["layers/3/mlp/up_proj"] == "mxfp4"
  assert got["layers/7/mlp/up_proj"] == "auto"
  assert p.recipe_for("layers/6/mlp/up").name == "auto" and p.recipe_for("layers/5/mlp/up").name == "mxfp4"
  for path in ("blocks.6.mlp", "h/6/mlp", "layer_6/mlp", ("layers", 6, "mlp")):
    assert p.recipe_for(path).name == "auto", path
  first2 = QuantPolicy(recipe="mxfp4", keep_first_blocks=2)
  assert first2.recipe_for("layers/16/mlp").name == "mxfp4"  # block 16, not block 1
  assert first2.recipe_for("layers/1/mlp").name == "auto"
  with pytest.raises(ValueError, match="num_blocks"):  # the model fills num_blocks in (for_model)
    QuantPolicy(keep_last_blocks=2).recipe_for("layers/1/mlp")


def test_rules_first_match_wins_after_the_keeps():
  p = QuantPolicy(recipe="mxfp4", rules=((r"attn/(q|k|v)_proj", "mxfp8"), (r"attn", "fp8"),
                                         (r"mlp/down", recipes.get("nvfp4"))))
  got = names(p)
  assert got["layers/0/attn/q_proj"] == "mxfp8"  # first match, though "attn" matches too
  assert got["layers/0/attn/o_proj"] == "fp8"
  assert got["layers/0/attn/attn_scores"] == "auto"  # the keeps come before the rules
  assert got["layers/0/mlp/down_proj"] == "nvfp4" and got["layers/0/mlp/gate_proj"] == "mxfp4"
  assert p.kept_high_precision("lm_head") and not p.kept_high_precision("layers/0/mlp/up")
  assert "lm_head" in p.describe(["lm_head"]) and "auto" in p.describe(["lm_head"])
  with pytest.raises(Exception):
    QuantPolicy(rules=(("(unclosed", "bf16"),))


def test_with_recipe_replaces_the_quantized_layers_only():
  p = QuantPolicy(recipe="mxfp4", rules=((r"attn", "mxfp8"),))
  assert set(names(p.with_recipe("bf16")).values()) == {"bf16", "auto"}
  assert set(names(p.with_recipe("fp32")).values()) == {"fp32"}
  got = names(p.with_recipe("mxfp8"))
  assert got["lm_head"] == "auto"
  assert got["layers/3/mlp/up_proj"] == "mxfp8" and got["layers/0/attn/q_proj"] == "mxfp8"
  assert p.with_recipe(None) is p
  assert names(p)["layers/3/mlp/up_proj"] == "mxfp4"
  assert path_str(("layers", 2, "mlp")) == "layers/2/mlp"


def test_from_settings_means_the_same_for_every_model():
  p = QuantPolicy.from_settings("mxfp4", high_precision="fp8", keep_first=1, keep_last=1,
                                residuals="quantized")
  assert (p.recipe, p.high_precision, p.keep_first_blocks, p.keep_last_blocks) == (
      "mxfp4", "fp8", 1, 1)
  llama = p.for_model(num_blocks=4)
  assert [llama.recipe_for(f"layers/{i}/mlp/up").name for i in range(4)] == [
      "fp8", "mxfp4", "mxfp4", "fp8"]
  assert llama.recipe_for("layers/1/mlp/up").residuals == "quantized"
  assert llama.recipe_for("layers/0/mlp/up").residuals == "high_precision"  # fp8 kept block
  assert recipes.get("mxfp4").residuals == "high_precision"  # the preset is untouched
  # A model whose blocks carry no forward-order index lists them (a U-Net's levels).
  unet = p.for_model(keep_high_precision=(r"^conv_in",),
                     block_paths=(r"^down/0/", r"^down/1/", r"^mid_", r"^up/0/", r"^up/1/"))
  assert unet.num_blocks == 5 and unet.block_index("mid_attn/q") == 2
  assert unet.recipe_for("down/0/res/0/conv1").name == "fp8"
  assert unet.recipe_for("up/1/res/0/conv1").name == "fp8"
  assert unet.recipe_for("up/0/res/0/conv1").name == "mxfp4"
  assert unet.recipe_for("conv_in").name == "fp8"
  assert QuantPolicy.from_settings("mxfp4", pure=True).for_model(
      keep_high_precision=(r"^conv_in",)).recipe_for("conv_in").name == "mxfp4"
  with pytest.raises(ValueError, match="residuals"):
    QuantPolicy.from_settings("mxfp4", residuals="fp4")


@pytest.mark.parametrize("blocks, fraction, kept", [(62, 0.15, 9), (4, 0.15, 1), (16, 0.15, 2),
                                                    (10, 0.0, 0), (10, 0.5, 5)])
def test_keep_last_fraction_rounds_and_keeps_at_least_one(blocks, fraction, kept):
  p = QuantPolicy.from_settings("nvfp4", keep_last_fraction=fraction,
                                high_precision="bf16").for_model(num_blocks=blocks)
  assert p.kept_last_blocks == kept and p.varies_by_block == bool(fraction)
  got = [p.recipe_for(f"layers/{i}/mlp/up").name for i in range(blocks)]
  assert got == ["nvfp4"] * (blocks - kept) + ["bf16"] * kept
  # keep_last counts too; the larger wins
  both = QuantPolicy.from_settings("nvfp4", keep_last=3, keep_last_fraction=fraction).for_model(
      num_blocks=blocks)
  assert both.kept_last_blocks == max(3, kept)
  with pytest.raises(ValueError, match="keep_last_fraction"):
    QuantPolicy(recipe="nvfp4", keep_last_fraction=1.0)
