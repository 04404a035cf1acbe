"""The trainer's monitor section (lpjax/train/monitor/_monitor.py) on a model.factory model: monitor.jsonl
rows equal `lpjax.quant.site_stats` on the same params, batch and key; the plain train step's HLO
is the same with the monitor on or off, and the measured step makes the same update; alert
lines; the heatmap; fsdp; a planted failing site falls back alone (bounded compiles) and a
resumed run rebuilds the same policy and losses. lpjax's own LLaMA: test_trainer_monitor_llama.py."""

import json
import logging
import re
import sys

import jax
import numpy as np
import pytest

from config_helpers import small
from lpjax.train.monitor._monitor_heatmap import grids, threshold_limits, write_heatmap
from lpjax.train.loop._trainer import Trainer
from monitor_helpers import check_against_site_stats, losses, read, same

FACTORY = "user_models:linen_lm"  # attention (q, k, v, out) + MLP (up, down): 6 MXFP4 sites


def cfg(steps=1, **kw):
  return small("mxfp4", steps=steps, **{"model.factory": FACTORY, "monitor.every": 1, **kw})


class _Records(logging.Handler):
  def __init__(self):
    super().__init__(logging.WARNING)
    self.records = []

  def emit(self, record):
    self.records.append(record)


# The steps of the module's measured run and of the planted-fallback runs: the same config up to
# host-side monitor settings (thresholds, fallback, a planted failure), so the same measured train
# step, which XLA compiles once for both (the planted test loads it from the compile cache).
STEPS = 3


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
  """(trainer, workdir, warning records of lpjax.train.monitor) of one measured 3-step run on one
  device with monitor.max_flushed = 0 (a threshold: the compiled steps are those of any 3-step
  run): the rows test checks its rows, alerts and train step, the fsdp test compares an 8-device
  run's rows with its step-1 rows (one run, its measured step traced and compiled once for both)."""
  workdir = tmp_path_factory.mktemp("monitor_on")
  logger, handler = logging.getLogger("lpjax.train.monitor"), _Records()
  level = logger.level
  logger.addHandler(handler)
  logger.setLevel(logging.WARNING)
  try:
    trainer = Trainer(cfg(steps=STEPS, **{"monitor.max_flushed": 0.0}), str(workdir),
                      devices=jax.devices()[:1])
    trainer.run()
  finally:
    logger.removeHandler(handler)
    logger.setLevel(level)
  return trainer, workdir, handler.records


@pytest.mark.slow
def test_rows_equal_site_stats_with_alerts_heatmap_and_the_same_train_step(tmp_path, measured):
  trainer, on_dir, records = measured
  one = jax.devices()[:1]
  all_rows = read(on_dir / "monitor.jsonl")
  paths = {"attn/query", "attn/key", "attn/value", "attn/out", "up", "down"}
  steps = range(1, STEPS + 1)
  assert sorted((r["step"], r["path"]) for r in all_rows) == sorted(
      (s, p) for s in steps for p in paths)
  assert all(r["recipe"] == "mxfp4" for r in all_rows)
  # the measured loss is the train step's own (same params, batch and key), at every step
  assert [(r["step"], r["loss"]) for r in all_rows if r["path"] == "up"] == [
      (s, pytest.approx(loss, rel=1e-6)) for s, loss in losses(on_dir)]
  rows = [r for r in all_rows if r["step"] == 1]

  state, batch, key = check_against_site_stats(trainer, rows, operands=6 * 6)
  by_site = {r["path"]: r for r in rows}

  # one alert line per operand over monitor.max_flushed = 0, naming step, site, statistic, value,
  # limit
  lines = [m.getMessage() for m in records if "monitor alert" in m.getMessage()]
  expected = {s: [(r["path"], f"{g}.{o}.flushed", v[o]["flushed"]) for r in all_rows
                  if r["step"] == s for g, v in ((g, r[g]) for g in ("fwd", "dgrad", "wgrad"))
                  for o in v if o != "out_snr_db" and v[o]["flushed"] > 0] for s in steps}
  assert len(lines) == sum(map(len, expected.values())) and expected[1]
  for s in steps:
    for path, stat, value in expected[s]:
      assert any(l.startswith(f"step {s}: ") and
                 f"{path} {stat} = {value:.4g} > monitor.max_flushed = 0" in l for l in lines)

  metrics = [r for r in read(on_dir / "metrics.jsonl") if "monitor/alerts" in r]
  assert [m["monitor/alerts"] for m in metrics] == [len(expected[s]) for s in steps]
  assert metrics[0]["monitor_snr/up"] == min(by_site["up"][g]["out_snr_db"]
                                             for g in ("fwd", "dgrad", "wgrad"))
  assert metrics[0]["monitor_gnr/up"] == by_site["up"]["grad_noise_ratio"]
  assert (on_dir / "monitor_heatmap.png").read_bytes()[:4] == b"\x89PNG"

  # the plain train step is today's: the same HLO with the monitor off
  off = Trainer(cfg(steps=STEPS, **{"monitor.every": 0}), str(tmp_path / "off"), devices=one)
  lowered = [t.train_step(off.precision.policy).lower(state, batch, key).as_text()
             for t in (trainer, off)]
  assert lowered[0] == lowered[1]
  # and the measured step makes the same update
  off.run()
  assert not (tmp_path / "off" / "monitor.jsonl").exists()
  assert losses(on_dir) == losses(tmp_path / "off") and len(losses(on_dir)) == STEPS
  for a, b in zip(jax.tree.leaves(trainer.final_state.params),
                  jax.tree.leaves(off.final_state.params)):
    assert np.array_equal(a, b)


