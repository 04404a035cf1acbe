"""Non-finite steps: skipped (state unchanged), counted, loss scale backed off; too many in a row
stop with an error naming the last good checkpoint, or roll back in high precision (monitor.jsonl
drops the rows of the rolled-back steps)."""

import json
import os

import jax
import numpy as np
import pytest

from config_helpers import small

from lpjax.train.loop._trainer import Trainer, TrainingError


def metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(l) for l in f]


def same(a, b):
  return all(np.array_equal(np.asarray(x), np.asarray(y))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_a_nan_step_is_skipped_and_counted(tmp_path):
  with_nan = Trainer(small(steps=3, **{"debug.nan_at_step": 2}), str(tmp_path / "nan"))
  results = with_nan.run()
  two_steps = Trainer(small(steps=3), str(tmp_path / "two"))  # same lr schedule, stopped at 2
  two_steps.run(stop_after=2)
  s_nan, s_two = with_nan.final_state, two_steps.final_state
  assert results["skipped_steps"] == 1 and int(s_nan.skipped) == 1
  assert int(s_nan.consecutive_skips) == 1
  # The skipped (third) update changed nothing: params and optimizer state as after two steps.
  assert same(s_nan.params, s_two.params) and same(s_nan.opt_state, s_two.opt_state)
  records = {r["step"]: r for r in metrics(str(tmp_path / "nan")) if "train/loss" in r}
  assert np.isnan(records[3]["train/loss"]) and records[3]["train/skipped"] == 1
  assert records[2]["train/skipped"] == 0


def test_dynamic_loss_scale_backs_off_on_a_nan(tmp_path):
  Trainer(small(steps=3, **{"debug.nan_at_step": 1, "quant.loss_scale": True}), str(tmp_path)).run()
  scale = {r["step"]: r["train/loss_scale"] for r in metrics(str(tmp_path)) if "train/loss" in r}
  assert scale[1] == 2.0**15 and scale[2] == 2.0**14 and scale[3] == 2.0**14


def test_consecutive_skips_stop_with_the_last_good_checkpoint(tmp_path):
  c = small(steps=6, **{"debug.nan_at_step": 3, "max_consecutive_skips": 1, "checkpoint_every": 2})
  with pytest.raises(TrainingError, match=r"last good checkpoint is step 2 in .*checkpoints"):
    Trainer(c, str(tmp_path)).run()


def test_rollback_restarts_from_the_checkpoint_in_high_precision(tmp_path):
  c = small("mxfp4_naive", steps=6, **{
      "debug.nan_at_step": 3, "debug.nan_only_quantized": True, "max_consecutive_skips": 1,
      "checkpoint_every": 2, "rollback_on_skips": True, "quant.fallback_steps": 2,
      "monitor.every": 1})
  results = Trainer(c, str(tmp_path)).run()
  assert results["steps"] == 6 and results["rollbacks"] == 1 and results["skipped_steps"] == 0
  records = [r for r in metrics(str(tmp_path)) if "train/loss" in r]
  # Step 4 (index 3) failed in mxfp4 and stays logged; after the rollback to step 2, steps 3-4 ran
  # in bf16 (the fallback), then mxfp4 again.
  by_step = {}
  for r in records:
    by_step.setdefault(r["step"], []).append(r)
  assert [r["train/recipe_is_quantized"] for r in by_step[4]] == [1.0, 0.0]
  assert np.isnan(by_step[4][0]["train/loss"]) and np.isfinite(by_step[4][1]["train/loss"])
  assert [r["train/recipe_is_quantized"] for r in by_step[3]] == [1.0, 0.0]
  assert [r["train/recipe_is_quantized"] for r in by_step[5]] == [1.0]
  assert [r["event/rollback_to_step"] for r in metrics(str(tmp_path))
          if "event/rollback_to_step" in r] == [2]
  # monitor.jsonl drops the rolled-back steps' rows: steps 3-4 ran again in bf16 (nothing
  # quantized, nothing measured), so each site has one row per MXFP4 step
  with open(os.path.join(str(tmp_path), "monitor.jsonl")) as f:
    rows = [json.loads(l) for l in f]
  per_site = {}
  for r in rows:
    per_site.setdefault((r["path"], r["block"]), []).append(r["step"])
  assert per_site and all(steps == [1, 2, 5, 6] for steps in per_site.values()), per_site


def test_rollback_gives_up_after_max_rollbacks(tmp_path):
  c = small(steps=6, **{"debug.nan_at_step": 3, "max_consecutive_skips": 1, "checkpoint_every": 2,
                        "rollback_on_skips": True, "max_rollbacks": 1})
  with pytest.raises(TrainingError, match="non-finite steps in a row"):
    Trainer(c, str(tmp_path)).run()  # the NaN recurs in the fallback recipe too


def test_a_non_finite_update_is_skipped_like_a_non_finite_gradient():
  """A NaN learning rate: finite loss and gradients, non-finite new parameters -> skipped."""
  import jax.numpy as jnp
  import optax

  from lpjax.train.step._step import init_state, make_train_step

  params = {"w": jnp.ones(3), "b": jnp.zeros(2)}
  loss_fn = lambda p, ms, batch, key, policy: (jnp.sum(p["w"] ** 2) + jnp.sum(p["b"]), (ms, {}))
  for tx in (optax.sgd(float("nan")), optax.adam(1e-3, b1=1.0, b2=1.0)):
    state = init_state(params, {}, tx)
    step = jax.jit(make_train_step(loss_fn, tx), static_argnums=3)
    new, m = step(state, {}, jax.random.key(0), None)
    assert bool(jnp.isfinite(m["loss"])) and not bool(m["update_finite"])
    assert not bool(m["finite"]) and int(new.skipped) == 1 and int(new.consecutive_skips) == 1
    assert same(new.params, params) and same(new.opt_state, state.opt_state)


def test_an_overflowing_update_stops_without_a_non_finite_checkpoint(tmp_path, caplog):
  # lr = 3e38 passes validation (finite); Adam's first update moves weights by ~3e38, the next
  # one overflows them to Inf: finite loss and gradients, non-finite update, skipped.
  c = small(steps=6, **{"max_consecutive_skips": 2, "checkpoint_every": 1})
  Trainer(c, str(tmp_path)).run(stop_after=1)  # one good step, checkpointed
  c.optimizer.lr, c.optimizer.warmup_steps = 3e38, 0
  run = Trainer(c, str(tmp_path))
  with pytest.raises(TrainingError, match="non-finite steps in a row"):
    run.run()
  assert "non-finite update" in caplog.text
  ckpt = run.checkpointer
  for step in ckpt.all_steps():  # every checkpoint holds finite parameters and optimizer state
    state, _ = ckpt.restore(step, run.init_state())
    assert all(np.isfinite(np.asarray(x)).all()
               for x in jax.tree.leaves((state.params, state.opt_state))
               if np.issubdtype(np.asarray(x).dtype, np.floating))
  ckpt.close()
