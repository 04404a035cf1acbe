"""The precision schedule: which recipe each training step uses (lpjax.train.step._precision)."""

import logging
import math

import pytest

from lpjax.train.config import llama_config
from lpjax.train.step._precision import PrecisionController, PrecisionSchedule, ScheduleState, build_policy

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
  with caplog.at_level(logging.INFO, logger="lpjax.train.precision"):
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


def test_controller_switches_recipes_through_the_runs_policy():
  c = llama_config("tiny", recipe="mxfp4")
  c.steps, c.quant.warmup_fraction, c.quant.keep_last = 10, 0.2, 1
  c.quant.residuals = "quantized"
  p = PrecisionController(c)
  assert p.policy == build_policy(c) and p.policy.keep_last_blocks == 1
  warm, low = p.policy_at(0), p.policy_at(5)
  assert low is p.policy and p.is_low_precision(low) and not p.is_low_precision(warm)
  assert warm.recipe == "bf16" and warm.keep_last_blocks == 1  # the keeps stay
  assert low.for_model(num_blocks=4).recipe_for("layers/0/mlp/up").residuals == "quantized"


def test_qaf_phase_before_the_finish_quantizes_the_forward_only():
  """FP4 All the Way's QAF: the last steps before the finish drop the backward quantization."""
  s = PrecisionSchedule(total_steps=20, recipe=None, warmup_fraction=0.1, qaf_fraction=0.25,
                        finish_fraction=0.1)
  state, phases = s.init(), []
  for step in range(20):
    _, state = s.recipe_at(state, step)
    phases.append(state.phase)
  assert phases == ["warmup"] * 2 + ["low"] * 11 + ["qaf"] * 5 + ["finish"] * 2
  with pytest.raises(ValueError, match="<= 1"):
    PrecisionSchedule(total_steps=10, warmup_fraction=0.5, qaf_fraction=0.6)
  c = llama_config("tiny", recipe="nvfp4")
  c.steps, c.quant.qaf_fraction, c.quant.keep_last_fraction = 10, 0.3, 0.5
  p = PrecisionController(c)
  low, qaf = p.policy_at(6), p.policy_at(7)
  assert low is p.policy and not low.forward_only and qaf.forward_only
  assert p.is_low_precision(qaf) and p.policy_at(9) == qaf
  r = qaf.for_model(num_blocks=4).recipe_for("layers/0/mlp/up")
  assert r.fwd == low.for_model(num_blocks=4).recipe_for("layers/0/mlp/up").fwd
  assert r.dgrad.operands() == (None, None) and r.wgrad.operands() == (None, None)
  # keep_last_fraction 0.5 of 4 blocks: the last two stay bf16 in both phases.
  assert qaf.for_model(num_blocks=4).recipe_for("layers/2/mlp/up").name == "bf16"


def test_a_pure_lm_policy_warns_where_quantized_attention_products_can_leak_later_tokens(caplog):
  def warned(recipe, policy="default", factory=""):
    c = llama_config("tiny", recipe=recipe)
    c.quant.policy, c.model.factory = policy, factory
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lpjax.train.precision"):
      PrecisionController(c)
    return caplog.text

  assert not warned("quartet")  # the default policy keeps the attention products in bf16
  # lpjax's LLaMA splits P V by the quantizer's key blocks (tests/models/test_llama_causality.py)
  assert not warned("quartet", policy="pure") and not warned("mxfp4", policy="pure")
  text = warned("fp8", policy="pure")  # per-tensor scales: no causal block
  assert "later tokens" in text and "eval/loss_fp" in text and "whole key axis" in text
  text = warned("mxfp4", policy="pure", factory="user_models:linen_lm")
  assert "later tokens" in text and "model.factory" in text
