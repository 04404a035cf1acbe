"""Loss and gradient scaling for low-precision gradients.

* :class:`DynamicLossScale` multiplies the loss by ``2^15`` before the backward pass, so that
  small gradients are representable in narrow formats (fp16, fp8); it halves on a non-finite
  gradient (and the step is skipped) and doubles after 2000 finite steps in a row.
* :func:`skip_nonfinite` wraps an optax transformation so that a step with a non-finite gradient
  leaves the parameters and the optimizer state unchanged.
* :func:`scale_by_adaptive_gradient_scaler` is an optax transform that multiplies the gradients
  by an adaptive factor keeping their global norm within ``[low, high]``.

A train step with loss scaling::

    loss_scale = DynamicLossScale()                       # carried in the train state
    tx = skip_nonfinite(stable_spam(learning_rate=1e-3))

    def train_step(params, opt_state, loss_scale, batch):
      grads = jax.grad(lambda p: loss_scale.scale(loss_fn(p, batch)))(params)
      grads = loss_scale.unscale(grads)
      loss_scale = loss_scale.adjust(all_finite(grads))
      updates, opt_state = tx.update(grads, opt_state, params)  # zeros if not finite
      return optax.apply_updates(params, updates), opt_state, loss_scale
"""

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


def all_finite(tree: Any) -> jax.Array:
  """True iff every element of every leaf of ``tree`` is finite (a bool scalar).

  Examples:
    >>> import jax.numpy as jnp
    >>> from lpjax.optim import all_finite
    >>> bool(all_finite({"a": jnp.ones(2), "b": jnp.array([1.0, jnp.inf])}))
    False
  """
  leaves = jax.tree.leaves(tree)
  if not leaves:
    return jnp.ones([], bool)
  return jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]).all()


def _scale_leaf(x, factor):
  return (x * factor.astype(jnp.promote_types(x.dtype, jnp.float32))).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class DynamicLossScale:
  """A dynamic loss scale, a pytree (carry it through ``jit`` in the train state).

  Attributes:
    loss_scale: the current scale (float32 scalar), ``2^15`` initially.
    counter: finite steps since the scale last changed (int32 scalar).
    period: grow after this many finite steps in a row (static).
    factor: grow by this factor, shrink by its inverse (static).
    min_loss_scale: the scale never goes below this (static).

  Examples:
    >>> import jax.numpy as jnp
    >>> from lpjax.optim import DynamicLossScale
    >>> ls = DynamicLossScale()
    >>> float(ls.loss_scale), float(ls.scale(jnp.float32(1.0)))
    (32768.0, 32768.0)
    >>> float(ls.unscale(ls.scale(jnp.float32(3.0))))
    3.0
    >>> ls = ls.adjust(jnp.array(False))  # a non-finite gradient: halve (and skip the step)
    >>> float(ls.loss_scale)
    16384.0
  """

  loss_scale: jax.Array = dataclasses.field(
      default_factory=lambda: jnp.asarray(2.0**15, jnp.float32))
  counter: jax.Array = dataclasses.field(
      default_factory=lambda: jnp.zeros([], jnp.int32))
  period: int = 2000
  factor: float = 2.0
  min_loss_scale: float = 1.0

  def scale(self, tree: Any) -> Any:
    """Multiplies every leaf (e.g. the loss) by the loss scale, keeping dtypes."""
    return jax.tree.map(lambda x: _scale_leaf(x, self.loss_scale), tree)

  def unscale(self, tree: Any) -> Any:
    """Divides every leaf (e.g. the gradients) by the loss scale, keeping dtypes."""
    inverse = 1.0 / self.loss_scale
    return jax.tree.map(lambda x: _scale_leaf(x, inverse), tree)

  def adjust(self, grads_finite: jax.Array) -> "DynamicLossScale":
    """The loss scale of the next step.

    Args:
      grads_finite: bool scalar, whether this step's gradients were all finite
        (:func:`all_finite`).

    Returns:
      A new :class:`DynamicLossScale`: halved (not below ``min_loss_scale``) with the counter
      reset if ``grads_finite`` is False; doubled with the counter reset after ``period``
      finite steps in a row; otherwise the same scale with the counter incremented.
    """
    counter = self.counter + 1
    grow = grads_finite & (counter >= self.period)
    grown = self.loss_scale * self.factor
    # Do not grow into inf: a scale that overflows float32 would make every step non-finite.
    grown = jnp.where(jnp.isfinite(grown), grown, self.loss_scale)
    shrunk = jnp.maximum(self.loss_scale / self.factor, self.min_loss_scale)
    loss_scale = jnp.where(grads_finite, jnp.where(grow, grown, self.loss_scale), shrunk)
    counter = jnp.where(grads_finite & ~grow, counter, 0).astype(jnp.int32)
    return dataclasses.replace(self, loss_scale=loss_scale.astype(jnp.float32),
                               counter=counter)


jax.tree_util.register_dataclass(
    DynamicLossScale,
    data_fields=["loss_scale", "counter"],
    meta_fields=["period", "factor", "min_loss_scale"],
)