@pytest.mark.slow
def test_with_gradient_accumulation_the_first_microbatch_is_measured(tmp_path):
  one = jax.devices()[:1]
  trainer = Trainer(cfg(steps=2, grad_accum_steps=2), str(tmp_path / "on"), devices=one)
  trainer.run()
  rows = read(tmp_path / "on" / "monitor.jsonl")
  check_against_site_stats(trainer, [r for r in rows if r["step"] == 1], accum=2,
                           operands=6 * 6)
  # the measured steps (microbatch 0 measured, the others in the scan) make the same updates
  off = Trainer(cfg(steps=2, grad_accum_steps=2, **{"monitor.every": 0}), str(tmp_path / "off"),
                devices=one)
  off.run()
  assert losses(tmp_path / "on") == losses(tmp_path / "off") and len(losses(tmp_path / "on")) == 2
  for a, b in zip(jax.tree.leaves(trainer.final_state.params),
                  jax.tree.leaves(off.final_state.params)):
    assert np.array_equal(a, b)


def test_the_heatmap_without_matplotlib_is_a_log_line(tmp_path, monkeypatch, caplog):
  caplog.set_level(logging.INFO, logger="lpjax.train.monitor")
  row = lambda step, snr, gnr: {"step": step, "path": "up", "block": None, "call": 0,
                                "grad_noise_ratio": gnr, "fwd": {"out_snr_db": snr, "x": {}},
                                "dgrad": {"out_snr_db": 40.0}, "wgrad": {"out_snr_db": None}}
  (tmp_path / "monitor.jsonl").write_text("\n".join(json.dumps(r) for r in (
      row(10, 15.0, 4.0), row(20, -3.0, 1.0))) + "\n")
  labels, steps, snr, gnr = grids(read(tmp_path / "monitor.jsonl"))
  assert labels == ["up"] and steps == [10, 20]  # dgrad is not quantized: not in the SNR
  np.testing.assert_array_equal(snr, [[15.0, -3.0]])
  np.testing.assert_array_equal(gnr, [[4.0, 1.0]])
  with monkeypatch.context() as patch:  # the module object itself comes back afterwards
    patch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    assert write_heatmap(str(tmp_path)) is None
  assert not (tmp_path / "monitor_heatmap.png").exists()
  assert any("matplotlib is not installed" in m.getMessage() for m in caplog.records)
  pytest.importorskip("matplotlib")
  assert write_heatmap(str(tmp_path), min_out_snr_db=6.0) == str(tmp_path / "monitor_heatmap.png")
  assert (tmp_path / "monitor_heatmap.png").read_bytes()[:4] == b"\x89PNG"
  # the colours turn at the alert thresholds, whatever the data's range
  assert threshold_limits(snr, 6.0) == (-3.0, 6.0, 15.0)
  assert threshold_limits(np.array([[12.0, 14.0]]), 6.0) == (5.0, 6.0, 14.0)


