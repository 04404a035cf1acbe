"""Optimizers by name with the papers' schedule: linear warm-up, then cosine decay to 10%.

Examples:
  >>> from lpjax.train.config import llama_config
  >>> c = llama_config("tiny", optimizer="stable_spam")
  >>> c.steps, c.optimizer.warmup_steps = 100, 10
  >>> schedule = learning_rate_schedule(c)
  >>> [round(float(schedule(s)), 6) for s in (0, 10, 100)]
  [0.0, 0.001, 0.0001]
  >>> tx = make_optimizer(c)
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import optax

from lpjax import optim

log = logging.getLogger(__name__)


def learning_rate_schedule(config) -> optax.Schedule:
  """Linear warm-up from 0 over optimizer.warmup_steps, then cosine decay to lr * min_lr_ratio."""
  o = config.optimizer
  warmup = min(o.warmup_steps, max(config.steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=o.lr, warmup_steps=warmup,
      decay_steps=max(config.steps, warmup + 1), end_value=o.lr * o.min_lr_ratio)


# The config keys the learning-rate schedule reads (`learning_rate_schedule`).
SCHEDULE_KEYS = ("steps", "optimizer.lr", "optimizer.warmup_steps", "optimizer.min_lr_ratio")


def schedule_change(saved: dict, config, step: int) -> str:
  """What resuming at `step` does to the learning rate when the schedule's keys changed since the
  checkpoint (`saved`: its flat config, {dotted key: value}): the lr at `step` under the old and
  the new schedule, and where the new one ends. "" when the schedule is unchanged.

  The schedule is a function of (step, config): a resumed run with more `steps` stretches the
  cosine to the new end, so the lr at the resume step jumps back up. No config key keeps the old
  curve; the message says so and what to do instead.

  Examples:
    >>> from lpjax.train.config import llama_config
    >>> c = llama_config("tiny", optimizer="adamw")
    >>> c.steps, c.optimizer.lr, c.optimizer.warmup_steps = 360, 1e-3, 100
    >>> text = schedule_change({"steps": 300, "optimizer.lr": 1e-3}, c, 300)
    >>> import textwrap
    >>> print(textwrap.fill(text.strip(), 90))
    The learning-rate schedule changes with it: at step 300 the lr was 1.00e-04 and is now
    2.13e-04 (+113%); the cosine now decays to 1.00e-04 at step 360 instead of step 300. No
    config key keeps the old curve: resume with --config.steps=300 to keep it, or train the
    longer run afresh in a new --workdir for one schedule from the start.
  """
  changed = [k for k in SCHEDULE_KEYS if k in saved and saved[k] != _flat_get(config, k)]
  if not changed:
    return ""
  old = config.copy_and_resolve_references()
  with old.unlocked():
    for key in changed:
      node = old
      *parents, leaf = key.split(".")
      for p in parents:
        node = node[p]
      node[leaf] = type(_flat_get(config, key))(saved[key])
  before = float(learning_rate_schedule(old)(step))
  after = float(learning_rate_schedule(config)(step))
  jump = f" ({100 * (after - before) / before:+.0f}%)" if before else ""
  o = config.optimizer
  text = (f" The learning-rate schedule changes with it: at step {step} the lr was {before:.2e} "
          f"and is now {after:.2e}{jump}; the cosine now decays to {o.lr * o.min_lr_ratio:.2e} at "
          f"step {config.steps}")
  if "steps" in changed:
    text += f" instead of step {saved['steps']}"
  text += "."
  if "steps" in changed and before != after:
    text += (f" No config key keeps the old curve: resume with --config.steps={saved['steps']} to "
             "keep it, or train the longer run afresh in a new --workdir for one schedule from the "
             "start.")
  if "steps" in changed and o.name == "stable_spam" and o.get("total_steps", 0) == -1:
    text += " Stable-SPAM's b1 / gamma1 cosine (optimizer.total_steps=-1) follows the new steps too."
  return text


def _flat_get(config, key):
  node = config
  for part in key.split("."):
    node = node[part]
  return node


def decay_mask(params):
  """Which tensors weight decay applies to, for every optimizer of the trainer: matrices and
  higher-rank kernels (ndim >= 2), not biases or norm scales, as the papers' AdamW setups do.

  (`lpjax.optim.stable_spam` / `spam` used on their own decay every tensor unless given
  `weight_decay_mask`, as the reference code does; the trainer passes this mask to all four.)

  Examples:
    >>> import jax.numpy as jnp
    >>> decay_mask({"kernel": jnp.ones((2, 3)), "scale": jnp.ones(3)})
    {'kernel': True, 'scale': False}
  """
  return jax.tree.map(lambda p: getattr(p, "ndim", 0) >= 2, params)


def _beta_decay(config) -> dict:
  """stable_spam's total_T (`optimizer.total_steps`; -1: the run's `steps`) and eta_min, when set."""
  total = config.optimizer.get("total_steps", 0)
  if total == 0:
    return {}
  total = config.steps if total == -1 else total
  return dict(total_steps=total, eta_min=config.optimizer.get("eta_min", 0.5))


def make_optimizer(config, stacked_layers=None) -> optax.GradientTransformation:
  """The optax chain for config.optimizer (gradient clipping first, if enabled); weight decay
  applies to the tensors of `decay_mask` whatever the optimizer (adam has none).

  `stacked_layers` (a function of the params, e.g. `Task.stacked_layers`) marks the tensors that
  stack the layers of a scanned model: Stable-SPAM keeps its per-tensor statistics per layer
  there and updates them one layer at a time (adam, adamw and spam are elementwise: unchanged).
  """
  o = config.optimizer
  _warn_if_stable_spam_settings_on_another_optimizer(o)
  schedule = learning_rate_schedule(config)
  state_dtype = jnp.bfloat16 if o.state_dtype == "bfloat16" else None
  if o.name == "adamw":
    tx = optax.adamw(schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay,
                     mu_dtype=state_dtype, mask=decay_mask)
  elif o.name == "adam":
    tx = optax.adam(schedule, b1=o.b1, b2=o.b2, eps=o.eps, mu_dtype=state_dtype)
  elif o.name == "spam":
    tx = optim.spam(schedule, b1=o.b1, b2=o.b2, eps=o.eps, reset_interval=o.reset_interval,
                    weight_decay=o.weight_decay, weight_decay_mask=decay_mask,
                    mu_dtype=state_dtype, nu_dtype=state_dtype, seed=config.seed)
  elif o.name == "stable_spam":
    tx = optim.stable_spam(schedule, b1=o.b1, b2=o.b2, eps=o.eps, gamma1=o.gamma1,
                           gamma2=o.gamma2, gamma3=o.gamma3, reset_interval=o.reset_interval,
                           weight_decay=o.weight_decay, weight_decay_mask=decay_mask,
                           mu_dtype=state_dtype, nu_dtype=state_dtype, seed=config.seed,
                           stacked_layers=stacked_layers, **_beta_decay(config))
  else:
    raise ValueError(f"Unknown optimizer {o.name!r}.")
  if o.grad_clip > 0:
    tx = optax.chain(optax.clip_by_global_norm(o.grad_clip), tx)
  return tx


def _warn_if_stable_spam_settings_on_another_optimizer(o):
  """A LLaMA FP4 config switched to another optimizer keeps Stable-SPAM's reference-script
  settings: total_steps (which only stable_spam reads) and grad_clip = 0, i.e. unclipped Adam."""
  if o.name != "stable_spam" and o.get("total_steps", 0) != 0 and o.grad_clip == 0:
    log.warning(
        "optimizer.name=%s with optimizer.grad_clip=0 and optimizer.total_steps=%s: these are "
        "Stable-SPAM's reference-script settings (the LLaMA FP4 configs), so this run has no "
        "global-norm clipping, and total_steps is ignored. For the usual %s recipe add "
        "--config.optimizer.grad_clip=1.0 --config.optimizer.total_steps=0.",
        o.name, o.total_steps, o.name)
