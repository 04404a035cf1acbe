"""A real train.py process killed with SIGKILL (between checkpoints, or during a checkpoint write)
or stopped with SIGTERM resumes to bit-identical parameters, optimizer state and metrics.

The runs use MXFP4 with stochastic rounding (random bits from (seed, step)) and Stable-SPAM, one
CPU device, and share the persistent compile cache so only the first run compiles.
"""

import json
import os
import signal
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest
from train_subprocess import start_train

# ~0.1 s a step: a kill after the first checkpoint (step 10) lands with 50 steps and 5 checkpoint
# writes still to come, mid-run (before: 120 steps, every 20, twice the steps in the 7 train.py
# runs for the same kills and the same checks)
STEPS, EVERY = 60, 10
FLAGS = [f"--config.steps={STEPS}", "--config.batch_size=8", "--config.seq_len=32",
         f"--config.checkpoint_every={EVERY}", "--config.eval_every=0", "--config.eval_steps=1",
         "--config.log_every=5", "--config.progress_bar=False", "--config.optimizer.warmup_steps=10",
         "--config.keep_checkpoints=2"]


def _start(workdir):
  return start_train(workdir, FLAGS)


def _finish(proc, timeout=600):
  out, _ = proc.communicate(timeout=timeout)
  return proc.returncode, out


def _wait_for(proc, predicate, timeout=600):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if predicate():
      return True
    if proc.poll() is not None:
      return False
    time.sleep(0.02)
  return False


def _steps(workdir):
  d = os.path.join(workdir, "checkpoints")
  return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []


def _writing(workdir):
  d = os.path.join(workdir, "checkpoints")
  return os.path.isdir(d) and any("tmp" in n for n in os.listdir(d))


def _final_state(workdir):
  path = os.path.join(workdir, "checkpoints", str(STEPS), "state")
  with ocp.StandardCheckpointer() as ckpt:
    return ckpt.restore(path)


def _losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(l) for l in f]
  return [(r["step"], r["train/loss"]) for r in records if "train/loss" in r]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("uninterrupted"))
  code, out = _finish(_start(workdir))
  assert code == 0, out[-3000:]
  return workdir


def _segments(workdir):
  """(start_step, end_step, ended, signal) of each segment in results.json (totals checked)."""
  results = json.load(open(os.path.join(workdir, "results.json")))
  segments = results["segments"]
  assert results["wall_time_s"] == pytest.approx(sum(s["wall_s"] for s in segments), abs=0.05)
  return [(s["start_step"], s["end_step"], s["ended"], s.get("signal")) for s in segments]


def _assert_same_run(resumed, reference):
  import jax
  a, b = _final_state(resumed), _final_state(reference)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    x, y = np.atleast_1d(np.asarray(x)), np.atleast_1d(np.asarray(y))
    assert x.dtype == y.dtype and np.array_equal(x.view(np.uint8), y.view(np.uint8))
  assert _losses(resumed) == _losses(reference)  # no duplicated or missing steps either
  r1 = json.load(open(os.path.join(resumed, "results.json")))
  r2 = json.load(open(os.path.join(reference, "results.json")))
  for key in ("steps", "tokens", "final_train_loss", "final_eval_loss", "final_eval_loss_fp"):
    assert r1[key] == r2[key], key


@pytest.mark.parametrize("moment", ["between_checkpoints", "during_checkpoint_write"])
def test_sigkill_then_restart_is_bit_identical(tmp_path, reference, moment):
  workdir = str(tmp_path)
  proc = _start(workdir)
  if moment == "between_checkpoints":
    seen = _wait_for(proc, lambda: _steps(workdir) and _steps(workdir)[-1] >= EVERY)
  else:  # orbax writes <step>.orbax-checkpoint-tmp-* and renames it when complete
    seen = _wait_for(proc, lambda: _writing(workdir) and _steps(workdir))
  assert seen and proc.poll() is None, "the run ended before it could be killed"
  proc.send_signal(signal.SIGKILL)
  code, _ = _finish(proc)
  assert code == -signal.SIGKILL
  killed_at = _steps(workdir)[-1]
  assert killed_at < STEPS
  code, out = _finish(_start(workdir))
  assert code == 0, out[-3000:]
  assert "Resumed from" in out
  _assert_same_run(workdir, reference)
  # the killed process counts up to its last checkpoint
  assert _segments(workdir) == [(0, killed_at, "killed", None),
                                (killed_at, STEPS, "finished", None)]
  assert "over 2 segments" in out


def test_sigterm_checkpoints_and_exits_then_resumes(tmp_path, reference):
  workdir = str(tmp_path)
  proc = _start(workdir)
  assert _wait_for(proc, lambda: _steps(workdir) and _steps(workdir)[-1] >= EVERY)
  proc.send_signal(signal.SIGTERM)
  code, out = _finish(proc)
  assert code == 128 + signal.SIGTERM, out[-3000:]
  assert "Received SIGTERM" in out and "resumes it" in out
  stopped_at = _steps(workdir)[-1]
  assert EVERY <= stopped_at < STEPS
  assert f"Stopped by SIGTERM at step {stopped_at}" in out  # saved where it stopped
  code, out = _finish(_start(workdir))
  assert code == 0, out[-3000:]
  assert f"at step {stopped_at}" in out
  _assert_same_run(workdir, reference)
  assert _segments(workdir) == [(0, stopped_at, "interrupted", "SIGTERM"),
                                (stopped_at, STEPS, "finished", None)]
  assert f"steps 0 -> {stopped_at}: " in out and "interrupted by SIGTERM" in out
