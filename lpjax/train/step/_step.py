"""The train state and the jitted train and eval steps, for any `lpjax.train.tasks.Task`.

One train step: forward and backward through the quantized GEMMs of the active recipe (SR keys
derived from (seed, step)) of the step's QuantPolicy, optional dynamic loss scaling, then the
optax update, skipped (state kept) when the loss, a gradient, a new parameter or the new optimizer
state is non-finite. The state is a plain pytree, so orbax saves it
and NamedSharding places it.

Examples:
  >>> import jax, jax.numpy as jnp, optax
  >>> def loss_fn(params, model_state, batch, key, policy):
  ...   return jnp.mean((batch["x"] * params["w"] - batch["y"]) ** 2), (model_state, {})
  >>> step = make_train_step(loss_fn, optax.sgd(0.1))
  >>> state = init_state({"w": jnp.array(0.0)}, None, optax.sgd(0.1))
  >>> batch = {"x": jnp.ones(4), "y": jnp.full(4, 2.0)}
  >>> state, metrics = step(state, batch, jax.random.key(0), policy=None)
  >>> round(float(state.params["w"]), 6), float(metrics["loss"]), int(state.step)  # w += 0.1*2*2
  (0.4, 4.0, 1)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from lpjax import optim, quant
from lpjax.optim._low_precision_state import round_with_noise
from lpjax.quant.monitor.site_stats import measured_value_and_grad
from lpjax.nn import constrain
from lpjax.train.schema._config_schema import GRAD_ACCUM_DTYPES, PARAM_ROUNDINGS


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
  step: jax.Array  # int32: optimizer steps taken
  params: Any  # model parameters (an nnx.State)
  model_state: Any  # non-trained model variables (BatchNorm statistics), or None
  opt_state: Any  # optax state
  loss_scale: Any  # optim.DynamicLossScale, or None
  skipped: jax.Array  # int32: updates skipped (non-finite loss, gradients or update), in total
  consecutive_skips: jax.Array  # int32: ... in a row, up to now


def init_state(params, model_state, tx: optax.GradientTransformation, *,
               loss_scale: bool = False) -> TrainState:
  """A fresh TrainState at step 0."""
  zero = jnp.zeros([], jnp.int32)
  return TrainState(step=zero, params=params, model_state=model_state, opt_state=tx.init(params),
                    loss_scale=optim.DynamicLossScale() if loss_scale else None, skipped=zero,
                    consecutive_skips=zero)


def all_finite_floats(tree):
  """True iff every floating-point leaf of `tree` is finite (int counters and keys are skipped)."""
  leaves = [x for x in jax.tree.leaves(tree)
            if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)]
  return optim.all_finite(leaves)


_PARAM_ROUNDING_TAG = 0x7A5E  # fold_in tag of the parameter-update SR key (microbatches use 0..k-1)
_ACCUM_ROUNDING_TAG = 0xACC0  # ... of the gradient accumulator's SR key (then the microbatch)


def accumulate(total, grads, key):
  """total + grads, leaf by leaf, in total's dtype: float32 exactly as `jnp.add`; a bfloat16
  accumulator sums in float32 and rounds back stochastically (unbiased: a microbatch's gradient
  far below the accumulator's ulp still counts on average), with elementwise bits that fuse into
  the add.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> total = {"g": jnp.ones(20000, jnp.bfloat16)}
    >>> step = {"g": jnp.full(20000, 2.0**-10, jnp.bfloat16)}  # an eighth of bf16's ulp at 1
    >>> summed = accumulate(total, step, jax.random.key(0))["g"].astype(jnp.float32)
    >>> round(float(summed.mean()) - 1, 3)  # 2^-10 on average; round to nearest would give 0
    0.001
    >>> accumulate({"g": jnp.ones(2)}, {"g": jnp.ones(2)}, None)["g"].tolist()
    [2.0, 2.0]
  """
  leaves, treedef = jax.tree.flatten(total)
  out = []
  for i, (t, g) in enumerate(zip(leaves, treedef.flatten_up_to(grads))):
    if t.dtype == jnp.bfloat16:
      out.append(_bf16_sum(t, g, jax.random.fold_in(key, i)))
    else:
      out.append((t.astype(jnp.float32) + g.astype(jnp.float32)).astype(t.dtype))
  return treedef.unflatten(out)


def apply_updates(params, updates, key, rounding: str = "stochastic"):
  """params + updates; bfloat16 parameters are updated in float32 and rounded back to bfloat16
  stochastically (`rounding="stochastic"`, unbiased: updates far below an ulp still move the
  weight on average) or to nearest (they are lost). Other dtypes: `optax.apply_updates`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> p = {"w": jnp.ones(20000, jnp.bfloat16)}
    >>> u = {"w": jnp.full(20000, 2.0**-10, jnp.float32)}  # an eighth of bf16's ulp at 1
    >>> float(apply_updates(p, u, None, "nearest")["w"].astype(jnp.float32).mean())
    1.0
    >>> mean = apply_updates(p, u, jax.random.key(0))["w"].astype(jnp.float32).mean()
    >>> bool(abs(float(mean) - (1 + 2.0**-10)) < 1e-4)
    True
  """
  if rounding not in PARAM_ROUNDINGS:
    raise ValueError(f"rounding must be one of {PARAM_ROUNDINGS}, got {rounding!r}.")
  leaves, treedef = jax.tree.flatten(params)
  update_leaves = treedef.flatten_up_to(updates)
  out = []
  for i, (p, u) in enumerate(zip(leaves, update_leaves)):
    if p is None or u is None or p.dtype != jnp.bfloat16:
      out.append(optax.apply_updates(p, u) if p is not None and u is not None else p)
      continue
    if rounding == "stochastic":
      out.append(_bf16_sum(p, u, jax.random.fold_in(key, i)))
    else:
      out.append((p.astype(jnp.float32) + u.astype(jnp.float32)).astype(jnp.bfloat16))
  return treedef.unflatten(out)


def _bf16_sum(a, b, key):
  """a + b in float32, rounded to bfloat16 stochastically. The bits are lpjax.quant's counter
  hash: elementwise, so XLA fuses them into the add instead of materializing a uint32 array the
  size of every tensor (as threefry's bits were)."""
  total = a.astype(jnp.float32) + b.astype(jnp.float32)
  return round_with_noise(total, quant.random_bits(key, total.shape) >> 16)


def make_train_step(loss_fn: Callable, tx: optax.GradientTransformation, *, nan_at_step: int = -1,
                    nan_only_quantized: bool = False, grad_accum_steps: int = 1,
                    low_precision_policy=None, param_rounding: str = "stochastic",
                    grad_accum_dtype: str = "float32"):
  """train_step(state, batch, key, policy) -> (state, metrics); `policy` is static.

  train_step(state, batch, key, policy, sites) is the monitor's measured step: the same update
  (the GEMMs run their own rules, so the gradients are the same), plus `(loss, stats)`, the
  statistics of the `sites` (`lpjax.quant.monitor.site_stats.discover`) measured in its backward
  pass: -> (state, metrics, (loss, {SiteKey: float32[rows, fields]})). With grad_accum_steps > 1
  the first microbatch is measured in one more forward and backward pass (the update's scan over
  the microbatches is the plain step's) and `loss` is that microbatch's.

  loss_fn(params, model_state, batch, key, policy) -> (loss, (model_state, {name: scalar})), as
  `Task.loss`. With grad_accum_steps = k > 1 the batch is split into k microbatches (rows i,
  i + k, ... form microbatch i, so a batch sharded by rows stays local), their gradients are
  averaged, and the optimizer steps once: the same update as one big batch, with about 1/k of the
  activation memory (model_state, e.g. BatchNorm statistics, is threaded through the microbatches).
  The gradients are summed in a `grad_accum_dtype` accumulator (`accumulate`: bfloat16 with
  stochastic rounding halves its memory).
  A non-finite loss, gradient, new parameter or new optimizer state skips the update: params,
  optimizer and model state are kept. bfloat16 parameters (low-precision master weights) are
  updated by `apply_updates` with `param_rounding`.
  `nan_at_step` injects a NaN loss at that step (with `nan_only_quantized`, only while the run's
  own policy runs: `policy` None or `low_precision_policy`, not a high-precision fallback).
  """
  if grad_accum_dtype not in GRAD_ACCUM_DTYPES:
    raise ValueError(f"grad_accum_dtype must be one of {GRAD_ACCUM_DTYPES}, got "
                     f"{grad_accum_dtype!r}.")

  def grads_of(params, model_state, batch, step_key, step, loss_scale, policy, sites=None):
    def scaled_loss(params):
      loss, (new_model_state, aux) = loss_fn(params, model_state, batch, step_key, policy)
      loss = loss.astype(jnp.float32)
      quantized = policy is None or policy == low_precision_policy
      inject = nan_at_step >= 0 and not (nan_only_quantized and not quantized)
      if inject:  # debug: a non-finite loss at one step (reliability tests)
        loss = jnp.where(step == nan_at_step, jnp.nan, loss)
      scaled = loss_scale.scale(loss) if loss_scale is not None else loss
      return scaled, (loss, new_model_state, aux)

    if sites is None:
      (_, (loss, new_model_state, aux)), grads = jax.value_and_grad(scaled_loss, has_aux=True)(
          params)
      return loss, new_model_state, aux, grads, None
    # the monitor's measured step: the same gradients (the GEMMs' own rules), plus statistics
    (_, (loss, new_model_state, aux)), grads, stats = measured_value_and_grad(
        scaled_loss, sites, has_aux=True)(params)
    return loss, new_model_state, aux, grads, (loss, stats)

  def train_step(state: TrainState, batch, key, policy, sites=None):
    step_key = jax.random.fold_in(key, state.step)
    if grad_accum_steps == 1:
      loss, model_state, aux, grads, measured = grads_of(
          state.params, state.model_state, batch, step_key, state.step, state.loss_scale, policy,
          sites)
    else:
      k = grad_accum_steps
      # microbatch i = rows i, i + k, ...: each device keeps its rows (hinted for XLA)
      micro = jax.tree.map(
          lambda a: constrain(jnp.swapaxes(a.reshape((a.shape[0] // k, k) + a.shape[1:]), 0, 1),
                              (None, "batch") + (None,) * (a.ndim - 1)), batch)

      def body(carry, inputs):
        i, mb = inputs
        total_loss, total_grads, model_state = carry
        loss, model_state, aux, grads, _ = grads_of(state.params, model_state, mb,
                                                    jax.random.fold_in(step_key, i), state.step,
                                                    state.loss_scale, policy)
        total_grads = accumulate(total_grads, grads, jax.random.fold_in(accum_key, i))
        return (total_loss + loss, total_grads, model_state), aux

      accum_key = jax.random.fold_in(step_key, _ACCUM_ROUNDING_TAG)
      zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, grad_accum_dtype), state.params)
      (loss, grads, model_state), aux = jax.lax.scan(
          body, (jnp.zeros([], jnp.float32), zeros, state.model_state), (jnp.arange(k), micro))
      measured = None
      if sites is not None:  # the monitor measures microbatch 0 once more: the scan stays as is
        measured = grads_of(state.params, state.model_state, jax.tree.map(lambda a: a[0], micro),
                            jax.random.fold_in(step_key, 0), state.step, state.loss_scale,
                            policy, sites)[-1]
      loss = loss / k
      aux = jax.tree.map(lambda a: jnp.mean(a, axis=0), aux)
      grads = jax.tree.map(lambda g, p: (g / k).astype(p.dtype), grads, state.params)
    loss_scale = state.loss_scale
    if loss_scale is not None:
      grads = loss_scale.unscale(grads)
    grads_finite = optim.all_finite(grads) & jnp.isfinite(loss)
    updates, new_opt_state = tx.update(grads, state.opt_state, state.params)
    new_params = apply_updates(state.params, updates,
                               jax.random.fold_in(step_key, _PARAM_ROUNDING_TAG), param_rounding)
    # The whole update is checked, not only its inputs: a NaN learning rate, an optimizer that
    # divides by zero or an overflowing moment make finite gradients give non-finite parameters.
    update_finite = all_finite_floats((new_params, new_opt_state))
    finite = grads_finite & update_finite
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    if loss_scale is not None:
      loss_scale = loss_scale.adjust(grads_finite)
    new_state = TrainState(
        step=state.step + 1,
        params=keep(new_params, state.params),
        model_state=keep(model_state, state.model_state),
        opt_state=keep(new_opt_state, state.opt_state),
        loss_scale=loss_scale,
        skipped=state.skipped + (~finite).astype(jnp.int32),
        consecutive_skips=jnp.where(finite, 0, state.consecutive_skips + 1).astype(jnp.int32))
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), "finite": finite,
               "update_finite": update_finite, **aux}
    if loss_scale is not None:
      metrics["loss_scale"] = loss_scale.loss_scale
    if sites is not None:
      return new_state, metrics, measured
    return new_state, metrics

  return train_step
