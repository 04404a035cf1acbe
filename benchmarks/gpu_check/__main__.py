"""`python -m benchmarks.gpu_check [--dry-run] [--out DIR] [--stages agb] [--total-limit S]`:
the GPU check (see the package docstring).

With --stage, runs one stage in this process (what the parent starts for each stage).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import time
import traceback

HANG_ENV = "LPJAX_GPU_CHECK_HANG"  # rehearsal: stage letters that hang after their first check


def _parse(argv):
  p = argparse.ArgumentParser(
      prog="python -m benchmarks.gpu_check",
      description="Does lpjax work on this GPU, and how fast: stages a-g, run in the order "
                  "a g b c e d f within one total time limit; everything goes to --out.")
  p.add_argument("--dry-run", action="store_true",
                 help="every stage on the CPU, tiny sizes, interpret-mode kernels (about a minute)")
  p.add_argument("--stages", default="abcdefg",
                 help="which stages, e.g. 'gbc' (default: all); they run in the plan's order "
                      "(a g b c e d f) and share the whole --total-limit by their budgets")
  p.add_argument("--out", default=None,
                 help="folder for everything: report.md (rewritten as the check runs), "
                      "<gpu-model>.json, stage_<x>.json (flushed after every entry) and "
                      "stage_<x>.log; default runs/gpu_check (runs/gpu_check_dry for the dry run)")
  p.add_argument("--report", default=None, help="the Markdown report; default <out>/report.md")
  p.add_argument("--total-limit", type=float, default=None,
                 help="seconds for the whole check: the plan's stage budgets are scaled to it "
                      "(default 540 on a GPU, 300 in the dry run); a stage left under 5 s is "
                      "skipped, and the report lists what was skipped for time")
  p.add_argument("--stage", help=argparse.SUPPRESS)  # internal: run this stage module here
  p.add_argument("--letter", default="", help=argparse.SUPPRESS)
  p.add_argument("--result", help=argparse.SUPPRESS)
  p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
  return p.parse_args(argv)


def _run_one(args) -> int:
  from benchmarks.gpu_check import _record
  module = args.stage if "." in args.stage else f"benchmarks.gpu_check.{args.stage}"
  hang = bool(args.letter) and args.letter in os.environ.get(HANG_ENV, "")
  rec = _record.Recorder(args.result, args.stage, deadline=args.deadline, dry_run=args.dry_run,
                         hang=hang)
  try:
    importlib.import_module(module).run(rec, args.dry_run)
  except Exception as e:  # recorded, and the parent goes on with the next stage
    traceback.print_exc()
    rec.data["status"], rec.data["error"] = "fail", f"{type(e).__name__}: {e}"[:2000]
    rec.flush()
    return 1
  failed = rec.data["checks"]["failed"]
  rec.data["status"] = "fail" if failed else "pass"
  if failed:
    rec.data["error"] = f"{failed} check(s) failed: " + "; ".join(
        f["name"] for f in rec.data["failures"][:5])
  rec.flush()
  return 0


class _Writer:
  """Rewrites the report and the JSON in the OUT folder whenever the runner reports a change."""

  def __init__(self, out, report, dry_run, total, plan):
    self.out, self.report, self.dry_run, self.total, self.plan = out, report, dry_run, total, plan
    self.start, self.json_path, self.last = time.time(), None, None

  def __call__(self, results, finished=False):
    from benchmarks.gpu_check import _report
    self.last = results
    check = _report.summarize(results, dry_run=self.dry_run, seconds=time.time() - self.start,
                              total_limit_s=self.total, plan=self.plan, finished=finished)
    json_path, report = _report.write(self.out, check, self.report)
    if self.json_path not in (None, json_path) and os.path.exists(self.json_path):
      os.remove(self.json_path)  # named before stage a knew the device
    self.json_path = json_path
    return check, json_path, report


def main(argv=None) -> int:
  args = _parse(argv)
  if args.stage:
    return _run_one(args)
  from benchmarks.gpu_check import _report, _runner
  stages = [s for s in _runner.STAGES if s.letter in args.stages]
  out = args.out or os.path.join(_runner.ROOT, "runs",
                                 "gpu_check_dry" if args.dry_run else "gpu_check")
  total = args.total_limit or (_runner.DRY_RUN_TOTAL_S if args.dry_run else _runner.PLAN_TOTAL_S)
  plan = "".join(s.letter for s in _runner.in_plan_order(stages))
  writer = _Writer(out, args.report, args.dry_run, total, plan)

  def stop(signum, frame):  # the caller's limit: kill the stage, keep the report as it stands
    _runner.kill_running()
    results = _runner.snapshot()
    if results is not None:
      writer(results)
    print(f"\n[gpu-check] stopped by signal {signum}; partial report: "
          f"{args.report or os.path.join(out, 'report.md')}", flush=True)
    os._exit(128 + signum)

  signal.signal(signal.SIGTERM, stop)
  signal.signal(signal.SIGINT, stop)
  print(f"[gpu-check] plan: stages {' '.join(plan)} within {total:.0f} s; report: "
        f"{args.report or os.path.join(out, 'report.md')}", flush=True)
  results = _runner.run_all(stages, dry_run=args.dry_run, workdir=out, total_limit_s=total,
                            on_update=writer)
  check, json_path, report = writer(results, finished=True)
  print(f"\nJSON: {json_path}\nReport: {report}\n")
  print(_report.summary_table(check))  # last, so it is what a terminal shows
  return 0 if check["passed"] else 1


if __name__ == "__main__":
  sys.exit(main())
