"""A run in several processes (stopped, killed after a checkpoint, resumed) reports the whole
run's time in results.json and the summary, segment by segment; a resume that changes the
schedule says what the learning rate does."""

import logging
import math
import os
import shutil
import time

import pytest

from config_helpers import small

from lpjax.train.outputs._results import format_summary
from lpjax.train.loop._trainer import Trainer


def test_a_stopped_killed_and_resumed_run_counts_every_segment(tmp_path):
  workdir = str(tmp_path)
  config = lambda: small(steps=5, checkpoint_every=1)  # noqa: E731 -- a fresh ConfigDict each time
  began = time.time()
  assert Trainer(config(), workdir).run(stop_after=2)["stopped"]
  first_took = time.time() - began
  assert Trainer(config(), workdir).run(stop_after=4)["stopped"]
  # A SIGKILL after step 3's checkpoint and before step 4's leaves the workdir like this:
  shutil.rmtree(os.path.join(workdir, "checkpoints", "4"))
  results = Trainer(config(), workdir).run()
  segments = results["segments"]
  assert [(s["start_step"], s["end_step"], s["ended"]) for s in segments] == [
      (0, 2, "stopped"), (2, 3, "killed"), (3, 5, "finished")]
  assert results["wall_time_s"] == pytest.approx(sum(s["wall_s"] for s in segments), abs=0.05)
  assert results["compile_time_s"] == pytest.approx(sum(s["compile_s"] for s in segments),
                                                    abs=0.05)
  assert 0 < segments[0]["compile_s"] <= segments[0]["wall_s"] <= first_took
  assert results["wall_time_s"] > segments[-1]["wall_s"] + segments[0]["wall_s"]
  text = format_summary(results, workdir)
  assert "over 3 segments:" in text and "steps 0 -> 2:" in text and "killed" in text
  m, s = divmod(int(round(results["wall_time_s"])), 60)
  assert f"in 0:{m:02d}:{s:02d} (of which" in text


def _lr(step, steps, peak, warmup, min_ratio):
  """The schedule written out: linear warm-up from 0, then a cosine to peak * min_ratio at steps."""
  warmup = min(warmup, max(steps - 1, 0))
  if step < warmup:
    return peak * step / warmup
  decay = max(steps, warmup + 1) - warmup
  t = min(step - warmup, decay) / decay
  end = peak * min_ratio
  return end + (peak - end) * 0.5 * (1 + math.cos(math.pi * t))


def test_more_steps_on_resume_state_the_learning_rate_jump(tmp_path, caplog):
  workdir = str(tmp_path)
  first = Trainer(small(steps=3), workdir).run()
  config = small(steps=8)
  o = config.optimizer
  before = _lr(3, 3, o.lr, o.warmup_steps, o.min_lr_ratio)
  after = _lr(3, 8, o.lr, o.warmup_steps, o.min_lr_ratio)
  assert after > 2 * before  # the cosine restarts from higher up
  with caplog.at_level(logging.WARNING, logger="lpjax.train"):
    trainer = Trainer(config, workdir)
    trainer.restore_or_init()
  assert "steps 3 -> 8" in caplog.text
  assert f"at step 3 the lr was {before:.2e} and is now {after:.2e}" in caplog.text
  assert f"decays to {o.lr * o.min_lr_ratio:.2e} at step 8 instead of step 3" in caplog.text
  assert "--config.steps=3" in caplog.text
  # the finished run trained further: its segment as its results.json gave it (final eval in)
  results = trainer.run()
  assert results["segments"][0] == first["segments"][0]
  assert [(s["start_step"], s["end_step"], s["ended"]) for s in results["segments"]] == [
      (0, 3, "finished"), (3, 8, "finished")]
