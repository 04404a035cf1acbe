"""Stage f: whole LLaMA train steps. Tokens/s per recipe (bf16, mxfp4, nvfp4, quartet: the same
config, optimizer and batch, only `quant.recipe` differs), compile time, and peak device memory
from the device's own statistics (`memory_stats()["peak_bytes_in_use"]`, not XLA's estimate),
LLaMA-60M and 130M; then the 1B config's step on one device with the largest microbatch that
fits (tried from large to small; out of memory moves to the next).

Each run is its own process (`python -m benchmarks.gpu_check.steps SPEC RESULT`): the peak is
that run's alone, and an out-of-memory error cannot spoil the next run. The step is the trainer's
(benchmarks/speed/llama_step.py's setup, with a real state and random tokens instead of a dataset).
This stage's own process never starts a JAX backend, so it holds no device memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEP_GOAL = 1.3  # MXFP4 step <= 1.3x the bf16 step (issue 38)
# The share of device memory each run's JAX may take. JAX preallocates 75% by default, which would
# cap the 1B largest-microbatch search at three quarters of the GPU; a value already in the
# environment wins. Recorded in every row.
MEM_FRACTION = "0.95"


def mem_fraction() -> str:
  return os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION") or MEM_FRACTION


def plan(dry_run: bool):
  """(compared runs in priority order, 1B microbatch candidates, the 1B spec without a batch)."""
  if dry_run:
    tiny = dict(config="configs/llama_tiny_mxfp4.py", size="tiny", batch=4, seq_len=32, vocab=512,
                steps=2)
    return ([dict(tiny, recipe="bf16"), dict(tiny, recipe="mxfp4")], (4,),
            dict(tiny, recipe="mxfp4", size="tiny (1B stand-in)"))
  m60 = dict(config="configs/llama_60m_mxfp4.py", size="60m", batch=512, seq_len=256,
             vocab=32000, steps=5)
  m130 = dict(m60, config="configs/llama_130m_mxfp4.py", size="130m")
  first = [dict(m60, recipe="bf16"), dict(m60, recipe="mxfp4"), dict(m130, recipe="bf16"),
           dict(m130, recipe="mxfp4")]
  later = [dict(m, recipe=r) for m in (m60, m130) for r in ("nvfp4", "quartet")]
  one_b = dict(config="configs/llama_1b_mxfp4.py", size="1b", recipe="mxfp4", seq_len=256,
               vocab=32000, steps=3)
  return first + [None] + later, (64, 32, 16, 8, 4), one_b  # None: where the 1B search runs


def _load_config(path):
  sys.path[:0] = [os.path.join(os.path.join(ROOT, "benchmarks"), d)
                  for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/
  from llama_step import load_config
  return load_config(os.path.join(ROOT, path))


def build_step(spec: dict):
  """(jitted train step(state, batch, key), state, batch, key) of `spec` on the first device;
  the state is initialized for real, or only described (ShapeDtypeStructs) with `abstract`."""
  import functools

  import jax
  import numpy as np

  from lpjax.models import llama
  from lpjax.train.step import _sharding as shd
  from lpjax.train import config as cfg_lib
  from lpjax.train.step._optimizers import make_optimizer
  from lpjax.train.step._precision import build_policy
  from lpjax.train.step._step import init_state, make_train_step
  from lpjax.train.tasks.lm import llama_config_of, lm_loss

  config = _load_config(spec["config"])
  with config.unlocked():
    config.quant.recipe = spec["recipe"]
    # Random tokens: no dataset, no tokenizer file (the configs name C4 and T5's SentencePiece).
    config.data.source, config.data.tokenizer, config.data.tfds_name = "embedded", "byte", ""
    config.model.vocab_size = spec["vocab"]
    config.batch_size, config.seq_len, config.grad_accum_steps = spec["batch"], spec["seq_len"], 1
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 1, 1
  config = cfg_lib.validate(config, 1)
  mesh = shd.make_mesh(1, 1, 1, jax.devices()[:1])
  model_cfg = llama_config_of(config, spec["vocab"])
  policy = build_policy(config)
  graphdef, _ = llama.abstract_model(model_cfg, policy)
  tx = make_optimizer(config, stacked_layers=functools.partial(
      llama.stacked_layers, model_cfg, policy=policy))

  def init(key):
    return init_state(llama.init_params(model_cfg, key, policy), None, tx,
                      loss_scale=config.quant.loss_scale)

  key = jax.random.key(0)
  abstract = jax.eval_shape(init, key)
  shardings = shd.tree_shardings(abstract, mesh, llama.PARTITION_RULES)
  shape = (spec["batch"], spec["seq_len"])
  if spec.get("abstract"):
    state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                         abstract, shardings)
    tokens = jax.ShapeDtypeStruct(shape, np.int32, sharding=shd.batch_sharding(mesh))
    batch = {"inputs": tokens, "targets": tokens}
  else:
    state = jax.jit(init, out_shardings=shardings)(key)
    tokens = np.random.default_rng(0).integers(0, spec["vocab"], (shape[0], shape[1] + 1))
    batch = jax.device_put({"inputs": tokens[:, :-1].astype(np.int32),
                            "targets": tokens[:, 1:].astype(np.int32)}, shd.batch_sharding(mesh))

  def loss_fn(params, model_state, batch, key, step_policy):  # the LM task's loss
    loss = lm_loss(graphdef, model_cfg, config.model.vocab_chunks, params, batch, step_policy, key)
    return loss, (model_state, {})

  step = make_train_step(loss_fn, tx, grad_accum_steps=1,
                         param_rounding=config.optimizer.param_rounding,
                         grad_accum_dtype=config.grad_accum_dtype)

  def traced_step(s, b, k):
    with shd.step_hints(mesh, gather_quantized_weights=config.quant.gather_quantized_weights):
      return step(s, b, k, None)

  return jax.jit(traced_step, donate_argnums=(0,)), state, batch, key


def measure(spec: dict) -> dict:
  """Compiles and times the train step of `spec` on the first device (see the module docstring)."""
  import statistics

  import jax

  step, state, batch, key = build_step(spec)
  start = time.perf_counter()
  lowered = step.lower(state, batch, key)  # tracing the model: Python time, any backend
  lower_s = time.perf_counter() - start
  compiled = lowered.compile()
  compile_s = time.perf_counter() - start - lower_s
  run_start = time.perf_counter()
  state, metrics = compiled(state, batch, key)  # warm-up
  jax.block_until_ready(state)
  times = []
  for i in range(spec["steps"]):
    start = time.perf_counter()
    state, metrics = compiled(state, batch, jax.random.fold_in(key, i))
    jax.block_until_ready(state)
    times.append(time.perf_counter() - start)
  run_s = time.perf_counter() - run_start  # the warm-up and the timed steps
  step_s = statistics.median(times)
  stats = getattr(jax.devices()[0], "memory_stats", lambda: None)() or {}
  loss = float(jax.device_get(metrics["loss"])) if "loss" in metrics else None
  return dict(spec, ok=True, lower_s=lower_s, compile_s=compile_s, step_s=step_s, run_s=run_s,
              mem_fraction=os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
              tokens_per_s=spec["batch"] * spec["seq_len"] / step_s, loss=loss,
              peak_bytes=stats.get("peak_bytes_in_use"), bytes_limit=stats.get("bytes_limit"))


def run_one(spec: dict, timeout_s: float, workdir: str) -> dict:
  """`measure(spec)` in a fresh process, killed after `timeout_s`."""
  path = os.path.join(workdir, f"run_{spec['size']}_{spec['recipe']}_{spec['batch']}.json".replace(
      " ", "_").replace("/", "_"))
  cmd = [sys.executable, "-m", "benchmarks.gpu_check.steps", json.dumps(spec), path]
  env = dict(os.environ, XLA_PYTHON_CLIENT_MEM_FRACTION=mem_fraction())
  try:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                          env=env)
  except subprocess.TimeoutExpired:
    return dict(spec, ok=False, timed_out=True, error=f"not finished within {timeout_s:.0f} s")
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
    return dict(spec, ok=False, error=f"exit code {proc.returncode}: {tail}"[:800])


def _out_of_memory(result: dict) -> bool:
  text = result.get("error", "")
  return any(s in text for s in ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "OOM"))


def _row(rec, r: dict) -> None:
  gib = (lambda b: None if b is None else b / 2**30)
  rec.row("steps", size=r["size"], recipe=r["recipe"], batch=r["batch"], seq_len=r["seq_len"],
          ok=r.get("ok", False), tokens_per_s=r.get("tokens_per_s"),
          step_ms=None if r.get("step_s") is None else r["step_s"] * 1e3,
          trace_lower_s=r.get("lower_s"), compile_s=r.get("compile_s"),
          peak_device_gib=gib(r.get("peak_bytes")), limit_gib=gib(r.get("bytes_limit")),
          mem_fraction=r.get("mem_fraction", mem_fraction()), error=r.get("error", ""))
  rec.add_time(compile_s=(r.get("lower_s") or 0) + (r.get("compile_s") or 0),
               run_s=r.get("run_s") or 0)


def run(rec, dry_run: bool) -> None:
  workdir = os.path.dirname(os.path.abspath(rec.path))
  rec.note(f"each run is its own process with XLA_PYTHON_CLIENT_MEM_FRACTION={mem_fraction()} "
           "(JAX's default preallocation is 75% of the device); compile_s and trace_lower_s are "
           "apart from step_ms")
  cap = 120 if dry_run else 200  # one run: a compile and a few steps
  compared, candidates, one_b = plan(dry_run)
  results = []
  for spec in compared:
    if spec is None:  # the 1B search, between the headline runs and the rest
      _largest_microbatch(rec, one_b, candidates, cap, workdir)
      continue
    if rec.out_of_time(f"{spec['size']} {spec['recipe']}"):
      continue
    timeout = min(cap, max(rec.time_left(), 1))
    r = run_one(spec, timeout, workdir)
    _row(rec, r)
    if _stopped_by_deadline(rec, r, timeout, cap, f"{spec['size']} {spec['recipe']}"):
      continue
    rec.check(f"{spec['size']} {spec['recipe']} step", r.get("ok", False), r.get("error", ""))
    results.append(r)
  if dry_run:
    _largest_microbatch(rec, one_b, candidates, cap, workdir)
  by = {(r["size"], r["recipe"]): r for r in results if r.get("ok")}
  for size in dict.fromkeys(r["size"] for r in results):
    base = by.get((size, "bf16"))
    for recipe in ("mxfp4", "nvfp4", "quartet"):
      r = by.get((size, recipe))
      if base and r:
        ratio = r["step_s"] / base["step_s"]
        goal = recipe == "mxfp4"
        rec.figure(f"{size} {recipe} step", ratio, "x bf16",
                   goal=f"<= {STEP_GOAL}x" if goal else None,
                   met=(ratio <= STEP_GOAL) if goal and not dry_run else None)


def _stopped_by_deadline(rec, r: dict, timeout: float, cap: float, what: str) -> bool:
  """A run cut off by the stage's deadline (not by its own cap) is skipped for time, not failed."""
  if not (r.get("timed_out") and timeout < cap):
    return False
  rec.data["cut_short"].append(f"{what} (stopped at the stage's deadline after {timeout:.0f} s)")
  rec.flush()
  return True