class SkipNonfiniteState(NamedTuple):
  """State of :func:`skip_nonfinite`.

  Attributes:
    inner_state: the wrapped transformation's state (unchanged on skipped steps).
    skipped: number of skipped steps so far (int32).
    last_finite: whether the last step's gradients were finite.
  """

  inner_state: Any
  skipped: jax.Array
  last_finite: jax.Array


def skip_nonfinite(
    inner: optax.GradientTransformation,
) -> optax.GradientTransformationExtraArgs:
  """Skips steps whose gradients are not all finite.

  On such a step the updates are zeros and ``inner``'s state is kept, so the step counters,
  moments and EMAs of the wrapped optimizer do not see the step at all. Unlike
  ``optax.apply_if_finite`` it never gives up after many non-finite steps: with loss scaling
  (:class:`DynamicLossScale`) the scale halves on each of them until the gradients are finite.

  Args:
    inner: the transformation to protect (e.g. :func:`lpjax.optim.stable_spam`).

  Returns:
    A :class:`optax.GradientTransformationExtraArgs`.

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> from lpjax.optim import skip_nonfinite
    >>> tx = skip_nonfinite(optax.adam(1e-3))
    >>> params = jnp.ones(2)
    >>> state = tx.init(params)
    >>> updates, state = tx.update(jnp.array([1.0, jnp.nan]), state, params)
    >>> updates.tolist(), int(state.skipped), int(state.inner_state[0].count)
    ([0.0, 0.0], 1, 0)
  """
  inner = optax.with_extra_args_support(inner)

  def init_fn(params):
    return SkipNonfiniteState(
        inner_state=inner.init(params),
        skipped=jnp.zeros([], jnp.int32),
        last_finite=jnp.ones([], bool))

  def update_fn(updates, state, params=None, **extra_args):
    finite = all_finite(updates)
    new_updates, new_inner = inner.update(updates, state.inner_state, params, **extra_args)
    new_updates = jax.tree.map(
        lambda u: jnp.where(finite, u, jnp.zeros_like(u)), new_updates)
    inner_state = jax.tree.map(
        lambda new, old: jnp.where(finite, new, old), new_inner, state.inner_state)
    skipped = jnp.where(finite, state.skipped, optax.safe_increment(state.skipped))
    return new_updates, SkipNonfiniteState(inner_state, skipped, finite)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


class ScaleByAdaptiveGradientScalerState(NamedTuple):
  """State of :func:`scale_by_adaptive_gradient_scaler`.

  Attributes:
    scale: the factor applied at the next step (float32 scalar).
  """

  scale: jax.Array


def scale_by_adaptive_gradient_scaler(
    initial: float = 2.0,
    grow: float = 1.5,
    shrink: float = 0.8,
    low: float = 1e-4,
    high: float = 10.0,
) -> optax.GradientTransformation:
  """Multiplies the gradients by an adaptive scale that keeps their global norm in range.

  Each step outputs ``scale * g`` with the current scale, then updates the scale from the
  global norm ``n`` of that output: ``scale *= grow`` if ``n < low``, ``scale *= shrink`` if
  ``n > high`` or ``n`` is not finite, unchanged otherwise. Placed before a transform that
  stores or communicates gradients in a low-precision format, it keeps small gradients from
  underflowing that format. Adam-type optimizers (Adam, SPAM, the Adam part of Stable-SPAM)
  are invariant to a constant gradient scale up to ``eps``; the current factor is
  ``state.scale`` if a later step needs to undo it.

  Args:
    initial: the scale of the first step.
    grow: growth factor when the scaled norm is below ``low``.
    shrink: shrink factor when the scaled norm is above ``high``.
    low: lower end of the target range of the scaled gradient norm.
    high: upper end of that range.

  Returns:
    A :class:`optax.GradientTransformation`; updates keep the gradients' dtypes.

  Examples:
    >>> import jax.numpy as jnp
    >>> from lpjax.optim import scale_by_adaptive_gradient_scaler
    >>> tx = scale_by_adaptive_gradient_scaler()
    >>> state = tx.init(jnp.zeros(3))
    >>> updates, state = tx.update(jnp.full(3, 1e-6), state)
    >>> round(float(updates[0]), 12), float(state.scale)  # norm 3.5e-6 < 1e-4: grow
    (2e-06, 3.0)
  """

  def init_fn(params):
    del params
    return ScaleByAdaptiveGradientScalerState(scale=jnp.asarray(initial, jnp.float32))

  def update_fn(updates, state, params=None):
    del params
    scaled = jax.tree.map(lambda g: _scale_leaf(g, state.scale), updates)
    norm = optax.tree.norm(jax.tree.map(
        lambda g: g.astype(jnp.promote_types(g.dtype, jnp.float32)), scaled))
    factor = jnp.where(norm < low, grow, jnp.where((norm > high) | ~jnp.isfinite(norm),
                                                   shrink, 1.0))
    return scaled, ScaleByAdaptiveGradientScalerState(
        scale=(state.scale * factor).astype(jnp.float32))

  return optax.GradientTransformation(init_fn, update_fn)
