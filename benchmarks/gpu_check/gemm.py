"""Stage e: GEMM overhead on the device. benchmarks/speed/gemm_overhead.py's SwiGLU MLP block, forward
and backward, per recipe as a ratio to bf16 measured in the same interleaved rounds, with the
operand quantizers from the Pallas kernels (impl="auto" on a GPU) and from the XLA path
(LPJAX_PALLAS_AUTO=0, read when a step is traced). Every (recipe, quantizers) is a case of its
own: one that fails to compile or run is recorded as failed and the others are still timed."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time

RECIPES = ("bf16", "mxfp4", "nvfp4", "quartet")


@contextlib.contextmanager
def quantizers(impl: str):
  """impl="xla": trace with lpjax.quant's XLA quantizers even on a GPU; "auto": the default."""
  old = os.environ.get("LPJAX_PALLAS_AUTO")
  if impl == "xla":
    os.environ["LPJAX_PALLAS_AUTO"] = "0"
  try:
    yield
  finally:
    if old is None:
      os.environ.pop("LPJAX_PALLAS_AUTO", None)
    else:
      os.environ["LPJAX_PALLAS_AUTO"] = old


def shapes(dry_run: bool) -> tuple[int, int, int, int]:
  """(tokens, d, ff, rounds). On a GPU, LLaMA-1B's MLP with ff = 5632: 5461 (the config's width)
  rounded up to a multiple of 256, as LLaMA's `multiple_of` does, so every quantizer runs on the
  kernels' real tiles (32 x 256 along rows, 64 x 128 down columns) with no pad / slice copies."""
  return (64, 64, 256, 2) if dry_run else (8192, 2048, 5632, 10)


def cases(recipes, gpu: bool) -> list[tuple[str, str]]:
  """(recipe, quantizers) in the order they compile: bf16 first (the baseline), then each
  recipe with the Pallas quantizers (GPU only) and the XLA ones."""
  out = [("bf16", "xla")]
  for recipe in recipes:
    if recipe != "bf16":
      out += ([(recipe, "pallas")] if gpu else []) + [(recipe, "xla")]
  return out


def run(rec, dry_run: bool) -> None:
  import jax
  import jax.numpy as jnp

  from benchmarks.gpu_check import _timing
  from benchmarks.gpu_check._record import in_order

  sys.path[:0] = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), d)
                  for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/
  import gemm_overhead  # benchmarks/speed/gemm_overhead.py (it imports benchmarks/speed/timing.py)

  gpu = jax.default_backend() == "gpu"
  tokens, d, ff, rounds = shapes(dry_run)
  recipes = ("bf16", "mxfp4") if dry_run else RECIPES
  if not gpu:
    rec.note("no GPU: impl='auto' is the XLA path here, so only the XLA quantizers are timed")
  k = jax.random.split(jax.random.key(0), 4)
  params = {"w_gate": (jax.random.normal(k[0], (d, ff)) / d**0.5).astype(jnp.bfloat16),
            "w_up": (jax.random.normal(k[1], (d, ff)) / d**0.5).astype(jnp.bfloat16),
            "w_down": (jax.random.normal(k[2], (ff, d)) / ff**0.5).astype(jnp.bfloat16)}
  x = jax.random.normal(k[3], (tokens, d)).astype(jnp.bfloat16)
  key = jax.random.key(1)
  # Traced one by one (the quantizer setting is read while tracing), compiled side by side in
  # threads (XLA and Triton compile outside the GIL), then each warmed up; every (recipe,
  # quantizers) is a case of its own: a failure at any step is that case's alone.
  lowered, failed = {}, {}
  start = time.perf_counter()
  for recipe, impl in cases(recipes, gpu):
    if rec.out_of_time(f"{recipe} ({impl} quantizers)"):
      continue
    try:
      with quantizers("auto" if impl == "pallas" else "xla"):
        lowered[(recipe, impl)] = gemm_overhead.make_step(recipe).lower(params, x, key)
    except Exception as e:  # noqa: BLE001 (e.g. a kernel that does not trace)
      failed[(recipe, impl)] = e
  rec.add_time(compile_s=time.perf_counter() - start)
  steps, compile_s = {}, {}

  def compile_one(case):
    t = time.perf_counter()
    exe = lowered[case].compile()
    return exe, time.perf_counter() - t

  start = time.perf_counter()
  for case, result in in_order(rec, list(lowered), compile_one, workers=1 if dry_run else 4,
                               label=lambda c: f"{c[0]} ({c[1]} quantizers)"):
    if isinstance(result, Exception):
      failed[case] = result
    else:
      steps[case], compile_s[case] = result
  rec.add_time(compile_s=time.perf_counter() - start)
  for case in list(steps):
    try:
      _timing.run(steps[case], params, x, key, rec=rec)  # warm-up
    except Exception as e:  # noqa: BLE001 (e.g. out of memory)
      failed[case] = e
      steps.pop(case)
  for (recipe, impl), e in failed.items():
    rec.check(f"{recipe} ({impl} quantizers) compiles and runs", False,
              f"{type(e).__name__}: {e}"[:500])
  times = {c: [] for c in steps}
  for r in range(rounds):  # interleaved rounds, rotated by one each round (benchmarks/speed/timing.py)
    if rec.out_of_time(f"timing round {r + 1} of {rounds}"):
      break
    order = list(times)
    for c in order[r % max(len(order), 1):] + order[:r % max(len(order), 1)]:
      if c not in steps:
        continue
      try:
        start = time.perf_counter()
        jax.block_until_ready(steps[c](params, x, key))
        times[c].append(time.perf_counter() - start)
        rec.add_time(run_s=times[c][-1])
      except Exception as e:  # noqa: BLE001
        steps.pop(c)
        rec.check(f"{c[0]} ({c[1]} quantizers) runs", False, f"{type(e).__name__}: {e}"[:500])
  med = {c: statistics.median(t) for c, t in times.items() if t and c in steps}
  base = med.get(("bf16", "xla"))
  for (recipe, impl), seconds in med.items():
    rec.row("mlp", recipe=recipe, quantizers=impl if recipe != "bf16" else "-",
            compile_s=compile_s[(recipe, impl)], ms=seconds * 1e3,
            x_bf16=seconds / base if base else None)
    rec.check(f"{recipe} ({impl} quantizers) timed", True)
  rec.note(f"SwiGLU MLP fwd+bwd, tokens={tokens} d={d} ff={ff}, bf16 inputs, median of {rounds} "
           "interleaved rounds; FP4 is emulated (quantize, then a bf16 GEMM) before Blackwell; "
           "compile_s is trace + lower + compile (first-run Triton compiles included)")
  for recipe in recipes[1:]:
    for impl in ("pallas", "xla"):
      if (recipe, impl) in med and base:
        rec.figure(f"{recipe} MLP ({impl})", med[(recipe, impl)] / base, "x bf16")