def _largest_microbatch(rec, spec, candidates, cap, workdir) -> None:
  for batch in candidates:
    if rec.out_of_time(f"{spec['size']} microbatch {batch}"):
      return
    timeout = min(cap, max(rec.time_left(), 1))
    r = run_one(dict(spec, batch=batch), timeout, workdir)
    _row(rec, r)
    if _stopped_by_deadline(rec, r, timeout, cap, f"{spec['size']} microbatch {batch}"):
      return
    if r.get("ok"):
      rec.figure(f"{spec['size']} largest microbatch on one device", batch,
                 f"x {spec['seq_len']} tokens, {r['tokens_per_s']:.0f} tokens/s")
      rec.check(f"{spec['size']} step on one device", True)
      return
    if not _out_of_memory(r):
      rec.check(f"{spec['size']} step at microbatch {batch}", False, r.get("error", ""))
      return
  rec.check(f"{spec['size']} step on one device", False, "out of memory at every microbatch tried")


def _worker(spec_json: str, path: str) -> int:
  spec = json.loads(spec_json)
  try:
    result = measure(spec)
  except Exception as e:  # noqa: BLE001 (reported to the stage, which goes on)
    result = dict(spec, ok=False, error=f"{type(e).__name__}: {e}"[:2000])
  with open(path, "w") as f:
    json.dump(result, f)
  return 0


if __name__ == "__main__":
  sys.exit(_worker(sys.argv[1], sys.argv[2]))
