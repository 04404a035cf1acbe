"""`python -m benchmarks.gpu_check [--dry-run]`: the GPU check (see the package docstring).

With --stage, runs one stage in this process (what the parent starts for each stage).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback


def _parse(argv):
  p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check",
                              description="Does lpjax work on this GPU, and how fast: stages a-g.")
  p.add_argument("--dry-run", action="store_true",
                 help="every stage on the CPU, tiny sizes, interpret-mode kernels (< 2 minutes)")
  p.add_argument("--stages", default="abcdefg", help="which stages, e.g. 'abc' (default: all)")
  p.add_argument("--out", default=None,
                 help="folder for the JSON result, the stage logs and (dry run) the report; "
                      "default runs/gpu_check (runs/gpu_check_dry for the dry run)")
  p.add_argument("--report", default=None,
                 help="the Markdown report; default docs/results/gpu/<gpu-model>.md on a GPU, "
                      "<out>/report.md in the dry run")
  p.add_argument("--total-limit", type=float, default=None,
                 help="seconds for the whole check (default 600; 300 for the dry run)")
  p.add_argument("--stage", help=argparse.SUPPRESS)  # internal: run this stage module here
  p.add_argument("--result", help=argparse.SUPPRESS)
  p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
  return p.parse_args(argv)


def _run_one(args) -> int:
  from benchmarks.gpu_check import _record
  module = args.stage if "." in args.stage else f"benchmarks.gpu_check.{args.stage}"
  rec = _record.Recorder(args.result, args.stage, deadline=args.deadline, dry_run=args.dry_run)
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


def main(argv=None) -> int:
  args = _parse(argv)
  if args.stage:
    return _run_one(args)
  from benchmarks.gpu_check import _report, _runner
  stages = [s for s in _runner.STAGES if s.letter in args.stages]
  out = args.out or os.path.join(_runner.ROOT, "runs",
                                 "gpu_check_dry" if args.dry_run else "gpu_check")
  total = args.total_limit or (300 if args.dry_run else _runner.TOTAL_LIMIT_S)
  start = time.time()
  results = _runner.run_all(stages, dry_run=args.dry_run, workdir=out, total_limit_s=total)
  check = _report.summarize(results, dry_run=args.dry_run, seconds=time.time() - start)
  json_path = os.path.join(out, _report.file_stem(check) + ".json")
  with open(json_path, "w") as f:
    json.dump(check, f, indent=1, default=str)
  report = args.report or (os.path.join(out, "report.md") if args.dry_run else os.path.join(
      _runner.ROOT, "docs", "results", "gpu", _report.file_stem(check) + ".md"))
  os.makedirs(os.path.dirname(os.path.abspath(report)), exist_ok=True)
  with open(report, "w") as f:
    f.write(_report.markdown(check))
  print(f"\nJSON: {json_path}\nReport: {report}\n")
  print(_report.summary_table(check))  # last, so it is what a terminal shows
  return 0 if check["passed"] else 1


if __name__ == "__main__":
  sys.exit(main())
