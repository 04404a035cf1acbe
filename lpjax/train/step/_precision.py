"""The precision schedule of a run: which QuantPolicy each training step uses, on the host.

This module is the one place where a training run's `quant.*` settings become quantization
objects: `build_policy(config)` makes the run's `QuantPolicy` (handed to the model), and
`PrecisionController` switches recipes per step through that policy (`policy.with_recipe`).

Phases of a `PrecisionSchedule`: `warmup` (high precision for the first `warmup_fraction` of the
steps), `low` (the policy's own recipes), `qaf` (the `qaf_fraction` of the steps before the
finish: the policy's forward quantization only, backward GEMMs in high precision, the "QAF"
phase of Chmiel et al. 2025, "FP4 All the Way", arXiv 2505.19115), `finish` (high precision for the
last `finish_fraction`), and `fallback`: when a loss is non-finite or above `fallback_factor` x the
running median of recent losses, the next `fallback_steps` steps use `fallback_recipe`. Every
phase switch and every trigger is logged (logger "lpjax.train.step._precision").

Everything is a pure function of (step, a small host-side `ScheduleState`), so the trainer picks
the policy per step and passes it to its jitted step as a static argument: jit compiles once per
distinct policy (two or three in total), never per step.

Examples:
  >>> s = PrecisionSchedule(total_steps=100, recipe="mxfp4", warmup_fraction=0.1,
  ...                       fallback_factor=2.0, fallback_steps=3, min_history=3)
  >>> state = s.init()
  >>> names = []
  >>> for step, loss in enumerate([5.0] * 12 + [50.0] + [5.0] * 5):
  ...   recipe, state = s.recipe_at(state, step)
  ...   names.append(recipe)
  ...   state = s.observe(state, step, loss)
  >>> names[9:18]
  ['bf16', 'mxfp4', 'mxfp4', 'mxfp4', 'bf16', 'bf16', 'bf16', 'mxfp4', 'mxfp4']

  The controller a trainer uses (the policy of each step; the low phase is the run's own policy):

  >>> from lpjax.train.config import llama_config
  >>> c = llama_config("tiny", recipe="mxfp4")
  >>> c.steps, c.quant.warmup_fraction = 100, 0.1
  >>> p = PrecisionController(c)
  >>> p.policy_at(0).recipe, p.policy_at(50) is p.policy
  ('bf16', True)
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
from typing import NamedTuple

from lpjax.models.llama import key_span
from lpjax.quant import QuantPolicy

log = logging.getLogger("lpjax.train.precision")

PHASES = ("warmup", "low", "fallback", "qaf", "finish")
PHASE_WORDS = {  # how the log names each phase
    "warmup": "the high-precision warm-up (quant.warmup_fraction)",
    "low": "the run's own recipe (quant.recipe)",
    "fallback": "the high-precision fallback",
    "qaf": "FP4-forward / high-precision-backward (quant.qaf_fraction)",
    "finish": "the high-precision finish (quant.finish_fraction)",
}


class ScheduleState(NamedTuple):
  """Host-side state: a few Python values (checkpoint it with the train state if you like)."""

  losses: tuple[float, ...] = ()  # recent finite, non-spike losses (at most median_window)
  fallback_until: int = -1  # steps < fallback_until are in fallback
  phase: str | None = None  # phase of the last `recipe_at` (to log switches)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrecisionSchedule:
  """When to train in low precision, and when to fall back (see the module docstring)."""

  total_steps: int  # the number of training steps
  recipe: str | None = None  # low-precision phase: a recipe name, or None = the policy's own
  high_precision: str = "bf16"  # recipe of the warm-up and finish phases
  warmup_fraction: float = 0.0  # first fraction of steps in high precision
  finish_fraction: float = 0.0  # last fraction of steps in high precision
  qaf_fraction: float = 0.0  # fraction of steps before the finish with forward-only quantization
  fallback_factor: float | None = None  # k: loss > k x running median triggers fallback; None = off
  fallback_steps: int = 100  # N: steps in fallback after a trigger
  fallback_recipe: str | None = None  # recipe during fallback; None = high_precision
  median_window: int = 200  # losses in the running median
  min_history: int = 20  # losses needed before spikes (not non-finite losses) can trigger

  def __post_init__(self):
    if self.total_steps < 1:
      raise ValueError(f"total_steps must be >= 1, got {self.total_steps}.")
    for name in ("warmup_fraction", "finish_fraction", "qaf_fraction"):
      if not 0.0 <= getattr(self, name) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}.")
    if self.warmup_fraction + self.qaf_fraction + self.finish_fraction > 1.0:
      raise ValueError("warmup_fraction + qaf_fraction + finish_fraction must be <= 1, got "
                       f"{self.warmup_fraction + self.qaf_fraction + self.finish_fraction:g}.")
    if self.fallback_factor is not None and self.fallback_factor <= 1.0:
      raise ValueError(f"fallback_factor must be > 1, got {self.fallback_factor}.")

  @property
  def warmup_steps(self) -> int:
    return round(self.warmup_fraction * self.total_steps)

  @property
  def finish_start(self) -> int:
    """First step of the high-precision finish (total_steps when there is none)."""
    return self.total_steps - round(self.finish_fraction * self.total_steps)

  @property
  def qaf_start(self) -> int:
    """First step of the forward-only (QAF) phase (finish_start when there is none)."""
    return self.finish_start - round(self.qaf_fraction * self.total_steps)

  def init(self) -> ScheduleState:
    return ScheduleState()

  def phase_at(self, state: ScheduleState, step: int) -> str:
    """The phase of `step` (one of PHASES)."""
    if step < self.warmup_steps:
      return "warmup"
    if step >= self.finish_start:
      return "finish"
    if step < state.fallback_until:
      return "fallback"
    if step >= self.qaf_start:
      return "qaf"
    return "low"

  def recipe_of(self, phase: str) -> str | None:
    if phase in ("warmup", "finish"):
      return self.high_precision
    if phase == "fallback":
      return self.fallback_recipe or self.high_precision
    return self.recipe  # low and qaf (the controller drops qaf's backward quantization)

  def recipe_at(self, state: ScheduleState, step: int) -> tuple[str | None, ScheduleState]:
    """(recipe of `step`, new state); logs when the phase changes."""
    phase = self.phase_at(state, step)
    if phase != state.phase:
      recipe = self.recipe_of(phase)
      recipe = f" (recipe {recipe})" if recipe else ""
      if state.phase is None:
        log.info("step %d: precision phase: %s%s", step, PHASE_WORDS[phase], recipe)
      else:
        log.info("step %d: precision phase: %s -> %s%s", step, PHASE_WORDS[state.phase],
                 PHASE_WORDS[phase], recipe)
    return self.recipe_of(phase), state._replace(phase=phase)

  def observe(self, state: ScheduleState, step: int, loss: float) -> ScheduleState:
    """Records the loss of `step` (a host float); may start a fallback period (logged)."""
    loss = float(loss)
    if self.fallback_factor is None:
      return state
    reason = None
    if not math.isfinite(loss):
      reason = f"non-finite loss {loss}"
    elif len(state.losses) >= self.min_history:
      median = statistics.median(state.losses)
      if loss > self.fallback_factor * median:
        reason = f"loss {loss:.4g} > {self.fallback_factor} x running median {median:.4g}"
    if reason is not None:
      until = step + 1 + self.fallback_steps
      log.warning("step %d: %s; steps %d..%d use fallback recipe %s", step, reason, step + 1,
                  until - 1, self.fallback_recipe or self.high_precision)
      return state._replace(fallback_until=max(state.fallback_until, until))
    losses = (state.losses + (loss,))[-self.median_window:]
    return state._replace(losses=losses)


def build_policy(config) -> QuantPolicy:
  """The run's QuantPolicy from `config.quant.*` (the only reader of those keys' recipes);
  `quant.rules` ("REGEX->RECIPE;...", lpjax/train/schema/_quant_rules.py) become its `rules`, in order."""
  from lpjax.train.schema._quant_rules import parse_rules

  q = config.quant
  return QuantPolicy.from_settings(q.recipe, high_precision=q.high_precision_recipe,
                                   pure=q.policy == "pure", keep_first=q.keep_first,
                                   keep_last=q.keep_last, keep_last_fraction=q.keep_last_fraction,
                                   residuals=q.residuals, rules=parse_rules(q.get("rules", "")))


class PrecisionController:
  """policy_at(step) -> the QuantPolicy of that step; observe(step, loss) feeds the fallback."""

  def __init__(self, config, policy: QuantPolicy | None = None):
    q = config.quant
    self.policy = policy if policy is not None else build_policy(config)  # the low phase's
    self.schedule = PrecisionSchedule(
        total_steps=config.steps, recipe=None, high_precision=q.high_precision_recipe,
        warmup_fraction=q.warmup_fraction, finish_fraction=q.finish_fraction,
        qaf_fraction=q.qaf_fraction,
        fallback_factor=q.fallback_factor if q.fallback_factor > 0 else None,
        fallback_steps=q.fallback_steps)
    self.state = self.schedule.init()
    values = self.policy.recipe_for("layers/attn/attn_values")
    if config.task == "lm" and self.policy.pure and not values.is_high_precision:
      own = not config.model.get("factory") and config.model.name == "llama"
      if not own or key_span(values) is None:
        why = ("lpjax's LLaMA splits its attention-values product causally by key blocks, but "
               f"recipe {values.name} scales over the whole key axis (one scale per tensor or "
               "per channel)" if own else
               "a model.factory model's attention products are quantized as plain GEMMs")
        log.warning(
            "quant.policy='pure' quantizes the attention products, and %s: later tokens can change "
            "earlier positions' outputs, and a model can learn to read them "
            "(tests/models/test_llama_causality.py). Compare the eval loss with quantization off "
            "(eval/loss_fp); the default policy keeps these products in high precision.", why)

  def policy_at(self, step: int) -> QuantPolicy:
    recipe, self.state = self.schedule.recipe_at(self.state, step)
    policy = self.policy.with_recipe(recipe)
    if self.state.phase == "qaf":
      policy = dataclasses.replace(policy, forward_only=True)
    return policy

  def is_low_precision(self, policy: QuantPolicy) -> bool:
    """True for the run's own (quantized) policy and its forward-only QAF form, False for a
    warm-up/finish/fallback one."""
    return policy in (self.policy, dataclasses.replace(self.policy, forward_only=True))

  def observe(self, step: int, loss: float):
    self.state = self.schedule.observe(self.state, step, loss)

  def force_fallback(self, step: int):
    """The high-precision recipe for quant.fallback_steps steps from `step` (after a rollback)."""
    until = step + self.schedule.fallback_steps
    self.state = self.state._replace(fallback_until=max(self.state.fallback_until, until))

  def dump(self) -> dict:
    return {"losses": list(self.state.losses), "fallback_until": self.state.fallback_until}

  def load(self, saved: dict):
    if saved:
      self.state = ScheduleState(losses=tuple(saved.get("losses", ())),
                                 fallback_until=int(saved.get("fallback_until", -1)))
