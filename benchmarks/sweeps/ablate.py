"""Ablation sweeps: trains each row of a named sweep over several seeds and reports mean ± std.

    python benchmarks/sweeps/ablate.py --list
    python benchmarks/sweeps/ablate.py format --out results/ablate --dry-run     # rows, commands, time
    python benchmarks/sweeps/ablate.py format --out results/ablate               # CPU: LLaMA-tiny, 3 seeds
    python benchmarks/sweeps/ablate.py all --out results/ablate                  # every sweep + the goals
    python benchmarks/sweeps/ablate.py quality --out results/ablate --scale paper --size 60m \\
        --set data.tokenizer=/path/to/t5/spiece.model                     # GPUs, C4

Sweeps (benchmarks/sweeps/ablate_sweeps.py): format, scale_format, grad_rounding, granularity, gemms,
operands, optimizer, schedule, block_size, recipes, memory, quality (exactly the rows of the issue's
quality goals), or all.
Every sweep includes the reference row fp32_adam (FP32 GEMMs, Adam) and reports each row's final
eval loss relative to it, at equal steps.

Each (row, seed) trains in DIR/runs/<sweep>/<row>/seed<k> through lpjax.train.Trainer
(in-process; --jobs N runs N at once in spawned processes, for many-core CPUs: each process sees
every device and JAX preallocates most of a GPU's memory, so use one job on a GPU). A run whose
results.json (or failed.json) exists is skipped, so an interrupted sweep resumes by running the
same command; a run whose config equals one already finished in another sweep copies that run's
results instead of training again (the reference row trains once per seed). A run that raises
(e.g. TrainingError after too many non-finite steps) is recorded in failed.json and the sweep goes
on; --retry-failed runs those again. --report-only writes the tables and plots of the runs
finished so far (missing runs count as not run), e.g. while a sweep is still training.
--only-seeds 1,2 trains only those seeds (the rows whose seed 0 ran elsewhere get their others).

Every run records the machine it ran on (benchmarks/common/run_machine.py: CPU model, cores, GPUs, jax
versions, XLA flags): the same config and seed train to different losses on two machines, so runs
are reused only from the same machine, and the report leaves out (and names) a run whose machine is
not that of the reference row's run of the same seed. A sweep resumed on another machine keeps its
finished runs; --rerun-other-machines trains them again here (the old ones are kept beside, as
<workdir>.other-machine).

Writes DIR/<sweep>.md (table: row, recipe, optimizer, lr, final eval loss mean ± std, eval loss
with quantization off, % vs FP32 Adam, wall time, seeds; the train.py command of every row),
DIR/<sweep>.json (every number), DIR/<sweep>_curves.png, DIR/<sweep>_final.png, and for the
quality sweep DIR/quality_goals.md (goal / measured / holds).

CPU scale: configs/llama_tiny_bf16.py (300 steps of 16 x 128 byte tokens on the offline corpus,
lr 3e-3). Paper scale: configs/llama_<--size>_bf16.py (C4 en, T5 tokenizer: give data.tokenizer
with --set). Each row then sets its recipe and optimizer.
--steps N shortens every run (the lr warm-up keeps its share); --set key=value changes any config
field of every run (e.g. --set batch_size=8).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", d)
                for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/

import ablate_report as report  # noqa: E402
import ablate_runs as run_records  # noqa: E402
from ablate_runs import same_run  # noqa: E402,F401  (public: tests, scripts)
import ablate_sweeps as sweeps  # noqa: E402
import run_machine  # noqa: E402
from ablate_sweeps import REFERENCE, SWEEPS, Row  # noqa: E402

# Wall time of one 300-step LLaMA-tiny run (compile included) on the 2-core CPU machine this was
# written on, shared with other jobs (load average 8-9): bf16 + Adam 149 s, fp32 + Adam 211 s,
# mxfp4 + Adam 268 s and 337 s; 20-step runs took ~25 s (fp32) and ~55 s (mxfp4:gemms=fwd), mostly
# compiling. Model: (fixed seconds, seconds per step); other quantized recipes cost as much as mxfp4.
CPU_RUN_COST = {"high_precision": (25.0, 0.52), "quantized": (50.0, 0.83)}
CPU_STEPS = 300


@dataclasses.dataclass(frozen=True)
class Task:
  sweep: str  # sweep name
  row: Row  # the row
  seed: int  # config.seed
  workdir: str  # DIR/runs/<sweep>/<row>/seed<k>


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("sweep", nargs="?", help=f"one of {', '.join(SWEEPS)}, or all")
  p.add_argument("--out", help="output directory (runs, tables, plots)")
  p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per row")
  p.add_argument("--only-seeds", default="", metavar="LIST",
                 help="train only these of the seeds 0..N-1, e.g. 1,2 (fills in the seeds a sweep "
                      "lacks; the report still covers every seed)")
  p.add_argument("--steps", type=int, default=0, help="steps per run (0: the size's paper setting)")
  p.add_argument("--scale", choices=("cpu", "paper"), default="cpu",
                 help="cpu: LLaMA-tiny on the offline corpus; paper: --size on C4 (GPUs)")
  p.add_argument("--size", default="60m", help="model size at --scale paper (60m, 130m, 350m, 1b)")
  p.add_argument("--rows", default="", help="comma-separated row labels to run (the reference is kept)")
  p.add_argument("--skip-reference", action="store_true",
                 help="with --rows: do not train the FP32 Adam reference (rows are compared with "
                      "each other; the tables' ratios need it from another invocation)")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="config override for every run, e.g. --set batch_size=8 (repeatable)")
  p.add_argument("--jobs", type=int, default=1, help="runs at once (separate processes)")
  p.add_argument("--list", action="store_true", help="list the sweeps and their rows")
  p.add_argument("--dry-run", action="store_true", help="print every run's config and the estimate")
  p.add_argument("--retry-failed", action="store_true", help="run again the runs in failed.json")
  p.add_argument("--rerun-other-machines", action="store_true",
                 help="train again (here) the finished runs recorded on another machine; the old "
                      "ones are kept as <workdir>.other-machine")
  p.add_argument("--keep-checkpoints", action="store_true", help="keep each run's checkpoints")
  p.add_argument("--report-only", action="store_true",
                 help="write the tables and plots from the runs finished so far; train nothing")
  args = p.parse_args(argv)
  if not args.list:
    if args.sweep not in tuple(SWEEPS) + ("all",):
      p.error(f"SWEEP must be one of {', '.join(SWEEPS)}, all (got {args.sweep!r}); see --list.")
    if not args.out:
      p.error("--out DIR is required.")
  if args.skip_reference and not args.rows:
    p.error("--skip-reference needs --rows (the rows to train without the FP32 Adam reference).")
  if args.seeds < 1 or args.jobs < 1 or args.steps < 0:
    p.error("--seeds and --jobs must be >= 1 and --steps >= 0.")
  try:
    args.only_seeds = sorted({int(k) for k in args.only_seeds.split(",") if k.strip()})
  except ValueError:
    p.error(f"--only-seeds takes comma-separated integers, e.g. 1,2 (got {args.only_seeds!r}).")
  outside = [k for k in args.only_seeds if not 0 <= k < args.seeds]
  if outside:
    p.error(f"--only-seeds {outside} outside the seeds 0..{args.seeds - 1}: raise --seeds.")
  args.size = "tiny" if args.scale == "cpu" else args.size
  try:
    args.sets = sweeps.parse_sets(args.set)
  except ValueError as e:
    p.error(str(e))
  return args


def sweep_rows(name: str, only: str = "") -> list[Row]:
  rows = SWEEPS[name]
  if not only:
    return list(rows)
  wanted = [w.strip() for w in only.split(",") if w.strip()]
  unknown = [w for w in wanted if w not in {r.label for r in rows}]
  if unknown:
    raise SystemExit(f"--rows: {', '.join(unknown)} not in sweep {name!r}; its rows: "
                     f"{', '.join(r.label for r in rows)}.")
  return [r for r in rows if r.label == REFERENCE.label or r.label in wanted]


def config_of(task: Task, args):
  return sweeps.row_config(task.row, size=args.size, seed=task.seed, steps=args.steps or None,
                           sets=args.sets)


def run_key(config) -> str:
  """Identical keys train identically (progress_bar does not change the run)."""
  values = {k: v for k, v in sweeps.flat(config).items() if k != "progress_bar"}
  return json.dumps(values, sort_keys=True, default=str)


def _check_same_config(task: Task, key: str):
  recorded = run_records.recorded(task.workdir)
  if recorded and not same_run(recorded["key"], key):
    raise SystemExit(f"{task.workdir} was trained with another config (other --steps, --set or "
                     "sweep definition); use another --out directory, or delete that run.")


def _reuse(task: Task, source: str, key: str):
  os.makedirs(task.workdir, exist_ok=True)
  for name in ("results.json", "failed.json", "metrics.jsonl"):
    if os.path.exists(os.path.join(source, name)):
      shutil.copy(os.path.join(source, name), os.path.join(task.workdir, name))
  run_records.write_run_json(task, key, run_records.recorded(source).get("machine"),
                             {"reused_from": os.path.relpath(source, task.workdir)})


def run_task(task: Task, args) -> dict:
  """Trains one (row, seed) in its workdir; a raised error goes to failed.json."""
  import jax

  from lpjax.train import Trainer, use_compilation_cache

  # Seeds of a row compile the same programs: the persistent cache compiles them once.
  cache = os.environ.get("LPJAX_JAX_CACHE_DIR")
  if cache:
    use_compilation_cache(cache)
  else:
    use_compilation_cache()
  config = config_of(task, args)
  run_records.write_run_json(task, run_key(config), run_machine.fingerprint())
  failed = os.path.join(task.workdir, "failed.json")
  if os.path.exists(failed):
    os.remove(failed)
  start = time.time()
  results = {}
  try:
    results = Trainer(config, task.workdir).run()
  except Exception as e:  # noqa: BLE001  (any failure is a result of the ablation)
    results = {"error": f"{type(e).__name__}: {e}"}
    with open(failed, "w") as f:
      json.dump({"type": type(e).__name__, "error": str(e), "wall_time_s": time.time() - start}, f,
                indent=1)
  finally:
    if not args.keep_checkpoints and not results.get("stopped"):  # a stopped run resumes from it
      shutil.rmtree(os.path.join(task.workdir, "checkpoints"), ignore_errors=True)
    jax.clear_caches()  # each run compiles its own steps; do not keep them all
  results["elapsed_s"] = time.time() - start
  return results


def _estimate_seconds(rows_to_run, args) -> float | None:
  if args.scale != "cpu":
    return None  # never measured at paper scale
  from lpjax.quant import recipes

  total = 0.0
  for row in rows_to_run:
    kind = "high_precision" if recipes.get(row.recipe).is_high_precision else "quantized"
    fixed, per_step = CPU_RUN_COST[kind]
    total += fixed + per_step * (args.steps or CPU_STEPS)
  return total


def _run_seconds(kind: str, steps: int = CPU_STEPS) -> float:
  fixed, per_step = CPU_RUN_COST[kind]
  return fixed + per_step * steps


def _hms(seconds):
  if seconds is None:
    return "unknown at this scale"
  h, m = divmod(int(seconds) // 60, 60)
  return f"{h} h {m:02d} min" if h else f"{m} min {int(seconds) % 60:02d} s"


def plan(args):
  """(sweep names, all tasks, tasks to train, tasks to copy from an identical run)."""
  names = list(SWEEPS) if args.sweep == "all" else [args.sweep]
  tasks = []
  seeds = args.only_seeds or range(args.seeds)
  for seed in seeds:  # seed-major: every row gets a first seed early
    for name in names:
      for row in sweep_rows(name, args.rows):
        if args.skip_reference and row.label == REFERENCE.label:
          continue
        tasks.append(Task(name, row, seed, os.path.join(args.out, "runs", name, row.label, f"seed{seed}")))
  here = run_machine.fingerprint()
  index = run_records.finished_index(args.out, args.retry_failed, here)
  to_run, to_copy, planned = [], [], {}
  for task in tasks:
    key = run_key(config_of(task, args))
    if run_records.is_done(task.workdir, args.retry_failed):
      _check_same_config(task, key)
      machine = run_records.recorded(task.workdir).get("machine")
      if run_machine.same_machine(machine, here):
        continue
      if not args.rerun_other_machines:
        print(f"note: {task.workdir} ran on another machine ({run_machine.describe(machine)}); "
              "the report compares it only with a reference run from that machine "
              "(--rerun-other-machines trains it again here).")
        continue
      moved = ("(dry run: not moved)" if args.dry_run
               else f"moved to {run_records.set_aside(task.workdir)}")
      print(f"{task.workdir} ran on another machine: trained again, the old run {moved}")
    if key in index:
      to_copy.append((task, index[key], key))
    elif key in planned:  # the same config earlier in this plan: copy after it has run
      to_copy.append((task, planned[key].workdir, key))
    else:
      planned[key] = task
      to_run.append(task)
  return names, tasks, to_run, to_copy


def print_plan(args, names, tasks, to_run, to_copy, verbose: bool):
  from lpjax.train import config as cfg_lib

  for name in names:
    print(f"\n== {name}: {len(sweep_rows(name, args.rows))} rows x {args.seeds} seeds "
          f"({args.scale} scale, LLaMA-{args.size})")
    for row in sweep_rows(name, args.rows):
      config = sweeps.row_config(row, size=args.size, seed=0, steps=args.steps or None, sets=args.sets)
      overrides = dict(row.overrides)
      print(f"  {row.label:<24} recipe={row.recipe} optimizer={row.optimizer} "
            f"lr={config.optimizer.lr:g} overrides={overrides}")
      if verbose:
        try:
          cfg_lib.validate(config, device_count=1)
        except cfg_lib.ConfigError as e:
          print(f"    INVALID: {e}")
        workdir = os.path.join(args.out, "runs", name, row.label, "seed0")
        print(f"    {sweeps.reproduce_command(config, args.size, workdir)}")
  done = len(tasks) - len(to_run) - len(to_copy)
  estimate = _estimate_seconds([t.row for t in to_run], args)
  print(f"\n{len(tasks)} runs: {len(to_run)} to train, {len(to_copy)} copied from identical runs, "
        f"{done} already done. Estimated time: {_hms(estimate)}"
        + (f" (measured on 2 busy CPU cores: ~{_run_seconds('high_precision'):.0f} s per "
           f"high-precision and ~{_run_seconds('quantized'):.0f} s per quantized {CPU_STEPS}-step "
           f"run; --jobs {args.jobs} not counted)" if estimate is not None else "") + ".")


def execute(args, to_run, to_copy):
  pending_copies = list(to_copy)

  def copy_ready():
    for item in list(pending_copies):
      task, source, key = item
      if run_records.is_done(source, args.retry_failed):
        _reuse(task, source, key)
        pending_copies.remove(item)

  copy_ready()
  start, done = time.time(), 0

  def report_progress(task, results):
    nonlocal done
    done += 1
    elapsed = time.time() - start
    eta = elapsed / done * (len(to_run) - done)
    loss = results.get("final_eval_loss")
    what = f"eval loss {loss:.4f}" if isinstance(loss, float) else results.get("error", "?")
    print(f"[{done}/{len(to_run)}] {task.sweep}/{task.row.label}/seed{task.seed}: {what} "
          f"({results['elapsed_s']:.0f} s); remaining ~{_hms(eta)}", flush=True)
    copy_ready()

  if args.jobs == 1:
    for task in to_run:
      results = run_task(task, args)
      if results.get("stopped"):  # SIGTERM / SIGINT: the run checkpointed; stop the sweep too
        print(f"{task.sweep}/{task.row.label}/seed{task.seed}: stopped by signal "
              f"{results.get('signal')}; the same command resumes the sweep.", flush=True)
        sys.exit(128 + int(results.get("signal") or 15))
      report_progress(task, results)
  else:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
      futures = {pool.submit(run_task, task, args): task for task in to_run}
      for future in as_completed(futures):
        report_progress(futures[future], future.result())
  copy_ready()


def collect(args, name: str) -> dict:
  """The summary of sweep `name` from the runs on disk (missing runs count as not run)."""
  rows = []
  for row in sweep_rows(name, args.rows):
    runs = []
    for seed in range(args.seeds):
      workdir = os.path.join(args.out, "runs", name, row.label, f"seed{seed}")
      runs.append({**report.load_run(workdir), "seed": seed})
    config = sweeps.row_config(row, size=args.size, seed=0, steps=args.steps or None, sets=args.sets)
    command = sweeps.reproduce_command(config, args.size, f"runs/ablate/{name}/{row.label}")
    rows.append({"label": row.label, "recipe": row.recipe, "optimizer": row.optimizer,
                 "lr": config.optimizer.lr, "overrides": [list(o) for o in row.overrides],
                 "command": command, "runs": runs})
  meta = {"description": sweeps.DESCRIPTIONS.get(name, ""), "scale": args.scale, "size": args.size,
          "steps": config.steps, "seeds": list(range(args.seeds))}
  return report.summarize(name, rows, REFERENCE.label, meta)


def write_all(args, names) -> list[dict]:
  goals = []
  for name in names:
    summary = collect(args, name)
    paths = report.write_reports(summary, args.out)
    print(f"\n{report.markdown(summary)}\nwrote {', '.join(paths.values())}")
    if name == "quality":
      goals = report.quality_goals({r["label"]: r for r in summary["rows"]})
      text = report.quality_markdown(goals)
      with open(os.path.join(args.out, "quality_goals.md"), "w") as f:
        f.write(text)
      print("\n" + text)
  return goals


def main(argv=None):
  args = parse_args(argv)
  if args.list:
    for name, rows in SWEEPS.items():
      print(f"{name}: {sweeps.DESCRIPTIONS.get(name, '')}")
      for row in rows:
        extra = f" lr x{row.lr_scale:g}" if row.lr_scale != 1 else ""
        extra += "".join(f" {k}={v}" for k, v in row.overrides)
        print(f"  {row.label:<24} {row.recipe} + {row.optimizer}{extra}")
    return 0
  if args.report_only:
    write_all(args, [args.sweep] if args.sweep != "all" else list(SWEEPS))
    return 0
  names, tasks, to_run, to_copy = plan(args)
  print_plan(args, names, tasks, to_run, to_copy, verbose=args.dry_run)
  if args.dry_run:
    return 0
  execute(args, to_run, to_copy)
  write_all(args, names)
  return 0


if __name__ == "__main__":
  sys.exit(main())
