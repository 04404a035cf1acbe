"""Stable-SPAM: Adam with adaptive spike clipping, adaptive gradient-norm scaling and resets.

The update rule is docs/numerics.md §8 (the contract taken from the reference PyTorch code,
TianjinYellow/StableSPAM ``galore_torch/stablespam.py``), including its two quirks, which the
default reproduces so that trajectories match the reference:

* the momentum reset at ``t % reset_interval == 0`` stores zero moments and sets the step to 1,
  but the update of that step still uses the old moments (debiased with step 1);
* AdaClip, AdaGN and Adam share one step counter, so the never-reset clipping and norm EMAs are
  debiased with the reset counter.

Both have off-by-default fixes: ``zero_moments_on_reset`` and ``debias_with_global_step``.
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


class ScaleByStableSpamState(NamedTuple):
  """State of :func:`scale_by_stable_spam`.

  Attributes:
    count: global steps taken, ``t - 1`` during step ``t`` (int32).
    step: the per-tensor step ``k`` of docs/numerics.md §8, the same for every tensor; set to 1 at a
      momentum reset (int32).
    mu: Adam first moments, in ``mu_dtype`` (default: the params' dtypes).
    nu: Adam second moments, in ``nu_dtype`` (default: the params' dtypes).
    max_ema: per-tensor EMA of ``max|g|`` (AdaClip), one scalar per tensor.
    norm_ema: per-tensor EMA of ``||g||`` (AdaGN), one scalar per tensor.
    norm_sq_ema: per-tensor EMA of ``||g||^2`` (AdaGN), one scalar per tensor.
  """

  count: jax.Array
  step: jax.Array
  mu: optax.Updates
  nu: optax.Updates
  max_ema: optax.Updates
  norm_ema: optax.Updates
  norm_sq_ema: optax.Updates


def _stat_dtype(dtype) -> jnp.dtype:
  """Computation dtype of a tensor's statistics: at least float32."""
  return jnp.promote_types(dtype, jnp.float32)


def _is_reset_step(t: jax.Array, reset_interval) -> jax.Array:
  if reset_interval is None:
    return jnp.zeros([], bool)
  interval = jnp.asarray(reset_interval, t.dtype)
  return (interval > 0) & (t % jnp.maximum(interval, 1) == 0)


def _stacked_flags(stacked_layers, tree):
  """stacked_layers (None, a pytree of bools, or a function of `tree`) as a pytree of bools."""
  if stacked_layers is None:
    return jax.tree.map(lambda _: False, tree)
  flags = stacked_layers(tree) if callable(stacked_layers) else stacked_layers
  try:
    flags = jax.tree.map(lambda _, stacked: bool(stacked), tree, flags)
  except ValueError as e:
    raise ValueError(f"stacked_layers must have the structure of the params ({e}).") from e
  for path, leaf in jax.tree_util.tree_leaves_with_path(
      jax.tree.map(lambda x, stacked: stacked and jnp.ndim(x) < 1, tree, flags)):
    if leaf:
      raise ValueError(f"stacked_layers marks {jax.tree_util.keystr(path)}, a scalar, as stacked; "
                       "only tensors with a leading layer axis can be.")
  return flags


def beta_scale(t: jax.Array, total_steps, eta_min, dtype) -> jax.Array:
  """The cosine factor ``s`` of docs/numerics.md §8 step 1 that multiplies ``b1`` and ``gamma1``."""
  if total_steps is None:
    return jnp.ones([], dtype)
  t = t.astype(dtype)
  total = jnp.asarray(total_steps, dtype)
  eta_min = jnp.asarray(eta_min, dtype)
  # Periodic past total_steps, like the reference's CosineAnnealingLR(T_max = total_steps + 1).
  return eta_min + (1 - eta_min) * (1 + jnp.cos(math.pi * t / (total + 1))) / 2


def scale_by_stable_spam(
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    gamma1: jax.typing.ArrayLike = 0.7,
    gamma2: jax.typing.ArrayLike = 0.9,
    gamma3: jax.typing.ArrayLike = 0.999,
    reset_interval: Optional[jax.typing.ArrayLike] = 1000,
    total_steps: Optional[jax.typing.ArrayLike] = None,
    eta_min: jax.typing.ArrayLike = 0.5,
    mu_dtype: Optional[jax.typing.DTypeLike] = None,
    nu_dtype: Optional[jax.typing.DTypeLike] = None,
    *,
    zero_moments_on_reset: bool = False,
    debias_with_global_step: bool = False,
    seed: jax.typing.ArrayLike = 0,
    stacked_layers: Optional[Union[Any, Callable[[optax.Params], Any]]] = None,
) -> optax.GradientTransformation:
  r"""Rescales updates with Stable-SPAM (without learning rate or weight decay).

  Per tensor and step (docs/numerics.md §8): AdaClip rescales the entries above an EMA of ``max|g|``,
  AdaGN rescales the whole tensor to an EMA of its norm, then Adam with ``b1 * s`` where ``s``
  is an optional cosine factor. The moments are reset every ``reset_interval`` steps. Maxima
  and norms are over the whole (global) tensor, also when it is sharded.

  Args:
    b1: Adam decay of the first moment.
    b2: Adam decay of the second moment.
    eps: added to the denominators of AdaGN and Adam.
    gamma1: AdaGN decay of the EMA of ``||g||`` (0.7 in the paper's 4-bit runs, 0.85 BF16).
    gamma2: AdaGN decay of the EMA of ``||g||^2`` (0.9 in 4-bit runs, 0.99999 BF16).
    gamma3: AdaClip decay of the EMA of ``max|g|``.
    reset_interval: momentum reset period ``Delta T`` in global steps; ``None`` or 0: never.
    total_steps: ``total_T``; when given, ``b1`` and ``gamma1`` are multiplied by
      ``eta_min + (1 - eta_min) (1 + cos(pi t / (total_steps + 1))) / 2`` (periodic past it).
      ``None``: factor 1.
    eta_min: the smallest value of that factor.
    mu_dtype: storage dtype of the first moment; ``None``: the params' dtypes. bfloat16 is
      stored with stochastic rounding (see :mod:`lpjax.optim._low_precision_state`).
    nu_dtype: the same for the second moment.
    zero_moments_on_reset: not in the reference. If True, a reset step zeroes the moments
      *before* its update, which then is a fresh Adam first step (and its moments are kept
      for the next step), instead of updating with the stale moments debiased with step 1 and
      storing zeros (the reference's behaviour, default).
    debias_with_global_step: not in the reference. If True, the never-reset AdaClip/AdaGN EMAs
      are debiased with the global step ``t`` instead of the shared, reset counter ``k``.
    seed: seed of the stochastic-rounding bits (the key of step ``t`` is derived from
      ``(seed, t)``); unused with float32 storage.
    stacked_layers: a pytree of bools (or a function of the params returning one) marking the
      tensors whose leading axis stacks the same weight of several layers, as a scanned model
      stores them. Each layer of such a tensor is its own tensor of the rule: AdaClip's max and
      AdaGN's norms are per layer (state of shape ``(layers,)``), as with unstacked layers
      (the update is vmapped over the layers; bf16 moments of layer ``l`` take their SR bits
      from ``fold_in(tensor_key, l)``). ``None``: no tensor is stacked.

  Returns:
    A :class:`optax.GradientTransformation`; updates keep the gradients' dtypes.

  Examples:
    >>> import jax, jax.numpy as jnp, optax
    >>> from lpjax.optim import scale_by_stable_spam
    >>> tx = optax.chain(scale_by_stable_spam(), optax.scale_by_learning_rate(1e-3))
    >>> params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
    >>> state = tx.init(params)
    >>> grads = jax.tree.map(jnp.ones_like, params)
    >>> updates, state = tx.update(grads, state, params)
    >>> [round(float(u), 6) for u in updates["b"]]
    [-0.001, -0.001, -0.001]

  References:
    Huang et al., `Stable-SPAM: How to Train in 4-Bit More Stably than 16-Bit Adam
    <https://arxiv.org/abs/2502.17055>`_, 2025.
  """
  check_hyperparameters("stable_spam", decays=dict(b1=b1, b2=b2, gamma1=gamma1, gamma2=gamma2,
                                                   gamma3=gamma3),
                        eps=eps, total_steps=total_steps, reset_interval=reset_interval,
                        dtypes=dict(mu_dtype=mu_dtype, nu_dtype=nu_dtype),
                        unit=dict(eta_min=eta_min))
  mu_dtype = None if mu_dtype is None else jnp.dtype(mu_dtype)
  nu_dtype = None if nu_dtype is None else jnp.dtype(nu_dtype)

  def init_fn(params):
    flags = _stacked_flags(stacked_layers, params)
    stat = lambda p, stacked: jnp.zeros(p.shape[:1] if stacked else [], _stat_dtype(p.dtype))
    stats = lambda: jax.tree.map(stat, params, flags)
    return ScaleByStableSpamState(
        count=jnp.zeros([], jnp.int32),
        step=jnp.zeros([], jnp.int32),
        mu=low_precision_state.zero_moments(params, mu_dtype),
        nu=low_precision_state.zero_moments(params, nu_dtype),
        max_ema=stats(),
        norm_ema=stats(),
        norm_sq_ema=stats(),
    )

  def update_fn(updates, state, params=None):
    del params
    t = optax.safe_increment(state.count)  # global step, 1-based (§8)
    k = optax.safe_increment(state.step)  # shared per-tensor step (§8 step 3)
    is_reset = _is_reset_step(t, reset_interval)
    k_adam = jnp.where(is_reset, jnp.ones_like(k), k)  # §8 step 6
    k_stats = t if debias_with_global_step else k

    grads, treedef = jax.tree.flatten(updates)
    flat = [treedef.flatten_up_to(x) for x in (
        state.mu, state.nu, state.max_ema, state.norm_ema, state.norm_sq_ema)]

    def one_tensor(g, mu, nu, old_max_ema, old_norm_ema, old_norm_sq_ema):
      dt = _stat_dtype(g.dtype)
      gf = g.astype(dt)
      s = beta_scale(t, total_steps, eta_min, dt)
      kf, ka = k_stats.astype(dt), k_adam.astype(dt)
      # AdaClip (§8 step 4): proportional rescale of the entries above the debiased max EMA.
      g_max = jnp.max(jnp.abs(gf), initial=0)
      # The EMA is clamped to the largest float (a no-op below it): never inf from finite g.
      max_ema = jnp.minimum(gamma3 * old_max_ema + (1 - gamma3) * g_max, safe_norms.finite_max(dt))
      threshold = max_ema / (1 - gamma3**kf)
      spike = jnp.abs(gf) > threshold
      safe_max = jnp.where(g_max > 0, g_max, 1)
      gf = jnp.where(spike, gf / safe_max * threshold, gf)
      # AdaGN (§8 step 5): rescale the clipped tensor's norm to the ratio of its norm EMAs.
      # Overflow-free, with the plain formula's bits wherever it is finite (_safe_norms): the norm
      # from the tensor scaled by 2**-e (max|gf| <= g_max), the statistics of a norm whose square
      # overflows taken at the largest one that does not (2**64 - 2**41 in float32), and the
      # debiased root from sqrt(nu) where nu / (1 - gamma2**k) overflows.
      norm, scaled_norm, down = safe_norms.scaled_norm(gf, g_max)
      norm_stat = safe_norms.saturate(norm)
      a = gamma1 * s
      norm_ema = a * old_norm_ema + (1 - a) * norm_stat
      norm_sq_ema = gamma2 * old_norm_sq_ema + (1 - gamma2) * jnp.square(norm_stat)
      debiased_sq = norm_sq_ema / (1 - gamma2**kf)
      root = jnp.where(jnp.isfinite(debiased_sq), jnp.sqrt(debiased_sq),
                       jnp.sqrt(norm_sq_ema) / jnp.sqrt(1 - gamma2**kf))
      target = (norm_ema / (1 - a**kf)) / (root + eps)
      safe_norm = jnp.where(scaled_norm > 0, scaled_norm, 1)
      gf = jnp.where(scaled_norm > 0, gf * down / safe_norm * target, gf)
      # Adam (§8 step 7) with b1' = b1 s, on the pre-reset moments unless asked otherwise.
      b1s = b1 * s
      m_prev, v_prev = mu.astype(dt), nu.astype(dt)
      if zero_moments_on_reset:
        m_prev = jnp.where(is_reset, 0, m_prev)
        v_prev = jnp.where(is_reset, 0, v_prev)
      m = b1s * m_prev + (1 - b1s) * gf
      v = b2 * v_prev + (1 - b2) * jnp.square(gf)
      update = m / (1 - b1s**ka) / (jnp.sqrt(v) / jnp.sqrt(1 - b2**ka) + eps)
      if not zero_moments_on_reset:
        # §8 step 6: the reference stores fresh zeros; the moments it just used are dropped.
        m = jnp.where(is_reset, 0, m)
        v = jnp.where(is_reset, 0, v)
      # Hyperparameters given as wider arrays must not widen the state (one jit trace).
      return (update.astype(low_precision_state.float_dtype(g.dtype)), m, v, max_ema.astype(old_max_ema.dtype),
              norm_ema.astype(old_norm_ema.dtype), norm_sq_ema.astype(old_norm_sq_ema.dtype))

    key = low_precision_state.step_key(seed, t)

    def stored_tensor(tensor_key, g, mu, nu, *stats):
      """one_tensor, its moments stored (store_moments's rule for tensor i given its key)."""
      update, m, v, *new_stats = one_tensor(g, mu, nu, *stats)
      m, v = low_precision_state.store_pair(m, v, mu.dtype, nu.dtype, tensor_key)
      return (update, m, v, *new_stats)

    def layer_by_layer(tensor_key, *xs):
      """stored_tensor of each slice along the leading axis (layer l's key is
      fold_in(tensor_key, l))."""
      layers = jnp.arange(xs[0].shape[0], dtype=jnp.uint32)
      keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(tensor_key, layers)
      return jax.vmap(stored_tensor)(keys, *xs)

    flags = treedef.flatten_up_to(_stacked_flags(stacked_layers, updates))
    results = [(layer_by_layer if stacked else stored_tensor)(jax.random.fold_in(key, i), *xs)
               for i, (stacked, xs) in enumerate(zip(flags, zip(grads, *flat)))]
    new_updates = [r[0] for r in results]
    new_mu = [r[1] for r in results]
    new_nu = [r[2] for r in results]

    unflatten = lambda i: treedef.unflatten([r[i] for r in results])
    new_state = ScaleByStableSpamState(
        count=t,
        step=k_adam,
        mu=treedef.unflatten(new_mu),
        nu=treedef.unflatten(new_nu),
        max_ema=unflatten(3),
        norm_ema=unflatten(4),
        norm_sq_ema=unflatten(5),
    )
    return treedef.unflatten(new_updates), new_state

  return optax.GradientTransformation(init_fn, update_fn)


def stable_spam(
    learning_rate: Optional[ScalarOrSchedule] = None,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    gamma1: jax.typing.ArrayLike = 0.7,
    gamma2: jax.typing.ArrayLike = 0.9,
    gamma3: jax.typing.ArrayLike = 0.999,
    reset_interval: Optional[jax.typing.ArrayLike] = 1000,
    total_steps: Optional[jax.typing.ArrayLike] = None,
    eta_min: jax.typing.ArrayLike = 0.5,
    weight_decay: jax.typing.ArrayLike = 0.0,
    weight_decay_mask: Optional[Union[Any, Callable[[optax.Params], Any]]] = None,
    mu_dtype: Optional[jax.typing.DTypeLike] = None,
    nu_dtype: Optional[jax.typing.DTypeLike] = None,
    *,
    zero_moments_on_reset: bool = False,
    debias_with_global_step: bool = False,
    seed: jax.typing.ArrayLike = 0,
    stacked_layers: Optional[Union[Any, Callable[[optax.Params], Any]]] = None,
) -> optax.GradientTransformation:
  r"""The Stable-SPAM optimizer (docs/numerics.md §8), optionally with its learning rate.

  With ``learning_rate=None`` this is :func:`scale_by_stable_spam` followed by decoupled weight
  decay (``u + weight_decay * params``), to be chained with a learning-rate transform such as
  ``optax.scale_by_learning_rate(schedule)``. With a float or a schedule it is the complete
  optimizer, equal to the reference: ``p <- p (1 - lr_t wd) - lr_t u``, i.e. the decay of the
  pre-update weights with the scheduled learning rate of the same step.

  Args:
    learning_rate: ``None``, a float, or an optax schedule (called with the step count, 0
      at the first update).
    b1, b2, eps, gamma1, gamma2, gamma3, reset_interval, total_steps, eta_min, mu_dtype,
      nu_dtype, zero_moments_on_reset, debias_with_global_step, seed, stacked_layers: see
      :func:`scale_by_stable_spam`.
    weight_decay: decoupled weight decay coefficient (multiplied by the learning rate).
    weight_decay_mask: a pytree of bools (or a function of the params returning one) that
      selects the tensors to decay; ``None``: all. Pass it in ``static_args`` when wrapping a
      callable mask with ``optax.inject_hyperparams``.

  Returns:
    A :class:`optax.GradientTransformation`; it needs ``params`` in ``update`` when
    ``weight_decay`` is not a literal 0.

  Examples:
    >>> import jax, jax.numpy as jnp, optax
    >>> from lpjax.optim import stable_spam
    >>> f = lambda p: jnp.sum((p - 3.0) ** 2)
    >>> tx = stable_spam(learning_rate=0.1, reset_interval=50)
    >>> params = jnp.zeros(3)
    >>> state = tx.init(params)
    >>> for _ in range(100):
    ...   updates, state = tx.update(jax.grad(f)(params), state, params)
    ...   params = optax.apply_updates(params, updates)
    >>> bool(f(params) < f(jnp.zeros(3)) / 100)
    True
    >>> schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-3, 2000, 20000, 1e-4)
    >>> tx = optax.chain(stable_spam(weight_decay=0.1), optax.scale_by_learning_rate(schedule))

  References:
    Huang et al., `Stable-SPAM: How to Train in 4-Bit More Stably than 16-Bit Adam
    <https://arxiv.org/abs/2502.17055>`_, 2025.
  """
  check_hyperparameters("stable_spam", nonnegative=dict(learning_rate=learning_rate,
                                                       weight_decay=weight_decay))
  parts = [
      scale_by_stable_spam(
          b1=b1, b2=b2, eps=eps, gamma1=gamma1, gamma2=gamma2, gamma3=gamma3,
          reset_interval=reset_interval, total_steps=total_steps, eta_min=eta_min,
          mu_dtype=mu_dtype, nu_dtype=nu_dtype,
          zero_moments_on_reset=zero_moments_on_reset,
          debias_with_global_step=debias_with_global_step, seed=seed,
          stacked_layers=stacked_layers),
  ]
  if not (isinstance(weight_decay, (int, float)) and weight_decay == 0):
    # §8 step 2: decay of the pre-update weights, scaled by the lr below (or chained later).
    parts.append(optax.add_decayed_weights(weight_decay, weight_decay_mask))
  if learning_rate is not None:
    parts.append(optax.scale_by_learning_rate(learning_rate))
  return optax.chain(*parts)
