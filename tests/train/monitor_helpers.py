"""Helpers of the trainer's monitor tests (test_trainer_monitor.py, test_trainer_monitor_llama.py):
reading a workdir's JSON lines, and the rows of a measured step against `lpjax.quant.site_stats`
called independently on the same params, batch and key."""

import json
import math

import jax
import pytest

from lpjax import quant
from lpjax.train.loop._trainer import _global_batch

STATS = ("snr_db", "rel_err", "saturated", "flushed", "scale_min", "scale_max", "scale_std",
         "clamped_scales")


def read(path):
  """The JSON lines of a file."""
  return [json.loads(l) for l in path.read_text().splitlines()]


def losses(workdir):
  """[(step, train/loss)] of a run's metrics.jsonl."""
  return [(r["step"], r["train/loss"]) for r in read(workdir / "metrics.jsonl")
          if "train/loss" in r]


def same(a, b, rtol):
  """a (a monitor.jsonl value: null when not measured, "inf" when exact) equals b (a site_stats
  value: NaN when not measured, inf when exact) within rtol."""
  if a is None or b is None or math.isnan(b):
    return a is None and (b is None or math.isnan(b))
  a = float(a)
  if not math.isfinite(a) or not math.isfinite(b):
    return a == b
  return abs(a - b) <= rtol * abs(b) + 1e-6


def check_against_site_stats(trainer, rows, accum=1, operands=None):
  """The rows of step 1 equal `lpjax.quant.site_stats` called independently on step 0's params,
  batch (its first microbatch: rows 0, k, 2k, ...) and key (the microbatch's), site by site and
  block by block; `operands`: the number of (site, block, operand) rows site_stats must give."""
  state = trainer.init_state()
  (_, local), = trainer.task.batches(0, 1, 0, 1)
  batch = _global_batch(local, trainer.batch_sharding)
  key = jax.random.fold_in(jax.random.key(trainer.config.seed + 1), 0)
  micro = {k: v[::accum] for k, v in local.items()}
  micro_key = key if accum == 1 else jax.random.fold_in(key, 0)
  policy = trainer.precision.policy
  target = lambda params, model_state, batch, quant_key: trainer.task.loss(
      params, model_state, batch, quant_key, policy)[0]
  with trainer.activation_hints():
    table = quant.site_stats(target, state.params, state.model_state, micro, quant_key=micro_key)
  by_site = {(r["path"], r["block"]): r for r in rows}
  assert len(by_site) == len(rows)
  if operands is not None:
    assert len(table.rows) == operands
  assert {(t["path"], t["block"]) for t in table.rows} == set(by_site)
  assert rows[0]["loss"] == pytest.approx(float(table.loss), rel=1e-6)
  for t in table.rows:
    r = by_site[(t["path"], t["block"])]
    for s in STATS:
      assert same(r[t["gemm"]][t["operand"]][s], t[s], 1e-5), (t["path"], t["gemm"], s)
    assert same(r[t["gemm"]]["out_snr_db"], t["out_snr_db"], 1e-5)
    assert same(r["grad_noise_ratio"], t["grad_noise_ratio"], 1e-5)
  return state, batch, key
