"""The run's precision schedule (lpjax.quant.schedule) driven from the config, checkpointable.

Examples:
  >>> from lpjax.train.config import llama_config
  >>> c = llama_config("tiny", recipe="mxfp4")
  >>> c.steps, c.quant.warmup_fraction = 100, 0.1
  >>> p = PrecisionController(c)
  >>> p.recipe_at(0), p.recipe_at(50)   # None: the policy's own recipes
  ('bf16', None)
"""

from __future__ import annotations

from lpjax.quant.schedule import PrecisionSchedule, ScheduleState


class PrecisionController:
  """recipe_at(step) -> recipe override name or None; observe(step, loss) feeds the fallback."""

  def __init__(self, config):
    q = config.quant
    self.schedule = PrecisionSchedule(
        total_steps=config.steps, recipe=None, high_precision=q.high_precision_recipe,
        warmup_fraction=q.warmup_fraction, finish_fraction=q.finish_fraction,
        fallback_factor=q.fallback_factor if q.fallback_factor > 0 else None,
        fallback_steps=q.fallback_steps)
    self.state = self.schedule.init()

  def recipe_at(self, step: int):
    recipe, self.state = self.schedule.recipe_at(self.state, step)
    return recipe

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
