"""The trainer's optimizers decay the same tensors whatever the optimizer (matrices only)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from config_helpers import config_file
from lpjax.train.config import llama_config
from lpjax.train.step._optimizers import make_optimizer


@pytest.mark.parametrize("name", ["adamw", "spam", "stable_spam"])
def test_weight_decay_applies_to_matrices_only_for_every_optimizer(name):
  c = llama_config("tiny", optimizer=name)
  c.steps, c.optimizer.warmup_steps, c.optimizer.weight_decay = 10, 0, 0.1
  c.optimizer.grad_clip = 0.0
  tx = make_optimizer(c)
  params = {"kernel": jnp.ones((4, 4)), "scale": jnp.ones((4,))}
  zeros = jax.tree.map(jnp.zeros_like, params)  # no gradient: only weight decay can move a weight
  updates, _ = tx.update(zeros, tx.init(params), params)
  assert np.all(np.asarray(updates["scale"]) == 0.0)
  assert np.all(np.asarray(updates["kernel"]) < 0.0)  # decayed toward zero


@pytest.mark.parametrize("total_steps", [-1, 7])
def test_stable_spam_total_steps_decays_b1_like_the_optimizer_given_total_t(total_steps):
  """optimizer.total_steps reaches stable_spam's total_T (-1: the run's steps); 0 leaves it off."""
  from lpjax import optim

  c = llama_config("tiny", optimizer="stable_spam")
  c.steps, c.optimizer.warmup_steps, c.optimizer.grad_clip = 20, 0, 0.0
  c.optimizer.lr, c.optimizer.min_lr_ratio = 1e-2, 1.0
  c.optimizer.total_steps, c.optimizer.eta_min = total_steps, 0.25
  params = {"kernel": jnp.ones((4, 4))}
  grads = [{"kernel": jax.random.normal(jax.random.key(i), (4, 4))} for i in range(12)]

  def run(tx):
    state, out = tx.init(params), []
    for g in grads:
      u, state = tx.update(g, state, params)
      out.append(np.asarray(u["kernel"]))
    return np.stack(out)

  want_total = c.steps if total_steps == -1 else total_steps
  kw = dict(b1=c.optimizer.b1, b2=c.optimizer.b2, eps=c.optimizer.eps, gamma1=c.optimizer.gamma1,
            gamma2=c.optimizer.gamma2, gamma3=c.optimizer.gamma3, seed=c.seed,
            reset_interval=c.optimizer.reset_interval)
  got = run(make_optimizer(c))
  np.testing.assert_array_equal(
      got, run(optim.stable_spam(1e-2, total_steps=want_total, eta_min=0.25, **kw)))
  assert not np.array_equal(got, run(optim.stable_spam(1e-2, **kw)))  # the decay is not a no-op
  c.optimizer.total_steps = 0
  np.testing.assert_array_equal(run(make_optimizer(c)), run(optim.stable_spam(1e-2, **kw)))


@pytest.mark.parametrize("rounding", ["stochastic", "nearest"])
def test_bfloat16_master_weights_take_small_updates_only_with_stochastic_rounding(rounding):
  """A train step with bf16 parameters: SGD steps of 1/8 ulp move the weights on average under
  stochastic rounding and are lost under round-to-nearest (why SR is the default)."""
  import optax
  from lpjax.train.step._step import init_state, make_train_step

  n, lr = 20000, 2.0**-10  # grad 1 -> update -2^-10 on weights of 1 (bf16 ulp there: 2^-7)
  loss_fn = lambda p, ms, batch, key, policy: (jnp.sum(p["w"].astype(jnp.float32)), (ms, {}))
  tx = optax.sgd(lr)
  state = init_state({"w": jnp.full((n,), 1.5, jnp.bfloat16)}, None, tx)
  step = jax.jit(make_train_step(loss_fn, tx, param_rounding=rounding), static_argnums=3)
  for _ in range(4):
    state, _ = step(state, {}, jax.random.key(0), None)
  w = np.asarray(state.params["w"].astype(jnp.float32))
  assert state.params["w"].dtype == jnp.bfloat16
  if rounding == "nearest":
    np.testing.assert_array_equal(w, 1.5)
  else:  # E[w] = 1.5 - 4 * 2^-10; per-element std ~ 2^-7 / 2, so the mean is within ~4e-5
    assert abs(w.mean() - (1.5 - 4 * lr)) < 3e-4
    assert len(set(w.tolist())) > 1


@pytest.mark.parametrize("scan_layers", [True, False])
def test_stable_spam_keeps_statistics_per_block_of_a_scanned_llama(tmp_path, scan_layers):
  """A scanned LLaMA stacks each weight of its blocks into one tensor; the trainer's Stable-SPAM
  still keeps one AdaClip / AdaGN statistic per block (as the unrolled model has them)."""
  from config_helpers import small
  from lpjax.train.loop._trainer import Trainer

  trainer = Trainer(small("bf16", "stable_spam", **{"model.scan_layers": scan_layers}),
                    str(tmp_path))
  state = trainer.init_state()
  spam_state = next(s for s in jax.tree.leaves(state.opt_state, is_leaf=lambda x: hasattr(
      x, "max_ema")) if hasattr(s, "max_ema"))
  layers = trainer.task.model_config.layers
  shapes = {tuple(x.shape) for x in jax.tree.leaves(spam_state.max_ema)}
  assert shapes == ({(layers,), ()} if scan_layers else {()})
  assert len(jax.tree.leaves(spam_state.max_ema)) == (
      12 if scan_layers else 3 + 9 * layers)  # embed, final norm, head + 9 tensors per block
  trainer.checkpointer.close()


@pytest.mark.parametrize("name,grad_clip,warns", [
    ("adam", None, True), ("adamw", None, True), ("spam", None, True),  # switched: unclipped
    ("adam", 1.0, False), ("stable_spam", None, False)])
def test_an_fp4_config_switched_to_another_optimizer_warns_that_it_is_unclipped(
    name, grad_clip, warns, caplog):
  config = config_file("llama_tiny_mxfp4")
  assert (config.optimizer.total_steps, config.optimizer.grad_clip) == (-1, 0.0)
  config.optimizer.name = name
  if grad_clip is not None:
    config.optimizer.grad_clip = grad_clip
  with caplog.at_level("WARNING", logger="lpjax.train.step._optimizers"):
    make_optimizer(config)
  messages = [r.getMessage() for r in caplog.records if r.name == "lpjax.train.step._optimizers"]
  assert bool(messages) == warns
  if warns:
    assert "no global-norm clipping" in messages[0] and "--config.optimizer.grad_clip=1.0" in messages[0]


def test_plain_adam_with_clipping_off_does_not_warn(caplog):
  config = llama_config("tiny", optimizer="adam")
  config.optimizer.grad_clip = 0.0  # a deliberate choice: total_steps is 0
  with caplog.at_level("WARNING", logger="lpjax.train.step._optimizers"):
    make_optimizer(config)
  assert not [r for r in caplog.records if r.name == "lpjax.train.step._optimizers"]
