"""Stage e: GEMM overhead on the device. benchmarks/gemm_overhead.py's SwiGLU MLP block, forward
and backward, per recipe as a ratio to bf16 measured in the same interleaved rounds, with the
operand quantizers from the Pallas kernels (impl="auto" on a GPU) and from the XLA path
(LPJAX_PALLAS_AUTO=0, read when a step is traced)."""

from __future__ import annotations

import contextlib
import os
import sys

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


def run(rec, dry_run: bool) -> None:
  import jax
  import jax.numpy as jnp

  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import gemm_overhead  # benchmarks/gemm_overhead.py (it imports benchmarks/timing.py)
  from timing import interleaved_medians

  gpu = jax.default_backend() == "gpu"
  # LLaMA-1B's MLP on a GPU (d 2048, ff 5461: an odd width, as the model has it); tiny on a CPU.
  tokens, d, ff, rounds = (64, 64, 96, 2) if dry_run else (8192, 2048, 5461, 10)
  recipes = ("bf16", "mxfp4") if dry_run else RECIPES
  impls = ("auto", "xla") if gpu else ("xla",)
  if not gpu:
    rec.note("no GPU: impl='auto' is the XLA path here, so only the XLA quantizers are timed")
  k = jax.random.split(jax.random.key(0), 4)
  params = {"w_gate": (jax.random.normal(k[0], (d, ff)) / d**0.5).astype(jnp.bfloat16),
            "w_up": (jax.random.normal(k[1], (d, ff)) / d**0.5).astype(jnp.bfloat16),
            "w_down": (jax.random.normal(k[2], (ff, d)) / ff**0.5).astype(jnp.bfloat16)}
  x = jax.random.normal(k[3], (tokens, d)).astype(jnp.bfloat16)
  key = jax.random.key(1)
  steps = {}
  for recipe in recipes:
    for impl in impls if recipe != "bf16" else ("xla",):
      name = (recipe, "pallas" if impl == "auto" and gpu else "xla")
      if rec.out_of_time(f"{recipe} ({name[1]} quantizers)"):
        continue
      with quantizers(impl):  # traced (and compiled) here, under this setting
        step = gemm_overhead.make_step(recipe)
        jax.block_until_ready(step(params, x, key))
      steps[name] = step
  timed = {name: (lambda s=step: gemm_overhead._time_once(s, params, x, key))
           for name, step in steps.items()}
  med = interleaved_medians(timed, rounds)
  base = med.get(("bf16", "xla"))
  for (recipe, impl), seconds in med.items():
    rec.row("mlp", recipe=recipe, quantizers=impl if recipe != "bf16" else "-",
            ms=seconds * 1e3, x_bf16=seconds / base if base else None)
  rec.note(f"SwiGLU MLP fwd+bwd, tokens={tokens} d={d} ff={ff}, bf16 inputs, median of {rounds} "
           "interleaved rounds; FP4 is emulated (quantize, then a bf16 GEMM) before Blackwell")
  for recipe in recipes[1:]:
    for impl in ("pallas", "xla"):
      if (recipe, impl) in med and base:
        rec.figure(f"{recipe} MLP ({impl})", med[(recipe, impl)] / base, "x bf16")
  rec.check("every recipe timed", len(med) == len(steps) and base is not None)
