"""`python -m lpjax.plot`: the runs' curves read from metrics.jsonl, the FP4 gap against an
independent computation, a PNG drawn, and matplotlib optional (a clear message without it)."""

import json
import os
import subprocess
import sys

import pytest

from lpjax import plot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_dir(tmp_path, name, recipe, losses, evals=(), optimizer="adamw", torn=False, **config):
  """A workdir as train.py leaves it: metrics.jsonl (train losses at steps 10, 20, ...; `evals`:
  (step, loss, loss_fp)), config.json (with `config`'s dotted keys, e.g. `steps=300`,
  `**{"optimizer.lr": 2e-3}`) and results.json."""
  d = tmp_path / name
  d.mkdir(parents=True)
  with open(d / "metrics.jsonl", "w") as f:
    for i, loss in enumerate(losses, 1):
      f.write(json.dumps({"step": 10 * i, "train/loss": loss, "train/lr": 1e-3}) + "\n")
    for step, q, fp in evals:
      f.write(json.dumps({"step": step, "eval/loss": q, "eval/loss_fp": fp, "eval/ppl": 9.0}) + "\n")
    if torn:
      f.write('{"step": 99, "train/lo')
  nested = {"quant": {"recipe": recipe}, "optimizer": {"name": optimizer}}
  for key, value in config.items():
    *sections, leaf = key.split(".")
    node = nested
    for section in sections:
      node = node.setdefault(section, {})
    node[leaf] = value
  (d / "config.json").write_text(json.dumps(nested))
  (d / "results.json").write_text(json.dumps({"recipe": recipe, "optimizer": optimizer}))
  return str(d)


def test_read_run_takes_train_and_eval_losses_and_skips_a_torn_line(tmp_path):
  d = _run_dir(tmp_path, "a", "mxfp4", [3.0, 2.5, 2.0], [(30, 2.1, 2.0)], torn=True)
  run = plot.read_run(d)
  assert run.train_steps == [10, 20, 30] and run.train_loss == [3.0, 2.5, 2.0]
  assert (run.eval_steps, run.eval_loss, run.eval_loss_fp) == ([30], [2.1], [2.0])
  assert run.label == "a (mxfp4, adamw)" and not run.full_precision


def _gap_runs(tmp_path, fp4_evals, base_evals):
  """An nvfp4 run and its bf16 baseline whose per-batch train losses are far apart (noise the gap
  must not take), with the given (step, eval loss) evaluations."""
  fp4 = _run_dir(tmp_path, "fp4", "nvfp4", [9.0, 1.0, 9.0, 1.0, 9.0],
                 [(s, q, q) for s, q in fp4_evals])
  base = _run_dir(tmp_path, "base", "bf16", [1.0, 9.0, 1.0, 9.0, 1.0],
                  [(s, q, q) for s, q in base_evals])
  return plot.read_run(fp4), plot.read_run(base)


def test_the_gap_to_a_baseline_compares_evaluations_at_equal_steps(tmp_path):
  fp4, base = _gap_runs(tmp_path, [(10, 3.3), (20, 2.6), (30, 2.2)],
                        [(20, 2.5), (30, 2.0), (40, 1.9)])
  steps, gap = plot.gap_to_baseline(fp4, base)
  assert steps == [20, 30]  # only the steps both evaluated
  assert gap == pytest.approx([100 * (2.6 - 2.5) / 2.5, 100 * (2.2 - 2.0) / 2.0])
  row = plot.summary_table([fp4, base]).splitlines()[1]
  assert row.split()[-2:] == ["+10.00%", "30"]  # the last common step, named
  fp4, base = _gap_runs(tmp_path / "none", [(160, 2.2)], [(300, 2.0)])
  assert plot.gap_to_baseline(fp4, base) == ([], [])  # 160 against 300: no gap at all
  table = plot.summary_table([fp4, base])
  assert table.splitlines()[1].split()[-2:] == ["-", "-"] and "no step both evaluated" in table


@pytest.fixture
def drawn(monkeypatch):
  """The figures plot_runs saves."""
  pytest.importorskip("matplotlib")
  from matplotlib.figure import Figure
  figures, save = [], Figure.savefig
  monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (figures.append(fig),
                                                                  save(fig, *a, **k))[1])
  return figures


def test_the_gap_panel_draws_the_equal_step_gap_and_says_what_it_is(tmp_path, drawn):
  fp4, base = _gap_runs(tmp_path, [(10, 3.3), (20, 2.6), (30, 2.2)], [(20, 2.5), (30, 2.0)])
  plot.plot_runs([fp4, base], str(tmp_path / "a.png"))
  gap_ax = drawn[-1].axes[1]
  assert gap_ax.get_title() == "eval loss gap vs base (bf16, adamw), % at equal steps"
  (line,) = [l for l in gap_ax.get_lines() if l.get_label() == fp4.label]
  assert list(line.get_xdata()) == [20, 30]
  assert list(line.get_ydata()) == pytest.approx([4.0, 10.0])
  fp4, base = _gap_runs(tmp_path / "none", [(160, 2.2)], [(300, 2.0)])
  plot.plot_runs([fp4, base], str(tmp_path / "b.png"))
  gap_ax = drawn[-1].axes[1]
  assert [l.get_label() for l in gap_ax.get_lines() if l.get_label() == fp4.label] == []
  assert any("no step at which both" in t.get_text() for t in gap_ax.texts)


def test_runs_that_differ_in_more_than_the_recipe_are_named_with_each_difference(tmp_path,
                                                                                capsys):
  a = _run_dir(tmp_path, "fp4", "mxfp4", [3.0], [(10, 2.2, 2.0)], optimizer="stable_spam",
               steps=160, seed=0, batch_size=32, **{"data.path": "a.txt", "monitor.every": 20})
  b = _run_dir(tmp_path, "base", "bf16", [3.0], [(10, 2.1, 2.1)], steps=300, seed=1,
               batch_size=64, **{"data.path": "b.txt", "monitor.every": 0})
  warnings = plot.config_warnings([plot.read_run(a), plot.read_run(b)])
  assert warnings == ["batch_size: fp4 32, base 64", "data.path: fp4 a.txt, base b.txt",
                      "optimizer.name: fp4 stable_spam, base adamw", "seed: fp4 0, base 1",
                      "steps: fp4 160, base 300"]  # each run's value in turn; not monitor.every
  pytest.importorskip("matplotlib")
  assert plot.main([a, b, f"--out={tmp_path / 'x.png'}"]) == 0
  err = capsys.readouterr().err
  assert "differ in more than the recipe" in err and "steps: fp4 160, base 300" in err


def test_runs_that_differ_only_in_recipe_and_bookkeeping_give_no_warning(tmp_path):
  a = _run_dir(tmp_path, "fp4", "mxfp4", [3.0], steps=160, log_every=5,
               **{"monitor.every": 20, "quant.rules": "x->bf16", "checkpoint_every": 10})
  b = _run_dir(tmp_path, "base", "bf16", [3.0], steps=160, log_every=10)
  assert plot.config_warnings([plot.read_run(a), plot.read_run(b)]) == []


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
  assert lines[1].startswith("fp4 (mxfp4, adamw)") and lines[1].split()[-2:] == ["+10.00%", "10"]
  assert lines[2].endswith("-") and "relative to the baseline base (bf16, adamw)" in lines[-1]
  alone = plot.summary_table(runs[:1]).splitlines()
  assert alone[1].split()[-2:] == ["+4.76%", "10"]  # 2.2 vs 2.1 in full precision


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
