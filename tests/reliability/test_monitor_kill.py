"""A train.py run with the monitor's per-site fallback active, killed with SIGKILL after a site
switched and a checkpoint was written, resumes to the same losses, parameters, switches and
monitor.jsonl as an uninterrupted run (the switches live in the checkpoint's meta)."""

import json
import os
import signal
import time

import pytest
from train_subprocess import REPO, start_train

# the site switches at step 2, the kill lands after the checkpoint of step 10 with 20 measured
# steps and 2 checkpoint writes still to come (60 steps before: the same kill and checks)
STEPS, EVERY = 30, 10
FLAGS = [f"--config.steps={STEPS}", "--config.batch_size=8", "--config.seq_len=32",
         f"--config.checkpoint_every={EVERY}", "--config.eval_every=0", "--config.eval_steps=1",
         "--config.log_every=1", "--config.progress_bar=False", "--config.optimizer.warmup_steps=5",
         "--config.model.factory=user_models:linen_lm", "--config.monitor.every=1",
         "--config.monitor.fallback=True", "--config.monitor.fallback_after=2",
         "--config.debug.monitor_fail_path=^up$", "--config.keep_checkpoints=2"]


def _start(workdir):
  return start_train(workdir, FLAGS, os.path.join(REPO, "tests", "train"))


def _steps(workdir):
  d = os.path.join(workdir, "checkpoints")
  return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []


def _read(workdir, name):
  with open(os.path.join(workdir, name)) as f:
    return [json.loads(l) for l in f]


@pytest.mark.slow
def test_sigkill_with_a_site_fallback_then_resume_is_identical(tmp_path):
  reference, workdir = str(tmp_path / "reference"), str(tmp_path / "killed")
  out, _ = (proc := _start(reference)).communicate(timeout=900)
  assert proc.returncode == 0, out[-3000:]
  proc = _start(workdir)
  deadline = time.time() + 900
  while time.time() < deadline and proc.poll() is None and not (
      _steps(workdir) and _steps(workdir)[-1] >= EVERY):
    time.sleep(0.02)
  assert proc.poll() is None, "the run ended before it could be killed"
  proc.send_signal(signal.SIGKILL)
  proc.communicate(timeout=60)
  assert proc.returncode == -signal.SIGKILL and _steps(workdir)[-1] < STEPS
  out, _ = (proc := _start(workdir)).communicate(timeout=900)
  assert proc.returncode == 0, out[-3000:]
  assert "Resumed from" in out

  losses = lambda d: [(r["step"], r["train/loss"]) for r in _read(d, "metrics.jsonl")
                      if "train/loss" in r]
  assert losses(workdir) == losses(reference)
  assert _read(workdir, "monitor.jsonl") == _read(reference, "monitor.jsonl")
  results = [json.load(open(os.path.join(d, "results.json"))) for d in (workdir, reference)]
  switch, = results[1]["site_fallbacks"]
  assert (switch["path"], switch["pass"], switch["step"]) == ("up", "fwd", 2)
  assert results[0]["site_fallbacks"] == results[1]["site_fallbacks"]
  assert results[0]["final_eval_loss"] == results[1]["final_eval_loss"]
