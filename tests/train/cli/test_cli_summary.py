"""The end of a run a newcomer reads: the ETA from the steady step rate (compiles, evaluations and
a resume left out), the plain-text summary with the FP4-vs-full-precision evaluation and the next
commands, and train.py printing it."""

import logging
import os
import shlex
import subprocess
import sys

import pytest

from lpjax.train.cli import _cli as cli
from lpjax.train.outputs import _metrics
from lpjax.train.outputs._metrics import Progress
from lpjax.train.outputs._results import format_summary

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class _Clock:
  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


@pytest.fixture
def clock(monkeypatch):
  c = _Clock()
  monkeypatch.setattr(_metrics.time, "perf_counter", c)
  return c


def test_the_eta_leaves_out_the_compile(clock):
  p = Progress(0, 1000, 100.0, enabled=False)
  clock.now = 100.0  # 10 steps at 0.5 s each, after a 95 s compile
  p.exclude(95.0)
  p.update(10, 3.0)
  assert p.eta_seconds(10) == pytest.approx(990 * 0.5)
  clock.now = 105.0
  p.update(20, 2.9)
  assert p.eta_seconds(20) == pytest.approx(980 * 0.5)  # the old rate, compile in: 5,145 s


def test_without_exclude_the_first_interval_is_dropped_once_a_steady_one_exists(clock):
  p = Progress(0, 1000, 100.0, enabled=False)
  clock.now = 60.0  # compile and 10 steps, nothing excluded
  p.update(10, 3.0)
  clock.now = 65.0
  p.update(20, 2.9)
  assert p.eta_seconds(20) == pytest.approx(980 * 0.5)


def test_evaluations_do_not_count_and_a_resume_starts_afresh(clock):
  p = Progress(500, 1000, 100.0, enabled=False)  # resumed at step 500
  assert p.eta_seconds(500) != p.eta_seconds(500)  # nan: nothing timed yet
  clock.now = 5.0
  p.update(510, 3.0)
  clock.now = 10.0
  p.update(520, 3.0)
  clock.now = 70.0  # a 60 s evaluation
  p.restart_clock()
  clock.now = 75.0
  p.update(530, 3.0)
  assert p.eta_seconds(530) == pytest.approx(470 * 0.5)


def test_the_log_line_says_tokens_per_second_and_the_steady_eta(clock, caplog):
  p = Progress(0, 100, 1000.0, True, unit="tokens", terminal=False, line_seconds=0.0)
  with caplog.at_level(logging.INFO, logger="lpjax.train"):
    clock.now = 40.0
    p.exclude(39.0)
    p.update(10, 2.5)
  line = caplog.records[-1].getMessage()
  assert line == "step 10/100: loss 2.5000, 10,000 tokens/s, ETA 0:00:09"


RESULTS = {"steps": 300, "tokens": 1228800, "final_train_loss": 2.31, "final_eval_loss": 2.2954,
           "final_eval_ppl": 9.929, "final_eval_loss_fp": 2.2901, "final_eval_ppl_fp": 9.876,
           "skipped_steps": 0, "rollbacks": 0, "wall_time_s": 3723.0, "compile_time_s": 31.0,
           "task": "lm", "recipe": "mxfp4", "optimizer": "stable_spam", "model": "tiny"}


def test_the_summary_has_the_numbers_the_files_and_the_next_commands(tmp_path):
  (tmp_path / "metrics.jsonl").write_text("")
  (tmp_path / "checkpoints").mkdir()
  text = format_summary(RESULTS, str(tmp_path), [("python -m lpjax.plot runs/x", "plot it")])
  assert "in 1:02:03 (of which 31.0 s compiling)" in text
  assert "final train loss: 2.3100" in text
  loss_row = next(l for l in text.splitlines() if l.strip().startswith("loss "))
  assert loss_row.split() == ["loss", "2.2954", "2.2901", f"{100 * (2.2954 / 2.2901 - 1):+.2f}%"]
  assert "metrics.jsonl" in text and "checkpoints/" in text and "tensorboard" not in text
  assert text.rstrip().endswith("# plot it\n  python -m lpjax.plot runs/x")
  assert "{" not in text  # no raw dict


