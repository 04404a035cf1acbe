"""SPAM: Adam with spike-aware clipping and periodic momentum resets (docs/numerics.md §9).

Follows the reference PyTorch code (TianjinYellow/SPAM-Optimizer ``galore_torch/SPAM.py``):
moments zeroed every ``reset_interval`` steps (the step counter is not reset), spike clipping
off for ``clip_free_steps`` steps after the start and after each reset, a cosine warm-up of the
step size after each reset, and weight decay applied to the *updated* weights.
"""

import math
from typing import Any, Callable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import optax
import optax.tree

from lpjax.optim import _low_precision_state as low_precision_state
from lpjax.optim import _safe_norms as safe_norms
from lpjax.optim._checks import check_hyperparameters

ScalarOrSchedule = Union[float, jax.Array, Callable[[jax.Array], jax.Array]]


class ScaleBySpamState(NamedTuple):
  """State of :func:`scale_by_spam`.

  Attributes:
    count: steps taken, ``t - 1`` during step ``t`` (int32). It is both the global step and
      the per-tensor step of the reference, which is never reset.
    mu: first moments, in ``mu_dtype`` (default: the params' dtypes).
    nu: second moments, in ``nu_dtype`` (default: the params' dtypes).
  """

  count: jax.Array
  mu: optax.Updates
  nu: optax.Updates


class DecayUpdatedWeightsState(NamedTuple):
  """State of :func:`decay_updated_weights`: the step count of the learning-rate schedule."""

  count: jax.Array


def _phase(t, reset_interval):
  """(is_reset, steps since the last reset or since the start, a reset happened)."""
  if reset_interval is None:
    return jnp.zeros([], bool), t, jnp.zeros([], bool)
  interval = jnp.asarray(reset_interval, t.dtype)
  has_resets = interval > 0
  phase = jnp.where(has_resets, t % jnp.maximum(interval, 1), t)
  return has_resets & (phase == 0), phase, has_resets & (t >= interval)


