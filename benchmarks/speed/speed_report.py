"""The speed report: every row of the "where one waits" table, measured in one command,
printed as a markdown table with each figure's goal and whether it meets it.

    python benchmarks/speed/speed_report.py                        # every row but the test suite
    python benchmarks/speed/speed_report.py --rows=fake_quant,monitor_compile --quick
    python benchmarks/speed/speed_report.py --suite --json runs/speed.json --record

Rows (`--rows`, comma-separated; default all but `suite`):
- step: LLaMA-tiny steady train step, mxfp4 / nvfp4 / quartet against bf16 (configs/
  llama_tiny_mxfp4.py, quant.recipe overridden), every arm compiled first, then rounds of `--steps`
  steps per arm in a rotating order; the ratio of the medians over rounds.
- fake_quant: `lpjax.quant.fake_quant` on 64M fp32 elements, RTN and SR, every FP4 (E2M1) format,
  as a throughput ratio to a same-process copy (-x) of the same array, the kernels alternated.
- first_step: time to the first step (process start, trainer, compile, 1 step) of LLaMA-tiny mxfp4
  and the U-Net's E4M3-scaled FP4 (configs/unet_tiny_digits_mxfp4.py) against bf16: one fresh
  process per measurement with JAX's compilation cache off, the arms alternated.
- compile_1b: the 1B config's train step (configs/llama_1b_mxfp4.py, 8 CPU devices, abstract inputs,
  lower + compile only, as benchmarks/memory/llama_memory.py builds it): compile seconds of mxfp4 against
  its bf16 recipe, one fresh process per compile (minutes each).
- monitor_compile: the monitor's measured step's compile against the plain step's (LLaMA-tiny mxfp4).
- advise: `python -m lpjax.advise` on LLaMA-tiny, 2 batches: CPU and wall seconds of the child,
  its XLA compiles, and whether XLA warned of a stuck simplifier or a very slow compile.
- suite (`--suite`, about half an hour): `pytest -n 2 --dist loadfile` in a fresh clone of HEAD
  with an empty compile cache, in minutes.
`--quick` shrinks every size (tiny batches, 64K elements, one round): a check that the report
runs, not a measurement. JAX's persistent compilation cache is off in this process and its
children. `--record [NAME]` writes the figures through benchmarks/common/records.py (default name
speed_report).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS = ("step", "fake_quant", "first_step", "compile_1b", "monitor_compile", "advise", "suite")
DEFAULT_ROWS = ROWS[:-1]


def parse(argv=None):
  sys.path[:0] = [os.path.join(HERE, "..", d)
                  for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/
  from records import add_record_argument
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  p.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                 help=f"comma-separated of {', '.join(ROWS)} (default: all but suite)")
  p.add_argument("--suite", action="store_true", help="add the cold test-suite row (~30 min)")
  p.add_argument("--quick", action="store_true", help="tiny sizes, one round (a smoke check)")
  p.add_argument("--rounds", type=int, default=0,
                 help="alternated rounds per ratio (default 7; first_step 2, i.e. ABBA; --quick 1)")
  p.add_argument("--steps", type=int, default=0, help="train steps per arm per round (default 5)")
  p.add_argument("--json", default="", help="also write the figures to this file (after each row)")
  add_record_argument(p, "speed_report")
  args = p.parse_args(argv)
  rows = [r for r in args.rows.split(",") if r]
  unknown = [r for r in rows if r not in ROWS]
  if unknown:
    p.error(f"unknown rows {unknown}; choose from {', '.join(ROWS)}.")
  if args.suite and "suite" not in rows:
    rows.append("suite")
  args.rows = rows
  return args


def measure_row(row: str, args) -> list:
  import speed_rows as sr
  rounds = args.rounds or (1 if args.quick else 7)
  if row == "step":
    return sr.steady_step(args.quick, rounds, args.steps or (1 if args.quick else 5))
  if row == "fake_quant":
    return sr.fake_quant(args.quick, rounds)
  if row == "first_step":
    return sr.first_step(args.quick, args.rounds or (1 if args.quick else 2))
  if row == "compile_1b":
    return sr.compile_1b(args.quick, args.rounds or 1)
  if row == "monitor_compile":
    return sr.monitor_compile(args.quick)
  if row == "advise":
    return sr.advise(args.quick)
  return sr.suite()


def _number(value, unit) -> str:
  if unit == "x":
    return f"{value:.2f}x"
  if isinstance(value, int):
    return str(value)
  return f"{value:.3g} {unit}".strip() if value < 100 else f"{value:.0f} {unit}".strip()


def table(results: dict) -> str:
  """The markdown table of {row: [figure, ...]}: row, figure, measured, goal, pass.

  >>> print(table({"x": [{"name": "a / b", "value": 0.5, "unit": "x", "goal": ">= 0.6x",
  ...                     "ok": False}]}))
  | row | figure | measured | goal | pass |
  |---|---|---|---|---|
  | x | a / b | 0.50x | >= 0.6x | FAIL |
  """
  lines = ["| row | figure | measured | goal | pass |", "|---|---|---|---|---|"]
  for row, figures in results.items():
    for f in figures:
      verdict = {True: "pass", False: "FAIL", None: ""}[f["ok"]]
      lines.append(f"| {row} | {f['name']} | {_number(f['value'], f['unit'])} | {f['goal']} | "
                   f"{verdict} |")
  return "\n".join(lines)


def record_figures(results: dict) -> dict:
  """{row_figure: value} with names a record accepts (lower-case letters, digits, '_')."""
  out = {}
  for row, figures in results.items():
    for f in figures:
      name = re.sub(r"[^a-z0-9]+", "_", f"{row} {f['name']}".lower()).strip("_")
      if isinstance(f["value"], (int, float)) and math.isfinite(f["value"]):
        out[name] = f["value"]
  return out


def main(argv=None) -> int:
  args = parse(argv)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"  # before jax is imported
  os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
  import jax
  from timing import allocator
  load = os.getloadavg()
  header = (f"jax {jax.__version__}, {jax.devices()[0].platform}, {os.cpu_count()} CPUs, load "
            f"average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min) at the start, "
            f"{allocator()}{', --quick (not a measurement)' if args.quick else ''}")
  print(header, flush=True)
  results = {}
  for row in args.rows:
    start = time.time()
    results[row] = measure_row(row, args)
    print(f"{row}: {time.time() - start:.0f} s, load {os.getloadavg()[0]:.1f}", file=sys.stderr,
          flush=True)
    if args.json:
      os.makedirs(os.path.dirname(os.path.abspath(args.json)) or ".", exist_ok=True)
      with open(args.json, "w") as f:
        json.dump({"header": header, "rows": results, "load_end": os.getloadavg()}, f, indent=2)
  load_end = os.getloadavg()
  print(table(results))
  print(f"load average at the end: {load_end[0]:.1f} / {load_end[1]:.1f} / {load_end[2]:.1f}")
  if args.record:
    from records import write_record
    path = write_record(args.record, record_figures(results),
                        notes=f"{header}; load at the end {load_end[0]:.1f}")
    print(f"record: {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
