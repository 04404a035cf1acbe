"""`python -m lpjax.plot`: the runs' curves read from metrics.jsonl, the FP4 gap against an
independent computation, a PNG drawn, and matplotlib optional (a clear message without it)."""

import json
import os
import subprocess
import sys

import pytest

from lpjax import plot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_dir(tmp_path, name, recipe, losses, evals=(), optimizer="adamw", torn=False):
  """A workdir as train.py leaves it: metrics.jsonl (train losses at steps 10, 20, ...; `evals`:
  (step, loss, loss_fp)), config.json and results.json."""
  d = tmp_path / name
  d.mkdir()
  with open(d / "metrics.jsonl", "w") as f:
    for i, loss in enumerate(losses, 1):
      f.write(json.dumps({"step": 10 * i, "train/loss": loss, "train/lr": 1e-3}) + "\n")
    for step, q, fp in evals:
      f.write(json.dumps({"step": step, "eval/loss": q, "eval/loss_fp": fp, "eval/ppl": 9.0}) + "\n")
    if torn:
      f.write('{"step": 99, "train/lo')
  (d / "config.json").write_text(json.dumps({"quant": {"recipe": recipe},
                                             "optimizer": {"name": optimizer}}))
  (d / "results.json").write_text(json.dumps({"recipe": recipe, "optimizer": optimizer}))
  return str(d)


def test_read_run_takes_train_and_eval_losses_and_skips_a_torn_line(tmp_path):
  d = _run_dir(tmp_path, "a", "mxfp4", [3.0, 2.5, 2.0], [(30, 2.1, 2.0)], torn=True)
  run = plot.read_run(d)
  assert run.train_steps == [10, 20, 30] and run.train_loss == [3.0, 2.5, 2.0]
  assert (run.eval_steps, run.eval_loss, run.eval_loss_fp) == ([30], [2.1], [2.0])
  assert run.label == "a (mxfp4, adamw)" and not run.full_precision


def test_the_gap_to_a_baseline_is_the_relative_difference_at_common_steps(tmp_path):
  base = [4.0, 3.0, 2.5, 2.0, 1.8]
  fp4 = [1.1 * v for v in base] + [1.0]  # 10% above at every common step, one step more
  runs = [plot.read_run(_run_dir(tmp_path, n, r, l)) for n, r, l in
          (("fp4", "nvfp4", fp4), ("base", "bf16", base))]
  for window in (1, 3):  # a moving average is linear: still 10% everywhere
    steps, gap = plot.gap_to_baseline(runs[0], runs[1], window)
    assert steps == [10, 20, 30, 40, 50]
    assert gap == pytest.approx([10.0] * 5)


def test_the_eval_gap_compares_with_the_same_weights_in_full_precision(tmp_path):
  run = plot.read_run(_run_dir(tmp_path, "a", "mxfp4", [3.0], [(10, 2.2, 2.0), (20, 2.02, 2.0)]))
  steps, gap = plot.eval_gap(run)
  assert steps == [10, 20] and gap == pytest.approx([10.0, 1.0])


def test_smooth_is_a_trailing_mean_that_skips_nan():
  assert plot.smooth([1.0, float("nan"), 3.0, 5.0], 2) == [1.0, 1.0, 3.0, 4.0]


def test_summary_table_names_the_gap_against_the_baseline(tmp_path):
  runs = [plot.read_run(_run_dir(tmp_path, "fp4", "mxfp4", [2.2], [(10, 2.2, 2.1)])),
          plot.read_run(_run_dir(tmp_path, "base", "bf16", [2.0], [(10, 2.0, 2.0)]))]
  lines = plot.summary_table(runs).splitlines()
  assert lines[1].startswith("fp4 (mxfp4, adamw)") and lines[1].endswith("+10.00%")
  assert lines[2].endswith("-") and "relative to the baseline run" in lines[-1]
  alone = plot.summary_table(runs[:1]).splitlines()
  assert alone[1].endswith("+4.76%")  # 2.2 vs 2.1 in full precision


def test_default_out_is_beside_the_runs(tmp_path):
  assert plot.default_out(["runs/a"]) == os.path.join("runs", "a", "loss.png")
  assert plot.default_out(["runs/a/", "runs/b"]) == os.path.join("runs", "loss_a_vs_b.png")


def test_main_draws_one_png_of_several_runs(tmp_path, capsys):
  pytest.importorskip("matplotlib")
  a = _run_dir(tmp_path, "fp4", "mxfp4", [3.0, 2.6, 2.3], [(30, 2.35, 2.3)])
  b = _run_dir(tmp_path, "base", "bf16", [3.0, 2.5, 2.2], [(30, 2.25, 2.25)])
  out = tmp_path / "both.png"
  assert plot.main([a, b, f"--out={out}"]) == 0
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
  assert f"Wrote {out}" in capsys.readouterr().out
  assert plot.main([a]) == 0 and os.path.isfile(os.path.join(a, "loss.png"))


def test_a_workdir_without_metrics_is_one_message(tmp_path, capsys):
  assert plot.main([str(tmp_path / "nothing")]) == 2
  err = capsys.readouterr().err
  assert err.startswith("Plot error: ") and "has no metrics.jsonl" in err


def test_without_matplotlib_the_table_prints_and_the_message_says_what_to_install(
    tmp_path, monkeypatch, capsys):
  monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
  a = _run_dir(tmp_path, "fp4", "mxfp4", [3.0], [(10, 2.2, 2.0)])
  assert plot.main([a]) == 2
  captured = capsys.readouterr()
  assert "fp4 (mxfp4, adamw)" in captured.out
  assert plot.MATPLOTLIB_MISSING in captured.err and "make plot" in captured.err


def test_importing_lpjax_plot_does_not_import_matplotlib():
  code = "import sys, lpjax.plot; print('matplotlib' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=60)
  assert out.stdout.strip() == "False", out.stderr