@pytest.mark.slow
def test_fsdp_rows_match_one_device(tmp_path, measured):
  _, one_dir, _ = measured  # its first step: the same params, batch and key on one device
  eight = Trainer(cfg(**{"mesh.data": 1, "mesh.fsdp": 8}), str(tmp_path / "eight"))
  eight.run()
  up = eight.final_state.params["up"]["kernel"]
  assert "fsdp" in str(up.sharding.spec) and len(up.sharding.device_set) == 8
  a = [r for r in read(one_dir / "monitor.jsonl") if r["step"] == 1]
  b = read(tmp_path / "eight" / "monitor.jsonl")
  assert len(a) == len(b) == 6
  assert [r["path"] for r in a] == [r["path"] for r in b]
  for ra, rb in zip(a, b):  # sharding changes summation orders only
    for g in ("fwd", "dgrad", "wgrad"):
      assert same(rb[g]["out_snr_db"], ra[g]["out_snr_db"], 1e-3), (ra["path"], g)
    assert same(rb["grad_noise_ratio"], ra["grad_noise_ratio"], 1e-3)


FALLBACK = {"monitor.fallback": True, "monitor.fallback_after": 2,
            "debug.monitor_fail_path": "^up$", "checkpoint_every": 0}


@pytest.mark.slow
def test_a_planted_failing_site_falls_back_alone_and_resumes_identically(tmp_path, caplog):
  caplog.set_level(logging.WARNING, logger="lpjax.train.monitor")
  one = jax.devices()[:1]
  full = Trainer(cfg(steps=STEPS, **FALLBACK), str(tmp_path / "full"), devices=one)
  results = full.run()
  switch, = results["site_fallbacks"]
  assert (switch["path"], switch["pass"], switch["step"], switch["recipe"]) == ("up", "fwd", 2,
                                                                                 "bf16")
  assert json.loads((tmp_path / "full" / "results.json").read_text())["site_fallbacks"] == [switch]
  assert sum("site fallback: up's forward GEMM switch to bf16" in m.getMessage()
             for m in caplog.records) == 1
  rows = read(tmp_path / "full" / "monitor.jsonl")
  for r in rows:
    switched = r["path"] == "up" and r["step"] > 2
    assert r["recipe"] == ("mxfp4+fwd:bf16" if switched else "mxfp4"), r
    assert ("x" in r["fwd"]) == (not switched)  # a bf16 forward quantizes nothing
    assert "dy" in r["dgrad"] and "dy" in r["wgrad"]  # its backward stays MXFP4
  assert len(full._runners) == 2 and len(full.monitor._cache) == 2  # one recompile each

  # stopped at the switch (step 2, checkpointed with it): the first part compiles the measured
  # step of the base policy only, the resumed part the switched one only
  split = tmp_path / "split"
  first = Trainer(cfg(steps=STEPS, **FALLBACK), str(split), devices=one)
  assert first.run(stop_after=2)["stopped"]
  assert first.monitor.switches == [switch] and len(first._runners) == 1
  with open(split / "monitor.jsonl", "a") as f:  # as if a killed run had measured step 3
    f.write(json.dumps({"step": 3, "path": "stale"}) + "\n" + '{"step": 3, "pa')
  second = Trainer(cfg(steps=STEPS, **FALLBACK), str(split), devices=one)
  assert second.precision.policy.rules == ()
  resumed = second.run()
  assert resumed["site_fallbacks"] == results["site_fallbacks"]
  assert second.precision.policy == full.precision.policy
  assert losses(split) == losses(tmp_path / "full")
  assert read(split / "monitor.jsonl") == rows
  for a, b in zip(jax.tree.leaves(full.final_state.params),
                  jax.tree.leaves(second.final_state.params)):
    assert np.array_equal(a, b)
  # the resumed run compiled the switched policy only
  assert len(second._runners) == 1 and re.search("fwd:bf16", str(
      second.precision.policy.rules))
