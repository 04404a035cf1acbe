"""QuantPolicy (which layer gets which recipe) and PrecisionSchedule (which recipe each step)."""

import logging
import math

import pytest

from lpjax.quant import recipes
from lpjax.quant.policy import QuantPolicy, current_override, path_str, recipe_override
from lpjax.quant.schedule import PrecisionSchedule, ScheduleState

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
  assert {p for p, n in got.items() if n == "bf16"} == hp
  assert {n for p, n in got.items() if p not in hp} == {"mxfp4"}


def test_pure_quantizes_everything():
  assert set(names(QuantPolicy(recipe="nvfp4", pure=True)).values()) == {"nvfp4"}
  # pure also ignores the kept blocks
  p = QuantPolicy(recipe="nvfp4", pure=True, keep_first_blocks=1, keep_last_blocks=1, num_blocks=8)
  assert p.recipe_for("layers/0/mlp/up").name == "nvfp4"


def test_first_and_last_blocks_and_block_patterns():
  p = QuantPolicy(recipe="mxfp4", keep_first_blocks=1, keep_last_blocks=2, num_blocks=8)
  got = names(p)
  assert got["layers/0/mlp/gate_proj"] == "bf16" and got["layers/3/mlp/up_proj"] == "mxfp4"
  assert got["layers/7/mlp/up_proj"] == "bf16"
  assert p.recipe_for("layers/6/mlp/up").name == "bf16" and p.recipe_for("layers/5/mlp/up").name == "mxfp4"
  for path in ("blocks.6.mlp", "h/6/mlp", "layer_6/mlp", ("layers", 6, "mlp")):
    assert p.recipe_for(path).name == "bf16", path
  first2 = QuantPolicy(recipe="mxfp4", keep_first_blocks=2)
  assert first2.recipe_for("layers/16/mlp").name == "mxfp4"  # block 16, not block 1
  assert first2.recipe_for("layers/1/mlp").name == "bf16"
  with pytest.raises(ValueError, match="num_blocks"):
    QuantPolicy(keep_last_blocks=2)


def test_rules_first_match_wins_after_the_keeps():
  p = QuantPolicy(recipe="mxfp4", rules=((r"attn/(q|k|v)_proj", "mxfp8"), (r"attn", "fp8"),
                                         (r"mlp/down", recipes.get("nvfp4"))))
  got = names(p)
  assert got["layers/0/attn/q_proj"] == "mxfp8"  # first match, though "attn" matches too
  assert got["layers/0/attn/o_proj"] == "fp8"
  assert got["layers/0/attn/attn_scores"] == "bf16"  # the keeps come before the rules
  assert got["layers/0/mlp/down_proj"] == "nvfp4" and got["layers/0/mlp/gate_proj"] == "mxfp4"
  assert p.kept_high_precision("lm_head") and not p.kept_high_precision("layers/0/mlp/up")
  assert "lm_head" in p.describe(["lm_head"]) and "bf16" in p.describe(["lm_head"])
  with pytest.raises(Exception):
    QuantPolicy(rules=(("(unclosed", "bf16"),))


def test_recipe_override_replaces_the_quantized_layers_only():
  p = QuantPolicy(recipe="mxfp4", rules=((r"attn", "mxfp8"),))
  assert current_override() is None
  with recipe_override("bf16"):
    assert set(names(p).values()) == {"bf16"}
  with recipe_override("mxfp8"):
    got = names(p)
    assert got["lm_head"] == "bf16"
    assert got["layers/3/mlp/up_proj"] == "mxfp8" and got["layers/0/attn/q_proj"] == "mxfp8"
  with recipe_override(None):
    assert names(p)["layers/3/mlp/up_proj"] == "mxfp4"
  assert current_override() is None
  assert path_str(("layers", 2, "mlp")) == "layers/2/mlp"


# --- schedule ------------------------------------------------------------------------------------


def run(schedule, losses):
  state, out = schedule.init(), []
  for step, loss in enumerate(losses):
    recipe, state = schedule.recipe_at(state, step)
    out.append(recipe)
    state = schedule.observe(state, step, loss)
  return out, state


def test_warmup_and_finish():
  s = PrecisionSchedule(total_steps=20, recipe="mxfp4", warmup_fraction=0.1, finish_fraction=0.25)
  out, _ = run(s, [1.0] * 20)
  assert out == ["bf16"] * 2 + ["mxfp4"] * 13 + ["bf16"] * 5
  assert (s.warmup_steps, s.finish_start) == (2, 15)


def test_fallback_on_spike_and_non_finite(caplog):
  s = PrecisionSchedule(total_steps=100, recipe=None, fallback_factor=3.0, fallback_steps=4,
                        fallback_recipe="mxfp8", min_history=5)
  losses = [2.0] * 10 + [7.0] + [2.0] * 6 + [math.nan] + [2.0] * 6
  with caplog.at_level(logging.INFO, logger="lpjax.quant.schedule"):
    out, state = run(s, losses)
  assert out[:11] == [None] * 11  # None: the policy's own recipes
  assert out[11:15] == ["mxfp8"] * 4 and out[15:18] == [None] * 3
  assert out[18:22] == ["mxfp8"] * 4 and out[22] is None
  assert 7.0 not in state.losses and len(state.losses) == len(losses) - 2  # spikes stay out
  warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert len(warnings) == 2 and "running median" in warnings[0] and "non-finite" in warnings[1]
  switches = [r.getMessage() for r in caplog.records if "phase" in r.getMessage()]
  assert len(switches) == 5  # start, ->fallback, ->low, ->fallback, ->low


def test_spikes_need_history_and_are_relative_to_the_median():
  s = PrecisionSchedule(total_steps=50, recipe="nvfp4", fallback_factor=2.0, fallback_steps=2,
                        min_history=3)
  out, _ = run(s, [10.0, 30.0, 5.0, 5.0, 5.0, 5.0, 5.0, 9.0, 12.0, 5.0])
  assert out[:9] == ["nvfp4"] * 9  # step 1's 30 had no history; 9 < 2 x median 5
  assert out[9:] == ["bf16"]  # 12 > 2 x 5 at step 8


def test_schedule_is_pure_and_validates():
  s = PrecisionSchedule(total_steps=10, recipe="mxfp4", fallback_factor=2.0, min_history=1)
  state = ScheduleState(losses=(1.0,))
  a = s.observe(state, 3, 5.0)
  assert s.observe(state, 3, 5.0) == a and state == ScheduleState(losses=(1.0,))
  assert s.phase_at(a, 4) == "fallback" and s.phase_at(state, 4) == "low"
  with pytest.raises(ValueError):
    PrecisionSchedule(total_steps=10, warmup_fraction=1.5)
  with pytest.raises(ValueError):
    PrecisionSchedule(total_steps=10, fallback_factor=0.5)
