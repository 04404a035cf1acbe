"""The train state and the jitted train and eval steps.

One train step: forward and backward through the quantized GEMMs of the active recipe (SR keys
derived from (seed, step)), optional dynamic loss scaling, a skipped update when the loss or a
gradient is non-finite, then the optax update. The state is a plain pytree, so orbax saves it
and NamedSharding places it.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> loss, count = cross_entropy(jnp.zeros((1, 2, 4)), jnp.array([[0, 3]]))
  >>> round(float(loss), 4), count   # ln 4
  (1.3863, 2)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from lpjax import optim


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
  step: jax.Array  # int32: optimizer steps taken
  params: Any  # model parameters (an nnx.State)
  opt_state: Any  # optax state
  loss_scale: Any  # optim.DynamicLossScale, or None
  skipped: jax.Array  # int32: updates skipped for non-finite loss or gradients, in total
  consecutive_skips: jax.Array  # int32: ... in a row, up to now


def cross_entropy(logits, targets):
  """(mean token loss, token count) of float32 softmax cross-entropy."""
  logits = logits.astype(jnp.float32)
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  return jnp.mean(loss), loss.size


def make_train_step(apply_fn: Callable, tx: optax.GradientTransformation, *, nan_at_step: int = -1,
                    grad_accum_steps: int = 1):
  """train_step(state, batch, key, recipe) -> (state, metrics); `recipe` is static.

  apply_fn(params, tokens, recipe, key) -> logits. With grad_accum_steps = k > 1 the batch is
  split into k microbatches (rows i, i + k, ... form microbatch i, so a batch sharded by rows
  stays local), their gradients are averaged, and the optimizer steps once: the same update as
  one big batch, with about 1/k of the activation memory.
  """

  def grads_of(params, batch, step_key, step, loss_scale, recipe):
    def loss_fn(params):
      logits = apply_fn(params, batch["inputs"], recipe, step_key)
      loss, _ = cross_entropy(logits, batch["targets"])
      if nan_at_step >= 0:  # debug: inject a non-finite loss at one step
        loss = jnp.where(step == nan_at_step, jnp.nan, loss)
      scaled = loss_scale.scale(loss) if loss_scale is not None else loss
      return scaled, loss

    (_, loss), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return loss, grads

  def train_step(state: TrainState, batch, key, recipe: str):
    step_key = jax.random.fold_in(key, state.step)
    if grad_accum_steps == 1:
      loss, grads = grads_of(state.params, batch, step_key, state.step, state.loss_scale, recipe)
    else:
      k = grad_accum_steps
      micro = jax.tree.map(lambda a: jnp.swapaxes(a.reshape((a.shape[0] // k, k) + a.shape[1:]),
                                                  0, 1), batch)

      def body(carry, inputs):
        i, mb = inputs
        loss, grads = grads_of(state.params, mb, jax.random.fold_in(step_key, i), state.step,
                               state.loss_scale, recipe)
        total_loss, total_grads = carry
        return (total_loss + loss, jax.tree.map(jnp.add, total_grads, grads)), None

      zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
      (loss, grads), _ = jax.lax.scan(body, (jnp.zeros([], jnp.float32), zeros),
                                      (jnp.arange(k), micro))
      loss = loss / k
      grads = jax.tree.map(lambda g, p: (g / k).astype(p.dtype), grads, state.params)
    loss_scale = state.loss_scale
    if loss_scale is not None:
      grads = loss_scale.unscale(grads)
    finite = optim.all_finite(grads) & jnp.isfinite(loss)
    updates, new_opt_state = tx.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    if loss_scale is not None:
      loss_scale = loss_scale.adjust(finite)
    new_state = TrainState(
        step=state.step + 1,
        params=keep(new_params, state.params),
        opt_state=keep(new_opt_state, state.opt_state),
        loss_scale=loss_scale,
        skipped=state.skipped + (~finite).astype(jnp.int32),
        consecutive_skips=jnp.where(finite, 0, state.consecutive_skips + 1).astype(jnp.int32))
    metrics = {"loss": loss, "grad_norm": optax.global_norm(grads), "finite": finite}
    if loss_scale is not None:
      metrics["loss_scale"] = loss_scale.loss_scale
    return new_state, metrics

  return train_step


def make_eval_step(apply_fn: Callable):
  """eval_step(params, batch, recipe) -> (sum of token losses, token count); `recipe` static."""

  def eval_step(params, batch, recipe: str):
    logits = apply_fn(params, batch["inputs"], recipe, jax.random.key(0))
    loss, count = cross_entropy(logits, batch["targets"])
    return loss * count, count

  return eval_step