def test_the_summary_of_an_image_task_pairs_each_metric(tmp_path):
  r = {"steps": 10, "images": 800, "final_train_loss": 0.5, "final_eval_accuracy": 0.9,
       "final_eval_accuracy_fp": 0.92, "task": "classification", "recipe": "mxfp4"}
  text = format_summary(r, str(tmp_path))
  assert "(800 images)" in text
  assert next(l for l in text.splitlines() if "accuracy" in l).split()[1:] == [
      "0.9000", "0.9200", "-2.17%"]


def test_next_commands_use_the_sibling_bf16_config_for_a_fp4_run():
  config = os.path.join(ROOT, "configs", "llama_tiny_mxfp4.py")
  commands = [c for c, _ in cli.next_commands(config, "runs/llama_tiny_mxfp4", "mxfp4",
                                              have_matplotlib=True)]
  bf16 = os.path.join(ROOT, "configs", "llama_tiny_bf16.py")
  assert commands[1] == f"python train.py --config={bf16} --workdir=runs/llama_tiny_bf16"
  assert commands[2] == "python -m lpjax.plot runs/llama_tiny_mxfp4 runs/llama_tiny_bf16"


MXFP4, BF16 = (os.path.join(ROOT, "configs", f"llama_tiny_{r}.py") for r in ("mxfp4", "bf16"))


def _baseline(tmp_path, overrides):
  """(baseline train.py command as argv, its plot command) after a run of llama_tiny_mxfp4 in
  tmp_path/llama_tiny_mxfp4 with `overrides`."""
  commands = cli.next_commands(MXFP4, str(tmp_path / "llama_tiny_mxfp4"), "mxfp4", overrides,
                               have_matplotlib=True)
  return shlex.split(commands[1][0]), commands[2][0], commands[1][1]


def _write_run(workdir, config_file, **values):
  """A workdir whose config.json is `config_file`'s config with `values` (dotted keys) set."""
  from config_helpers import override

  from lpjax.train.config import load_config_file
  workdir.mkdir()
  (workdir / "config.json").write_text(
      override(load_config_file(config_file), **values).to_json_best_effort())


def test_the_baseline_keeps_only_the_overrides_that_make_the_runs_comparable(tmp_path):
  watch = ["--config.monitor.every=20", "--config.log_every=5", "--config.checkpoint_every=50",
           "--config.progress_bar=False", "--config.data.prefetch=0", "--config.keep_checkpoints=1",
           "--config.quant.rules=^lm_head$->bf16", "--config.mesh.fsdp=2"]
  same = ["--config.steps=160", "--config.optimizer.lr=2e-3", "--config.seed=1",
          "--config.batch_size=16", "--config.data.path=my corpus/*.txt"]
  argv, plot_command, _ = _baseline(tmp_path, watch[:3] + same + watch[3:])
  assert argv[3:-1] == same  # in their order, quoted for a shell; nothing else
  workdir = argv[-1].split("=", 1)[1]
  assert argv[:3] == ["python", "train.py", f"--config={BF16}"]
  assert os.path.dirname(workdir) == str(tmp_path)
  assert os.path.basename(workdir).startswith("llama_tiny_bf16_cfg")  # a hash: the name is long
  assert plot_command == f"python -m lpjax.plot {tmp_path / 'llama_tiny_mxfp4'} {workdir}"
  argv, _, _ = _baseline(tmp_path, ["--config.steps=160", "--config.monitor.every=20"])
  assert argv[3:] == ["--config.steps=160", f"--workdir={tmp_path / 'llama_tiny_bf16_steps160'}"]


