"""One run per workdir: a second run stops at once with a clear message; the lock of a killed
run (SIGKILL) never blocks the next one. A checkpoint write that fails stops the run with an
error naming the path; the train.py process exits (it used to hang)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from config_helpers import small

from lpjax.train import CheckpointWriteError, WorkdirInUse
from lpjax.train.loop._trainer import Trainer
from lpjax.train.state._workdir_lock import WorkdirLock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _holder(workdir):
  """A separate process that takes the workdir lock and waits."""
  code = textwrap.dedent(f"""
      import sys, time
      sys.path.insert(0, {ROOT!r})
      from lpjax.train.state._workdir_lock import WorkdirLock
      WorkdirLock({workdir!r}).acquire()
      print("locked", flush=True)
      time.sleep(120)
  """)
  process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
  assert process.stdout.readline().strip() == "locked"
  return process


def test_a_second_run_in_a_locked_workdir_stops_at_once(tmp_path):
  holder = _holder(str(tmp_path))
  try:
    start = time.monotonic()
    with pytest.raises(WorkdirInUse, match=f"pid {holder.pid} on .*another --workdir"):
      Trainer(small(steps=1), str(tmp_path)).run()
    assert time.monotonic() - start < 60  # no training, no waiting (only the set-up)
    assert not os.path.exists(tmp_path / "metrics.jsonl")
  finally:
    holder.kill()
    holder.wait()


def test_the_lock_of_a_killed_run_is_not_stale(tmp_path):
  holder = _holder(str(tmp_path))
  os.kill(holder.pid, signal.SIGKILL)
  holder.wait()
  assert os.path.exists(tmp_path / ".lock")  # the file stays, the lock does not
  with WorkdirLock(str(tmp_path)):
    pass


def test_a_lock_released_by_a_finished_run_can_be_taken_again(tmp_path):
  with WorkdirLock(str(tmp_path)):
    with pytest.raises(WorkdirInUse):
      WorkdirLock(str(tmp_path)).acquire()
  WorkdirLock(str(tmp_path)).acquire().release()


def _break_checkpoint_directory(workdir):
  checkpoints = os.path.join(workdir, "checkpoints")
  os.rename(checkpoints, checkpoints + ".moved")  # atomic, even while a write is in flight
  open(checkpoints, "w").close()  # writes under it now fail (NotADirectoryError)


def test_a_failed_checkpoint_write_raises_an_error_naming_the_path(tmp_path):
  trainer = Trainer(small(steps=4, checkpoint_every=1), str(tmp_path))
  real_save = trainer._save

  def save(step, *args):
    if step == 2:
      trainer.checkpointer.wait()  # step 1 is written; then the directory goes
      _break_checkpoint_directory(str(tmp_path))
    return real_save(step, *args)
  trainer._save = save
  with pytest.raises(CheckpointWriteError, match=f"{tmp_path}/checkpoints failed .*resume"):
    trainer.run()
  WorkdirLock(str(tmp_path)).acquire().release()  # the failed run let go of the workdir


@pytest.mark.slow
def test_train_py_exits_with_an_error_when_checkpoints_cannot_be_written(tmp_path):
  workdir = str(tmp_path / "run")
  command = [sys.executable, os.path.join(ROOT, "train.py"),
             "--config=" + os.path.join(ROOT, "configs", "llama_tiny_mxfp4.py"),
             f"--workdir={workdir}", "--config.quant.recipe=bf16", "--config.steps=100000",
             "--config.checkpoint_every=5", "--config.eval_every=0", "--config.log_every=1",
             "--config.progress_bar=False", "--config.batch_size=8", "--config.seq_len=32"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.monotonic() + 240
    while not os.path.isdir(os.path.join(workdir, "checkpoints", "5")):
      assert process.poll() is None and time.monotonic() < deadline
      time.sleep(0.2)
    _break_checkpoint_directory(workdir)
    _, stderr = process.communicate(timeout=60)  # it used to hang here
  finally:
    process.kill()
  assert process.returncode == 1
  assert f"Checkpoint error: Writing a checkpoint to {workdir}/checkpoints failed" in stderr