def scale_by_spam(
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-6,
    spike_threshold: jax.typing.ArrayLike = 5000.0,
    reset_interval: Optional[jax.typing.ArrayLike] = 500,
    reset_warmup_steps: jax.typing.ArrayLike = 150,
    clip_free_steps: jax.typing.ArrayLike = 20,
    mu_dtype: Optional[jax.typing.DTypeLike] = None,
    nu_dtype: Optional[jax.typing.DTypeLike] = None,
    *,
    seed: jax.typing.ArrayLike = 0,
) -> optax.GradientTransformation:
  r"""Rescales updates with SPAM (without learning rate or weight decay).

  Step ``t`` (docs/numerics.md §9): zero the moments if ``t % reset_interval == 0``; unless within
  ``clip_free_steps`` of the start or of a reset, replace spikes ``g^2 > theta v`` (``v`` the
  stored second moment) by ``sign(g) sqrt(theta v)``; Adam moments; output
  ``sqrt(1 - b2^t) / (1 - b1^t) * w * m / (sqrt(v) + eps)`` where ``w`` ramps from 0.01 to 1
  with a cosine over ``reset_warmup_steps`` steps after each reset (1 before the first).

  Args:
    b1: decay of the first moment.
    b2: decay of the second moment.
    eps: added to ``sqrt(v)`` (not debiased).
    spike_threshold: ``theta``; 0 turns clipping off.
    reset_interval: momentum reset period in steps; ``None`` or 0: never.
    reset_warmup_steps: ``N``, length of the step-size warm-up after each reset.
    clip_free_steps: steps without spike clipping at the start and after each reset.
    mu_dtype: storage dtype of the first moment; ``None``: the params' dtypes. bfloat16 is
      stored with stochastic rounding.
    nu_dtype: the same for the second moment.
    seed: seed of the stochastic-rounding bits; unused with float32 storage.

  Returns:
    A :class:`optax.GradientTransformation`; updates keep the gradients' dtypes.

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> from lpjax.optim import scale_by_spam
    >>> tx = scale_by_spam()
    >>> state = tx.init(jnp.zeros(2))
    >>> updates, state = tx.update(jnp.array([2.0, -0.5]), state)
    >>> [round(float(u), 3) for u in updates]  # the first step is sign(g), up to eps
    [1.0, -1.0]

  References:
    Huang et al., `SPAM: Spike-Aware Adam with Momentum Reset for Stable LLM Training
    <https://arxiv.org/abs/2501.06842>`_, ICLR 2025.
  """
  check_hyperparameters("spam", decays=dict(b1=b1, b2=b2), eps=eps,
                        reset_interval=reset_interval,
                        nonnegative=dict(spike_threshold=spike_threshold,
                                         reset_warmup_steps=reset_warmup_steps,
                                         clip_free_steps=clip_free_steps),
                        dtypes=dict(mu_dtype=mu_dtype, nu_dtype=nu_dtype))
  mu_dtype = None if mu_dtype is None else jnp.dtype(mu_dtype)
  nu_dtype = None if nu_dtype is None else jnp.dtype(nu_dtype)

  def init_fn(params):
    return ScaleBySpamState(
        count=jnp.zeros([], jnp.int32),
        mu=low_precision_state.zero_moments(params, mu_dtype),
        nu=low_precision_state.zero_moments(params, nu_dtype),
    )

  def update_fn(updates, state, params=None):
    del params
    t = optax.safe_increment(state.count)
    is_reset, phase, after_reset = _phase(t, reset_interval)
    clip_free = jnp.asarray(clip_free_steps, t.dtype)
    clip_on = (t >= clip_free) & (phase >= clip_free) & (
        jnp.asarray(spike_threshold) > 0)  # §9 step 3
    grads, treedef = jax.tree.flatten(updates)
    mus = treedef.flatten_up_to(state.mu)
    nus = treedef.flatten_up_to(state.nu)

    def one_tensor(g, mu, nu):
      dt = jnp.promote_types(g.dtype, jnp.float32)
      gf = g.astype(dt)
      # §9 step 1: zero the moments of a reset step before anything else.
      m_prev = jnp.where(is_reset, 0, mu.astype(dt))
      v_prev = jnp.where(is_reset, 0, nu.astype(dt))
      limit = spike_threshold * v_prev
      # Where g**2 or theta * v overflows, the same test and bound from the roots (_safe_norms):
      # |g| > sqrt(theta) sqrt(v), clipped to sqrt(theta) sqrt(v); the plain bits elsewhere.
      root_limit = jnp.sqrt(jnp.asarray(spike_threshold, dt)) * jnp.sqrt(v_prev)
      square = jnp.square(gf)
      plain = jnp.isfinite(square) & jnp.isfinite(limit)
      spike = jnp.where(plain, square > limit, jnp.abs(gf) > root_limit)
      bound = jnp.where(jnp.isfinite(limit), jnp.sqrt(limit), root_limit)
      gf = jnp.where(clip_on & spike, jnp.sign(gf) * bound, gf)
      # An entry whose square overflows enters the moments at the largest one whose square does
      # not (2**64 - 2**41 in float32), so v and the update stay finite.
      gf = safe_norms.saturate(gf)
      m = b1 * m_prev + (1 - b1) * gf
      v = b2 * v_prev + (1 - b2) * jnp.square(gf)
      # §9 step 5: cosine warm-up of the step size after each reset.
      n = jnp.asarray(reset_warmup_steps, dt)
      c = phase.astype(dt)
      ramp = 1 - 0.99 * (1 + jnp.cos(math.pi * c / (n + 1))) / 2
      w = jnp.where(after_reset & (c < n), ramp, 1)
      tf = t.astype(dt)
      step_size = jnp.sqrt(1 - b2**tf) / (1 - b1**tf) * w
      update = step_size * (m / (jnp.sqrt(v) + eps))
      return update.astype(low_precision_state.float_dtype(g.dtype)), m, v

    results = [one_tensor(*xs) for xs in zip(grads, mus, nus)]
    new_mu = [r[1] for r in results]
    new_nu = [r[2] for r in results]
    new_mu, new_nu = low_precision_state.store_moments(
        new_mu, new_nu, [x.dtype for x in mus], [x.dtype for x in nus],
        low_precision_state.step_key(seed, t))
    new_updates = treedef.unflatten([r[0] for r in results])
    return new_updates, ScaleBySpamState(
        count=t, mu=treedef.unflatten(new_mu), nu=treedef.unflatten(new_nu))

  return optax.GradientTransformation(init_fn, update_fn)