def test_an_existing_workdir_of_another_run_is_never_the_baseline(tmp_path):
  # The new user's case: a 300-step bf16 run exists; the baseline of a 160-step run is not it.
  _write_run(tmp_path / "llama_tiny_bf16", BF16, steps=300, seed=5)
  _write_run(tmp_path / "llama_tiny_bf16_steps160", BF16, steps=300)
  (tmp_path / "llama_tiny_bf16_steps160-2").mkdir()  # a workdir without config.json: not it
  argv, plot_command, what = _baseline(tmp_path, ["--config.steps=160"])
  fresh = str(tmp_path / "llama_tiny_bf16_steps160-3")
  assert argv[-1] == f"--workdir={fresh}" and not os.path.exists(fresh)
  assert plot_command.endswith(f" {fresh}") and "holds it already" not in what
  argv, _, _ = _baseline(tmp_path, [])  # no compared override: the default workdir, if it fits
  assert argv[-1] == f"--workdir={tmp_path / 'llama_tiny_bf16-2'}"


def test_an_existing_workdir_of_the_same_baseline_is_suggested_again(tmp_path):
  _write_run(tmp_path / "llama_tiny_bf16_steps160", BF16, steps=160,
             **{"log_every": 1, "monitor.every": 5})  # watched differently: still the same run
  argv, plot_command, what = _baseline(tmp_path, ["--config.steps=160"])
  assert argv[-1] == f"--workdir={tmp_path / 'llama_tiny_bf16_steps160'}"
  assert "holds it already" in what
  _write_run(tmp_path / "llama_tiny_bf16", BF16, **{"quant.recipe": "mxfp4"})  # not a bf16 run
  argv, _, _ = _baseline(tmp_path, [])
  assert argv[-1] == f"--workdir={tmp_path / 'llama_tiny_bf16-2'}"


def test_next_commands_of_a_bf16_run_suggest_mxfp4():
  commands = [c for c, _ in cli.next_commands("my/exp.py", "runs/exp", "bf16",
                                              have_matplotlib=True)]
  assert commands[1] == ("python train.py --config=my/exp.py --config.quant.recipe=mxfp4 "
                         "--workdir=runs/exp_mxfp4")


def test_without_matplotlib_the_first_next_command_installs_the_plot_requirements():
  commands = [c for c, _ in cli.next_commands("my/exp.py", "runs/exp", "bf16", python=".venv/bin/python",
                                              have_matplotlib=False)]
  assert commands[0] == ".venv/bin/python -m pip install -r requirements-plot.txt"
  assert os.path.isfile(os.path.join(ROOT, cli.PLOT_REQUIREMENTS))
  assert commands[1] == ".venv/bin/python -m lpjax.plot runs/exp"


def test_train_py_ends_with_the_summary(tmp_path):
  workdir = tmp_path / "run"
  out = subprocess.run(
      [sys.executable, os.path.join(ROOT, "train.py"),
       "--config=" + os.path.join(ROOT, "configs", "llama_tiny_bf16.py"), f"--workdir={workdir}",
       "--compilation_cache=", "--config.steps=2", "--config.batch_size=8", "--config.seq_len=32",
       "--config.eval_steps=1", "--config.progress_bar=False", "--config.data.prefetch=0"],
      cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr[-3000:]
  text = out.stdout
  assert "Finished: 2 steps (512 tokens) of lm model tiny, recipe bf16" in text
  assert f"Files in {workdir}:" in text and "results.json" in text
  assert "--config.quant.recipe" not in text  # the sibling file is the other run
  baseline = tmp_path / "llama_tiny_mxfp4_steps2_batch_size8_seq_len32_eval_steps1"
  assert (f"--config.steps=2 --config.batch_size=8 --config.seq_len=32 --config.eval_steps=1 "
          f"--workdir={baseline}\n") in text  # not the progress bar's or the prefetch's flags
  assert f"-m lpjax.plot {workdir} {baseline}" in text
  assert "precision phase: the run's own recipe" in out.stderr
