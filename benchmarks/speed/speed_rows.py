"""The rows of the speed report's table: each function measures one row and returns
a list of figures {name, value, unit, goal, ok} (ok: True / False, or None where the row only
reports). Used by `speed_report.py`; the fresh-process rows run `speed_child.py`.

Where a ratio is asked, the compared arms run in one process, alternated in rounds (a drift of the
shared machine hits every arm alike) and the ratio is of the medians over rounds; time to the
first step is one fresh process per measurement (nothing cached), the arms alternated.
"""

from __future__ import annotations

import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LLAMA = "configs/llama_tiny_mxfp4.py"  # every arm: its data and optimizer, quant.recipe overridden
LLAMA_1B = "configs/llama_1b_mxfp4.py"  # compile_1b: quant.recipe mxfp4 (its own) or bf16
UNET = "configs/unet_tiny_digits_mxfp4.py"  # recipe mxfp4_e4m3scale: FP4 with E4M3 block scales
XLA_WARNINGS = ("Algebraic simplifier is likely stuck", "Very slow compile")


def figure(name, value, unit, goal, ok):
  """One line of the table."""
  return {"name": name, "value": value, "unit": unit, "goal": goal, "ok": ok}


def child_env() -> dict:
  """The environment of a fresh measuring process: CPU, this checkout first on the path, JAX's
  persistent compilation cache off (nothing reused from another run)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_COMPILATION_CACHE="false",
             PYTHONPATH=os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")]))
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  return env


def steady_step(quick: bool, rounds: int, steps: int) -> list:
  """LLaMA-tiny steady train step of mxfp4 / nvfp4 / quartet against bf16: every arm compiled
  first, then `rounds` rounds of `steps` steps per arm in a rotating order; ratio of medians."""
  import compile_time  # benchmarks/speed/compile_time.py: the trainer's step, timed as it times it
  from timing import interleaved_medians

  arms = ("bf16", "mxfp4", "nvfp4", "quartet")
  batch, seq = (2, 16) if quick else (0, None)  # 0: the config's own (16 x 128)
  timed = {}
  with tempfile.TemporaryDirectory() as tmp:
    for arm in arms:
      _, one_step = compile_time.measure(LLAMA, arm, os.path.join(tmp, arm), batch, seq)
      one_step()  # first-run allocations, untimed
      timed[arm] = lambda one_step=one_step: sum(one_step() for _ in range(steps)) / steps
    med = interleaved_medians(timed, rounds)
  out = [figure("step bf16", med["bf16"] * 1e3, "ms", "", None)]
  for arm, goal in (("mxfp4", 1.35), ("nvfp4", 1.35), ("quartet", 1.5)):
    r = med[arm] / med["bf16"]
    out.append(figure(f"step {arm} / bf16", r, "x", f"<= {goal}x", r <= goal))
  return out


def fp4_formats() -> list:
  """Every registered format with FP4 (E2M1) elements."""
  from lpjax import quant
  return [n for n in quant.FORMAT_NAMES if quant.get_format(n).element.name == "e2m1"]


def fake_quant(quick: bool, rounds: int) -> list:
  """fake_quant throughput of every FP4 format, RTN and SR, against a same-process copy (-x: one
  read and one write of every byte, as fake_quant's), the kernels alternated each round."""
  import jax
  import jax.numpy as jnp
  from lpjax import quant
  from timing import interleaved_medians, median_seconds

  n = 2**16 if quick else 64 * 2**20
  x = jax.random.normal(jax.random.key(0), (n // 4096, 4096), jnp.float32)
  key = jax.random.key(1)
  fns = {"copy": jax.jit(lambda x, k: -x).lower(x, key).compile()}
  for name in fp4_formats():
    for tag, rounding in (("RTN", "nearest_even"), ("SR", "stochastic")):
      fns[f"{name} {tag}"] = jax.jit(
          lambda x, k, f=name, r=rounding: quant.fake_quant(x, f, rounding=r, key=k)
      ).lower(x, key).compile()
  timed = {label: lambda fn=fn: median_seconds(fn, x, key, repeats=1) for label, fn in fns.items()}
  med = interleaved_medians(timed, rounds)
  out = [figure(f"copy, {n} fp32", 8 * n / med["copy"] / 1e9, "GB/s", "", None)]
  for label in fns:
    if label != "copy":
      r = med["copy"] / med[label]  # same bytes read and written: the throughput ratio
      goal = 0.6 if label.endswith("RTN") else 0.5
      out.append(figure(f"fake_quant {label} / copy", r, "x", f">= {goal}x", r >= goal))
  return out


def _first_step_once(config: str, recipe: str, quick: bool) -> float:
  """Wall seconds of a fresh process that starts, builds the trainer, compiles and runs 1 step."""
  cmd = [sys.executable, os.path.join(HERE, "speed_child.py"), "first_step", config, recipe]
  if quick:
    cmd += ["--batch_size=2"] + (["--seq_len=16"] if "llama" in config else [])
  start = time.perf_counter()
  proc = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True)
  wall = time.perf_counter() - start
  if proc.returncode != 0:
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
  return wall


def first_step(quick: bool, rounds: int, models=("llama", "unet")) -> list:
  """Time to the first step (process start, trainer, compile, 1 step) of LLaMA-tiny mxfp4 and the
  U-Net's E4M3-scaled FP4 against bf16: one fresh process each (no compilation cache), the arms
  alternated over `rounds`; ratio of medians."""
  cases = {"llama": (LLAMA, "mxfp4", "LLaMA-tiny mxfp4", 1.5),
           "unet": (UNET, "mxfp4_e4m3scale", "U-Net E4M3 (mxfp4_e4m3scale)", 2.0)}
  out = []
  for model in models:
    config, recipe, label, goal = cases[model]
    times = {"bf16": [], recipe: []}
    for r in range(rounds):
      for arm in (("bf16", recipe) if r % 2 == 0 else (recipe, "bf16")):
        times[arm].append(_first_step_once(config, arm, quick))
    base, quant_s = statistics.median(times["bf16"]), statistics.median(times[recipe])
    out.append(figure(f"first step {model} bf16", base, "s", "", None))
    out.append(figure(f"first step {label} / bf16", quant_s / base, "x", f"<= {goal}x",
                      quant_s / base <= goal))
  return out


_COMPILE_1B = """import json, sys
from cpu_devices import use_virtual_cpu_devices
use_virtual_cpu_devices(8)
import jax
from llama_step import compile_train_step, load_config
c = load_config(sys.argv[1])
c.quant.recipe = sys.argv[2]
if int(sys.argv[3]):
  c.batch_size = int(sys.argv[3])
_, seconds = compile_train_step(c, int(sys.argv[4]), jax.devices()[:8])
print(json.dumps(seconds))
"""


def _compile_1b_once(recipe: str, quick: bool) -> float:
  """Lower + compile seconds of the 1B config's train step with `recipe`, in a fresh process on 8
  virtual CPU devices from abstract inputs (benchmarks/speed/llama_step.py, as llama_memory.py builds
  it: nothing executed)."""
  args = [LLAMA_1B, recipe, "8" if quick else "0", "256" if quick else "32000"]
  proc = subprocess.run([sys.executable, "-c", _COMPILE_1B, *args], cwd=ROOT, env=child_env(),
                        capture_output=True, text=True)
  if proc.returncode != 0:
    raise RuntimeError(f"compile_1b {recipe} failed:\n{proc.stderr[-3000:]}")
  return float(proc.stdout.strip().splitlines()[-1])


def compile_1b(quick: bool, rounds: int) -> list:
  """Compile time of the 1B config's train step (configs/llama_1b_mxfp4.py, 8 CPU devices,
  abstract inputs, lower + compile only) with mxfp4 against its bf16 recipe: one fresh process
  per compile, the arms alternated over `rounds`; ratio of medians."""
  times = {"bf16": [], "mxfp4": []}
  for r in range(rounds):
    for arm in (("bf16", "mxfp4") if r % 2 == 0 else ("mxfp4", "bf16")):
      times[arm].append(_compile_1b_once(arm, quick))
  base, quant_s = statistics.median(times["bf16"]), statistics.median(times["mxfp4"])
  return [figure("compile 1B bf16", base, "s", "", None),
          figure("compile 1B mxfp4 / bf16", quant_s / base, "x", "<= 1.5x", quant_s / base <= 1.5)]


def monitor_compile(quick: bool, every: int = 2) -> list:
  """Compile seconds of the monitor's measured step against the plain train step's, LLaMA-tiny
  mxfp4, in this process (as benchmarks/speed/monitor_overhead.py builds them)."""
  import argparse

  import jax
  import monitor_overhead
  from lpjax.train.loop._trainer import _global_batch

  args = argparse.Namespace(recipe="mxfp4", steps=every, batch_size=2 if quick else 8,
                            seq_len=16 if quick else 128)
  with tempfile.TemporaryDirectory() as tmp:
    t = monitor_overhead.make(args, every, tmp)
    key = jax.random.key(t.config.seed + 1)
    batches = [_global_batch(local, t.batch_sharding) for _, local in t.task.batches(0, every, 0, 1)]
    state = t.init_state()
    t.compiled_train_step(t.precision.policy_at(0), state, batches[0], key)
    plain = t.compile_seconds
    t.monitor.start({}, 0)
    first = every - 1
    policy = t.precision.policy_at(first)
    sites = t.monitor.sites_to_measure(first, state, batches[first], key, policy)
    t.compiled_train_step(policy, state, batches[first], key, sites)
    measured = t.compile_seconds - plain
    t.monitor.finish()
  r = measured / plain
  return [figure("plain step compile", plain, "s", "", None),
          figure("monitor measured step compile / plain", r, "x", "<= 1.25x", r <= 1.25)]


def advise(quick: bool) -> list:
  """`python -m lpjax.advise` on LLaMA-tiny, 2 batches, a fresh process: its CPU seconds
  (getrusage of the child), wall seconds, XLA compiles (all, and those over 1 s), XLA's warnings."""
  with tempfile.TemporaryDirectory() as tmp:
    counts = os.path.join(tmp, "compiles.json")
    cmd = [sys.executable, os.path.join(HERE, "speed_child.py"), "advise", counts,
           f"--config={LLAMA}", "--budget=default", "--batches=2", f"--out={tmp}/advice.txt"]
    if quick:
      cmd += ["--config.batch_size=2", "--config.seq_len=16"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
      raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    with open(counts) as f:
      compiles = json.load(f)
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  warned = parse_xla_warnings(proc.stderr + proc.stdout)
  return [figure("advise CPU", cpu, "s", "<= 60 s", cpu <= 60),
          figure("advise wall", wall, "s", "", None),
          figure("advise XLA compiles (all)", compiles["all"], "", "", None),
          figure("advise XLA compiles over 1 s", compiles["over_1s"], "",
                 "1 per batch shape (not judged here)", None),
          *(figure(f"advise XLA printed '{w}'", int(w in warned), "", "0 (no)", w not in warned)
            for w in XLA_WARNINGS)]


def suite() -> list:
  """Cold `make test`'s pytest command on 2 workers: a fresh clone of HEAD (committed code only),
  an empty compile cache (tests/conftest.py's LPJAX_TEST_CACHE_DIR); minutes, and its exit code."""
  with tempfile.TemporaryDirectory() as tmp:
    repo = os.path.join(tmp, "repo")
    subprocess.run(["git", "clone", "-q", ROOT, repo], check=True)
    env = dict(os.environ, LPJAX_TEST_CACHE_DIR=os.path.join(tmp, "cache"), PYTHONPATH=repo)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile", "-q",
                           "-p", "no:cacheprovider"], cwd=repo, env=env, capture_output=True,
                          text=True)
    minutes = (time.perf_counter() - start) / 60
  tail = (proc.stdout.strip().splitlines() or [""])[-1]
  return [figure("make test cold, 2 workers", minutes, "min", "<= 15 min", minutes <= 15),
          figure(f"make test exit code ({tail[:60]})", proc.returncode, "", "0",
                 proc.returncode == 0)]


def parse_xla_warnings(text: str) -> list:
  """The XLA compile warnings (XLA_WARNINGS) that `text` holds, each once.

  >>> parse_xla_warnings("W1 Very slow compile? ... Very slow compile?")
  ['Very slow compile']
  """
  return [w for w in XLA_WARNINGS if re.search(re.escape(w), text)]