def decay_updated_weights(
    weight_decay: jax.typing.ArrayLike,
    learning_rate: ScalarOrSchedule,
    mask: Optional[Union[Any, Callable[[optax.Params], Any]]] = None,
) -> optax.GradientTransformation:
  r"""Weight decay of the *updated* weights, as SPAM's reference applies it (§9 step 6).

  Expects the final updates ``u`` (learning rate and sign included) and returns
  ``u - lr_t * weight_decay * (params + u)``, so that applying it gives
  ``p' = (p + u) (1 - lr_t * weight_decay)``.

  Args:
    weight_decay: the decay coefficient.
    learning_rate: a float or a schedule (called with the step count, 0 at the first update).
    mask: a pytree of bools (or a function of the params returning one) selecting the tensors
      to decay; ``None``: all.

  Returns:
    A :class:`optax.GradientTransformation` (needs ``params``).

  Examples:
    >>> import jax.numpy as jnp
    >>> from lpjax.optim import decay_updated_weights
    >>> tx = decay_updated_weights(0.1, 0.5)
    >>> updates, _ = tx.update(jnp.array([-1.0]), tx.init(None), jnp.array([3.0]))
    >>> round(float(updates[0]), 6)  # (3 - 1) * (1 - 0.05) - 3
    -1.1
  """

  check_hyperparameters("decay_updated_weights", nonnegative=dict(
      weight_decay=weight_decay, learning_rate=learning_rate))

  def init_fn(params):
    del params
    return DecayUpdatedWeightsState(count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("decay_updated_weights needs the params.")
    lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
    rate = lr * weight_decay

    def decay(u, p):
      dt = jnp.promote_types(u.dtype, jnp.float32)
      uf = u.astype(dt)
      return (uf - rate * (p.astype(dt) + uf)).astype(u.dtype)

    new_updates = jax.tree.map(decay, updates, params)
    return new_updates, DecayUpdatedWeightsState(count=optax.safe_increment(state.count))

  tx = optax.GradientTransformation(init_fn, update_fn)
  return tx if mask is None else optax.masked(tx, mask)


def spam(
    learning_rate: ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-6,
    spike_threshold: jax.typing.ArrayLike = 5000.0,
    reset_interval: Optional[jax.typing.ArrayLike] = 500,
    reset_warmup_steps: jax.typing.ArrayLike = 150,
    clip_free_steps: jax.typing.ArrayLike = 20,
    weight_decay: jax.typing.ArrayLike = 0.0,
    weight_decay_mask: Optional[Union[Any, Callable[[optax.Params], Any]]] = None,
    mu_dtype: Optional[jax.typing.DTypeLike] = None,
    nu_dtype: Optional[jax.typing.DTypeLike] = None,
    *,
    seed: jax.typing.ArrayLike = 0,
) -> optax.GradientTransformation:
  r"""The SPAM optimizer (docs/numerics.md §9), equal to the reference.

  :func:`scale_by_spam`, then the (scheduled) learning rate, then, if ``weight_decay`` is not
  zero, :func:`decay_updated_weights` (the reference decays the updated weights).

  Args:
    learning_rate: a float or an optax schedule (called with the step count, 0 first).
    b1, b2, eps, spike_threshold, reset_interval, reset_warmup_steps, clip_free_steps,
      mu_dtype, nu_dtype, seed: see :func:`scale_by_spam`.
    weight_decay: decay coefficient, multiplied by the learning rate.
    weight_decay_mask: selects the tensors to decay (see :func:`decay_updated_weights`).

  Returns:
    A :class:`optax.GradientTransformation`.

  Examples:
    >>> import jax, jax.numpy as jnp, optax
    >>> from lpjax.optim import spam
    >>> f = lambda p: jnp.sum((p - 3.0) ** 2)
    >>> tx = spam(learning_rate=0.1, reset_interval=50, reset_warmup_steps=10)
    >>> params = jnp.zeros(3)
    >>> state = tx.init(params)
    >>> for _ in range(100):
    ...   updates, state = tx.update(jax.grad(f)(params), state, params)
    ...   params = optax.apply_updates(params, updates)
    >>> bool(f(params) < f(jnp.zeros(3)) / 100)
    True

  References:
    Huang et al., `SPAM: Spike-Aware Adam with Momentum Reset for Stable LLM Training
    <https://arxiv.org/abs/2501.06842>`_, ICLR 2025.
  """
  check_hyperparameters("spam", nonnegative=dict(learning_rate=learning_rate,
                                                weight_decay=weight_decay))
  parts = [
      scale_by_spam(
          b1=b1, b2=b2, eps=eps, spike_threshold=spike_threshold,
          reset_interval=reset_interval, reset_warmup_steps=reset_warmup_steps,
          clip_free_steps=clip_free_steps, mu_dtype=mu_dtype, nu_dtype=nu_dtype, seed=seed),
      optax.scale_by_learning_rate(learning_rate),
  ]
  if not (isinstance(weight_decay, (int, float)) and weight_decay == 0):
    parts.append(decay_updated_weights(weight_decay, learning_rate, weight_decay_mask))
  return optax.chain(*parts)
