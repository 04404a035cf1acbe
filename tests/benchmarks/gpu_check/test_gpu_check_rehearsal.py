"""Rehearsals of `make gpu-check` on the CPU: what a GPU visit would do, in seconds.

- `make gpu-check DRY_RUN=1 OUT=DIR` through the Makefile, with one stage (the whole dry run,
  every stage, runs in tests/reliability/test_stock_environment.py through the same module).
- The real plan (order a g b c e d f, its budgets scaled to a 120 s total) with the dry run's tiny
  sizes: stage a is forced to hang and is killed at its deadline, the next stage runs, and the
  whole run is then killed (SIGKILL, as a machine's time limit would) in the middle of stage g.
  The report left in OUT must name every case that finished.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_make_gpu_check_dry_run_writes_everything_into_out(tmp_path):
  out = tmp_path / "out"
  proc = subprocess.run(["make", "-s", "gpu-check", "DRY_RUN=1", f"OUT={out}",
                         f"GPU_PY={sys.executable}", "GPU_CHECK_ARGS=--stages a"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert sorted(p.name for p in out.iterdir() if not p.name.startswith("jax_cache")) == [
      "dry-run-cpu.json", "report.md", "stage_a.json", "stage_a.log"]
  report = (out / "report.md").read_text()
  assert "(dry run)" in report and "PARTIAL" not in report
  assert ("Passed (3): a GPU is the default backend; lpjax imports; ml_collections imports "
          "(stage f's configs)") in report
  assert json.loads((out / "dry-run-cpu.json").read_text())["finished"]


def _wait_for(predicate, timeout, what):
  end = time.time() + timeout
  while time.time() < end:
    if predicate():
      return
    time.sleep(0.2)
  raise AssertionError(f"timed out waiting for {what}")


def _read_json(path):
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def test_the_report_comes_back_when_a_stage_hangs_and_when_the_run_is_killed(tmp_path):
  out = tmp_path / "out"
  env = dict(os.environ, LPJAX_GPU_CHECK_HANG="ag",  # each hangs after its first check
             PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
  start = time.time()
  proc = subprocess.Popen([sys.executable, "-m", "benchmarks.gpu_check", "--dry-run",
                           "--total-limit", "120", "--out", str(out)], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  stage_g = out / "stage_g.json"
  try:
    # Stage a hangs: the runner kills it at its deadline (25/540 of 120 s) and starts stage g,
    # which records its first case and hangs too: the run is then killed in the middle of g.
    _wait_for(lambda: (_read_json(stage_g) or {}).get("passed_checks"), 90, "stage g's first case")
    first_g = _read_json(stage_g)["passed_checks"][0]
    _wait_for(lambda: first_g in (out / "report.md").read_text(), 10, "the report to name it")
    proc.kill()  # SIGKILL: no handler runs, as when a machine's time limit ends a call
    os.killpg(_read_json(stage_g)["pid"], signal.SIGKILL)  # the orphaned stage process
  finally:
    if proc.poll() is None:
      proc.kill()
    log = proc.communicate()[0]
  seconds = time.time() - start
  report = (out / "report.md").read_text()
  stage_a = _read_json(out / "stage_a.json")
  # Every case that finished, in any stage, is named in the report left behind.
  finished = stage_a["passed_checks"] + _read_json(stage_g)["passed_checks"]
  assert finished and all(name in report for name in finished), (finished, report)
  for fig in stage_a["figures"]:
    assert fig["name"] in report
  # The hung stage: killed at its scaled budget, reported as such, its figures kept.
  assert re.search(r"\| a environment \| fail \| [0-9.]+ / 6 ", report), report
  assert "stage a: killed at its time limit" in report
  assert "**PARTIAL REPORT**" in report and "Running: g. Not started: b, c, e, d, f." in report
  for letter in "bcdef":
    assert re.search(rf"\| {letter} [^|]* \| not started \|", report), letter
  assert "Plan: stages in the order a, g, b, c, e, d, f within 120 s" in report
  check = json.loads((out / "dry-run-cpu.json").read_text())
  assert not check["finished"] and not check["passed"]
  assert "plan: stages a g b c e d f within 120 s" in log
  print(f"rehearsal: killed after {seconds:.1f} s")


@pytest.mark.parametrize("signum", [signal.SIGTERM])
def test_a_terminated_run_kills_its_stage_and_leaves_the_report(tmp_path, signum):
  """SIGTERM (a polite time limit) stops the running stage and rewrites the report at once."""
  out = tmp_path / "out"
  env = dict(os.environ, LPJAX_GPU_CHECK_HANG="a",
             PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.Popen([sys.executable, "-m", "benchmarks.gpu_check", "--dry-run",
                           "--stages", "a", "--out", str(out)], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    _wait_for(lambda: (_read_json(out / "stage_a.json") or {}).get("passed_checks"), 60,
              "stage a's first case")
    pid = _read_json(out / "stage_a.json")["pid"]
    proc.send_signal(signum)
    log = proc.communicate(timeout=30)[0]
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 128 + signum, log
  assert "partial report" in log
  with pytest.raises(ProcessLookupError):
    os.kill(pid, 0)  # the stage process is gone
  report = (out / "report.md").read_text()
  assert "a GPU is the default backend" in report and "**PARTIAL REPORT**" in report
