"""benchmarks/sweeps/ablate.py: listing, dry runs that validate, planning, a micro sweep end to end
(the statistics: test_ablate_report.py)."""

import json
import math
import os
import shlex
import sys

import pytest

sys.path[:0] = [os.path.join(os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmarks"), d)
                for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/

import ablate  # noqa: E402
import ablate_sweeps as sweeps  # noqa: E402

from lpjax.train import config as cfg_lib  # noqa: E402

ISSUE_SWEEPS = ("format", "scale_format", "grad_rounding", "granularity", "gemms", "optimizer",
                "lr", "operands", "schedule", "block_size", "recipes", "memory", "quality",
                "optim_lr", "sspam_parts")
MICRO = ["--seeds", "1", "--steps", "3", "--set", "batch_size=8", "--set", "seq_len=32",
         "--set", "eval_steps=1", "--set", "log_every=1"]


def test_list_names_every_sweep_and_row(capsys):
  assert ablate.main(["--list"]) == 0
  out = capsys.readouterr().out
  assert set(ISSUE_SWEEPS) == set(sweeps.SWEEPS)
  for name, rows in sweeps.SWEEPS.items():
    assert f"{name}:" in out
    assert rows[0] == sweeps.REFERENCE  # every table has its FP32 Adam reference
    assert len({r.label for r in rows}) == len(rows)
    for row in rows:
      assert row.label in out and row.recipe in out


def test_dry_run_prints_every_row_and_every_config_validates(tmp_path, capsys):
  assert ablate.main(["all", "--out", str(tmp_path), "--dry-run"]) == 0
  out = capsys.readouterr().out
  assert "INVALID" not in out and "Estimated time:" in out
  assert not (tmp_path / "runs").exists()  # a dry run trains nothing
  for name, rows in sweeps.SWEEPS.items():
    assert f"== {name}:" in out
    for row in rows:
      config = sweeps.row_config(row, size="tiny", seed=0)
      line = f"{row.label:<24} recipe={row.recipe} optimizer={row.optimizer} lr={config.optimizer.lr:g}"
      assert line in out
      cfg_lib.validate(config, device_count=1)
      assert (config.quant.recipe, config.optimizer.name) == (row.recipe, row.optimizer)
      assert config.optimizer.lr == pytest.approx(3e-3 * row.lr_scale)


def test_only_seeds_plans_just_those_seeds_and_rejects_seeds_outside_the_range(tmp_path):
  args = ablate.parse_args(["recipes", "--out", str(tmp_path), "--seeds", "3", "--only-seeds", "2,1",
                            "--rows", "bf16"])
  _, tasks, to_run, _ = ablate.plan(args)
  assert sorted((t.row.label, t.seed) for t in tasks) == [
      ("bf16", 1), ("bf16", 2), ("fp32_adam", 1), ("fp32_adam", 2)]
  assert {t.seed for t in to_run} == {1, 2}  # nothing has run: every planned run trains
  assert len(ablate.plan(ablate.parse_args(["recipes", "--out", str(tmp_path), "--rows", "bf16"]))[1]) == 6
  skip = ablate.parse_args(["recipes", "--out", str(tmp_path), "--rows", "bf16", "--skip-reference"])
  assert [(t.row.label, t.seed) for t in ablate.plan(skip)[1]] == [("bf16", 0), ("bf16", 1), ("bf16", 2)]
  with pytest.raises(SystemExit):
    ablate.parse_args(["recipes", "--out", str(tmp_path), "--skip-reference"])
  for bad in ("3", "x"):
    with pytest.raises(SystemExit):
      ablate.parse_args(["recipes", "--out", str(tmp_path), "--seeds", "3", "--only-seeds", bad])


def test_optim_lr_sweep_has_each_optimizers_lr_grid_in_every_recipe():
  """Issue 41: 4-5 lrs per optimizer, so each is compared at its own best lr."""
  rows = {r.label: r for r in sweeps.SWEEPS["optim_lr"]}
  for recipe in ("mxfp4", "nvfp4", "bf16"):
    for opt in ("adam", "stable_spam", "spam"):
      scales = sorted(r.lr_scale for r in rows.values() if (r.recipe, r.optimizer) == (recipe, opt))
      assert scales == sorted(sweeps.OPTIM_LR_SCALES[opt]) and 4 <= len(scales) <= 5
      assert 1.0 in scales and min(scales) < 1.0 < max(scales)  # around the paper lr
  for opt in ("adam", "stable_spam"):
    assert {r.lr_scale for r in rows.values() if (r.recipe, r.optimizer) == ("quartet", opt)} == {
        0.25, 0.5, 1.0, 2.0}
  assert all(not r.overrides for r in rows.values())  # paper hyperparameters throughout
  assert rows["mxfp4_adam_lr0.5x"] == sweeps.Row("mxfp4_adam_lr0.5x", "mxfp4", "adam", 0.5)


def test_sspam_parts_switches_each_part_with_trainer_settings():
  rows = {r.label: r for r in sweeps.SWEEPS["sspam_parts"]}
  for suffix in ("_lr0.5x", ""):
    cfg = lambda name: sweeps.row_config(rows[f"mxfp4_{name}{suffix}"], size="tiny", seed=0, steps=1000)
    full, adagn, no_reset = cfg("full"), cfg("adagn"), cfg("adagn_adaclip")
    assert (full.optimizer.gamma3, full.optimizer.reset_interval) == (0.999, 1000)  # paper 4-bit
    assert (full.optimizer.gamma1, full.optimizer.gamma2) == (0.7, 0.9)
    assert (adagn.optimizer.gamma3, adagn.optimizer.reset_interval) == (0.0, 0)
    assert (no_reset.optimizer.gamma3, no_reset.optimizer.reset_interval) == (0.999, 0)
    assert cfg("reset50").optimizer.reset_interval == 50
    assert (cfg("adagn_hp").optimizer.gamma2, cfg("adagn_hp").optimizer.gamma3) == (0.99999, 0.0)
    assert cfg("adam").optimizer.name == "adam"
    for c in (full, adagn, no_reset, cfg("hp_gammas")):
      assert c.quant.recipe == "mxfp4" and c.optimizer.name == "stable_spam"
      assert c.optimizer.lr == pytest.approx(3e-3 * (0.5 if suffix else 1.0))
      cfg_lib.validate(c, device_count=1)


def test_sspam_parts_compares_adam_and_the_reference_settings_over_lrs_in_each_recipe():
  rows = {r.label: r for r in sweeps.SWEEPS["sspam_parts"]}
  for recipe in ("mxfp4", "nvfp4", "bf16", "quartet"):
    ref = [r for r in rows.values() if r.recipe == recipe and "paper_run" in r.label]
    adam = [r for r in rows.values() if r.recipe == recipe and r.optimizer == "adam"]
    scales = {0.25, 0.5, 1.0, 2.0} if recipe == "quartet" else {0.25, 0.5, 1.0}
    assert {r.lr_scale for r in ref} >= scales, recipe
    assert {r.lr_scale for r in adam} >= scales, recipe
    assert all(not r.overrides for r in adam)
    for r in ref:
      c = sweeps.row_config(r, size="tiny", seed=1, steps=1000)
      assert (c.quant.recipe, c.optimizer.name) == (recipe, "stable_spam")
      assert (c.optimizer.total_steps, c.optimizer.grad_clip) == (-1, 0.0)  # reference script
      assert c.optimizer.lr == pytest.approx(3e-3 * r.lr_scale)
  c = sweeps.row_config(rows["nvfp4_adam_lr0.5x"], size="tiny", seed=0, steps=1000)
  assert (c.optimizer.name, c.optimizer.grad_clip, c.optimizer.lr) == ("adam", 1.0, 1.5e-3)
  # SPAM, the third optimizer, with the trainer's settings (global clipping at 1.0, no total_T)
  spam = [r for r in rows.values() if r.optimizer == "spam"]
  assert {r.recipe for r in spam} >= {"mxfp4", "nvfp4", "bf16"} and all(not r.overrides for r in spam)
  assert {r.lr_scale for r in spam if r.recipe == "mxfp4"} >= {0.25, 0.5, 1.0, 2.0}
  c = sweeps.row_config(rows["mxfp4_spam_lr0.5x"], size="tiny", seed=0, steps=1000)
  assert (c.optimizer.name, c.optimizer.grad_clip, c.optimizer.lr) == ("spam", 1.0, 1.5e-3)


def test_stable_spam_with_gamma3_zero_never_clips_and_without_resets_is_adam_plus_adagn():
  """What the sspam_parts rows rely on: gamma3 = 0 switches AdaClip off (the threshold is this
  step's max|g|) and reset_interval = 0 never resets, leaving Adam on AdaGN-scaled gradients."""
  import jax.numpy as jnp
  import numpy as np

  from lpjax.optim import stable_spam

  rng = np.random.default_rng(0)
  grads = [rng.standard_normal(64).astype(np.float32) * (1 + 50 * (t == 4)) for t in range(12)]
  grads[6][3] = 1e3  # an entry spike AdaClip would clip
  tx = stable_spam(1e-2, gamma3=0.0, reset_interval=0)
  params = jnp.zeros(64)
  state = tx.init(params)
  b1, b2, eps, g1, g2 = 0.9, 0.999, 1e-8, 0.7, 0.9
  m = v = np.zeros(64)
  mu = nu = 0.0
  for k, g in enumerate(grads, start=1):
    updates, state = tx.update(jnp.asarray(g), state, params)
    g = g.astype(np.float64)
    n = np.linalg.norm(g)
    mu, nu = g1 * mu + (1 - g1) * n, g2 * nu + (1 - g2) * n * n
    c = (mu / (1 - g1**k)) / (np.sqrt(nu / (1 - g2**k)) + eps)
    g = g / n * c  # AdaGN only: no entry was clipped
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    want = -1e-2 * m / (1 - b1**k) / (np.sqrt(v) / np.sqrt(1 - b2**k) + eps)
    np.testing.assert_allclose(np.asarray(updates), want, rtol=2e-4, atol=1e-9)


def test_lr_curve_table_and_plot_from_finished_runs(tmp_path, capsys):
  import ablate_lr_curve as lr_curve

  def run(label, seed, loss):
    d = tmp_path / "runs" / "optim_lr" / label / f"seed{seed}"
    d.mkdir(parents=True)
    if loss is None:
      (d / "failed.json").write_text(json.dumps({"type": "TrainingError"}))
    else:
      (d / "results.json").write_text(json.dumps({"final_eval_loss": loss}))

  run("mxfp4_adam_lr0.5x", 0, 1.80), run("mxfp4_adam_lr0.5x", 1, 1.82), run("mxfp4_adam", 0, 1.84)
  run("mxfp4_stable_spam", 0, 1.86), run("mxfp4_stable_spam_lr4x", 0, None)
  (tmp_path / "runs" / "optim_lr" / "mxfp4_adam" / "seed1").mkdir()  # still training: left out
  points = lr_curve.load(str(tmp_path))
  assert points[("mxfp4", "adam", 0.5)] == {0: 1.80, 1: 1.82}
  assert points[("mxfp4", "adam", 1.0)] == {0: 1.84}
  assert math.isnan(points[("mxfp4", "stable_spam", 4.0)][0])
  table = lr_curve.markdown(points, earlier=False)
  assert "| Adam(W) | **1.8100 ± 0.0141 (2)** | 1.8400 (1) |  |" in table
  assert "| Stable-SPAM |  | **1.8600 (1)** | diverged |" in table
  assert "(1, earlier)" in lr_curve.markdown(points, earlier=True)
  png = tmp_path / "curve.png"
  assert lr_curve.main(["--out", str(tmp_path), "--png", str(png)]) == 0
  assert png.stat().st_size > 0
  capsys.readouterr()


def test_lr_curve_of_sspam_parts_draws_the_reference_settings_as_their_own_line(tmp_path):
  import ablate_lr_curve as lr_curve

  for label, seed, loss in [("nvfp4_adam_lr0.5x", 0, 1.81), ("nvfp4_paper_run_lr0.5x", 0, 1.83),
                            ("nvfp4_paper_run_lr0.5x", 1, 1.85), ("mxfp4_paper_run", 0, 1.86),
                            ("mxfp4_noclip_lr0.5x", 0, 1.70), ("mxfp4_full_lr0.5x", 0, 1.90)]:
    d = tmp_path / "runs" / "sspam_parts" / label / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps({"final_eval_loss": loss}))
  points = lr_curve.load(str(tmp_path), "sspam_parts")
  # noclip and the other single-part rows are not on an lr curve; the full optimizer (trainer
  # settings, no overrides) is the plain Stable-SPAM line
  assert points == {("nvfp4", "adam", 0.5): {0: 1.81},
                    ("nvfp4", "stable_spam_ref", 0.5): {0: 1.83, 1: 1.85},
                    ("mxfp4", "stable_spam_ref", 1.0): {0: 1.86},
                    ("mxfp4", "stable_spam", 0.5): {0: 1.90}}
  table = lr_curve.markdown(points, earlier=False)
  assert "| Stable-SPAM, reference settings | **1.8400 ± 0.0141 (2)** |" in table
  assert lr_curve.main(["--out", str(tmp_path), "--sweep", "sspam_parts", "--png",
                        str(tmp_path / "c.png")]) == 0


def _apply_command(command: str):
  """The config train.py would build from `command` (its --config.key=value flags)."""
  args = shlex.split(command)
  config = sweeps.load_config_file(args[2].split("=", 1)[1])
  for arg in args[3:]:
    if arg.startswith("--config."):
      key, value = arg[len("--config."):].split("=", 1)
      sweeps.set_key(config, key, value)
  return config


@pytest.mark.parametrize("sweep", ["optimizer", "gemms", "schedule", "granularity", "sspam_parts"])
def test_reproduce_command_rebuilds_the_exact_config(sweep):
  for row in sweeps.SWEEPS[sweep]:
    config = sweeps.row_config(row, size="tiny", seed=2)
    rebuilt = _apply_command(sweeps.reproduce_command(config, "tiny", "runs/x"))
    assert ablate.run_key(rebuilt) == ablate.run_key(config), row.label


def test_micro_sweep_end_to_end_then_resume_and_reuse(tmp_path, capsys):
  out = str(tmp_path)
  assert ablate.main(["format", "--out", out, "--rows", "mxfp4_naive"] + MICRO) == 0
  log = capsys.readouterr().out
  assert "2 runs: 2 to train" in log
  for suffix in (".md", ".json", "_curves.png", "_final.png"):
    assert os.path.getsize(os.path.join(out, f"format{suffix}")) > 0
  summary = json.load(open(os.path.join(out, "format.json")))
  assert [r["label"] for r in summary["rows"]] == ["fp32_adam", "mxfp4_naive"]
  for r in summary["rows"]:
    assert r["n_ok"] == 1 and math.isfinite(r["mean"]) and r["runs"][0]["steps"] == 3
    assert r["curve"]["steps"] == [1, 2, 3]
    results = json.load(open(os.path.join(out, "runs", "format", r["label"], "seed0", "results.json")))
    assert r["mean"] == results["final_eval_loss"]
    assert not os.path.exists(os.path.join(out, "runs", "format", r["label"], "seed0", "checkpoints"))
  assert summary["rows"][0]["ratio_pct"] == 0.0
  md = open(os.path.join(out, "format.md")).read()
  assert "| mxfp4_naive | `mxfp4_naive` | adam |" in md and "--config.quant.recipe=mxfp4_naive" in md

  # Same command: nothing trains. The quality sweep's rows are the same configs: copied.
  assert ablate.main(["format", "--out", out, "--rows", "mxfp4_naive"] + MICRO) == 0
  assert "0 to train, 0 copied from identical runs, 2 already done" in capsys.readouterr().out
  assert ablate.main(["quality", "--out", out, "--rows", "mxfp4_naive_adam"] + MICRO) == 0
  log = capsys.readouterr().out
  assert "2 runs: 0 to train, 2 copied" in log
  quality = json.load(open(os.path.join(out, "quality.json")))
  assert [r["mean"] for r in quality["rows"]] == [r["mean"] for r in summary["rows"]]
  goals = open(os.path.join(out, "quality_goals.md")).read()
  assert "| mxfp4 within +3% of FP32 Adam |" in goals and "not measured" in goals

  # A different setting in the same directory is refused, not mixed in.
  with pytest.raises(SystemExit, match="another config"):
    ablate.main(["format", "--out", out, "--rows", "mxfp4_naive"] + MICRO[:3] + ["4"] + MICRO[4:])


def test_a_failing_run_is_recorded_and_the_sweep_goes_on(tmp_path, capsys):
  out = str(tmp_path)
  args = ["block_size", "--out", out, "--rows", "fp32_adam", "--set", "debug.nan_at_step=0",
          "--set", "max_consecutive_skips=1"] + MICRO
  assert ablate.main(args) == 0
  failed = json.load(open(os.path.join(out, "runs", "block_size", "fp32_adam", "seed0", "failed.json")))
  assert failed["type"] == "TrainingError"
  row = json.load(open(os.path.join(out, "block_size.json")))["rows"][0]
  assert (row["n_ok"], row["n_diverged"]) == (0, 1) and math.isnan(row["mean"])
  assert "0/1 (1 diverged)" in open(os.path.join(out, "block_size.md")).read()
  capsys.readouterr()


def test_a_signal_stops_the_whole_sweep_and_keeps_the_checkpoint(tmp_path, monkeypatch, capsys):
  """SIGTERM makes the trainer checkpoint and return "stopped"; the sweep must stop there too
  (not go on to the next run) and keep that run's checkpoint for the resume."""
  ran = []

  def stopped_run(self):
    ran.append(self.workdir)
    os.makedirs(os.path.join(self.workdir, "checkpoints"), exist_ok=True)
    return {"steps": 1, "stopped": True, "signal": 15}

  from lpjax.train import Trainer
  monkeypatch.setattr(Trainer, "run", stopped_run)
  with pytest.raises(SystemExit) as exit_info:
    ablate.main(["block_size", "--out", str(tmp_path)] + MICRO)
  assert exit_info.value.code == 143 and len(ran) == 1
  assert os.path.isdir(os.path.join(ran[0], "checkpoints"))
  assert "the same command resumes" in capsys.readouterr().out
