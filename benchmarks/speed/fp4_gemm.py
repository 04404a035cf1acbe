"""TFLOP/s of the exact FP4 GEMM kernel against bf16 (and fp8) `jnp.dot`, and a LLaMA train step.

    python benchmarks/speed/fp4_gemm.py                          # on a GPU: GEMMs + LLaMA-60M/1B steps
    python benchmarks/speed/fp4_gemm.py --gemms-only --repeats 20 --tile 128x128
    python benchmarks/speed/fp4_gemm.py --dry-run                # CPU: tiny shapes, interpret mode

GEMMs (M x N x K; TFLOP/s = 2 M N K / seconds): square 4096^3 and 8192^3, and the LLaMA-1B
projections at --tokens rows (qkv/o 2048 x 2048, gate/up 2048 -> 5632, down 5632 -> 2048). Rows:
`bf16` (jnp.dot of bf16 operands, float32 accumulation, bf16 out), `fp8` (e4m3 operands, GPUs of
compute capability >= 8.9 only), `emulated mxfp4` (lpjax's emulated GEMM: dequantize both QArrays
to bf16, then the bf16 dot), and the kernel (`pallas.fp4_matmul`, bf16 out; with fp8 dots too
where the GPU has them) on MXFP4 and NVFP4 QArrays quantized beforehand (the quantizers are not timed here; the train step times them).
Every figure is the median of --repeats synchronized calls after a warm-up, all in this process,
and each kernel row says whether its result matched the float32 GEMM of the dequantized operands
(max error / max |value|).

Train step (unless --gemms-only): the trainer's step of LLaMA-60M and -1B
(`lpjax.train.config.llama_config`: the offline corpus, byte tokens, bf16 activations,
--batch-size sequences) with `bf16`, `quartet`
(emulated MXFP4) and `quartet:gemm_impl=pallas` (the kernel on every pass with two FP4 operands),
timed in interleaved rounds (benchmarks/speed/timing.py).

--dry-run (the default without a GPU) runs everything tiny on the CPU with the kernel in Pallas
interpret mode, checks the kernel's result against the exact numpy contract, and prints the same
tables: its timings are not measurements. `run(dry_run=True)` is the entry point for a caller
(e.g. the GPU check); the last line printed is a JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", d)
                for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from lpjax import pallas, quant  # noqa: E402
from timing import interleaved_medians, median_seconds  # noqa: E402  (benchmarks/speed/timing.py)


def gemm_shapes(tokens: int, dry_run: bool):
  """[(label, M, N, K)]: square and LLaMA-1B projection GEMMs (tiny, odd ones in a dry run)."""
  if dry_run:
    return [("square 64", 64, 64, 64), ("odd 40x72x96", 40, 72, 96)]
  return [("square 4096", 4096, 4096, 4096), ("square 8192", 8192, 8192, 8192),
          ("1B qkv/o", tokens, 2048, 2048), ("1B gate/up", tokens, 5632, 2048),
          ("1B down", tokens, 2048, 5632)]


def _has_fp8() -> bool:
  dev = jax.devices()[0]
  try:
    return dev.platform == "gpu" and float(getattr(dev, "compute_capability", 0)) >= 8.9
  except (TypeError, ValueError):
    return False


def _exact_check(qa, qb, y) -> bool:
  """Small GEMMs: the kernel equals the numpy contract (exact int64 block sums, float32 block-order
  accumulation) bit for bit."""
  from tests.pallas.fp4_gemm_reference import np_sequential  # noqa: PLC0415 (the tests' numpy)
  return bool(np.array_equal(np.asarray(y, np.float32), np_sequential(qa, qb)))


def measure_gemms(shapes, *, repeats: int, tile=None, interpret=None, check_exact=False):
  """One dict per (shape, implementation): ms, TFLOP/s, x bf16, and the kernel's error."""
  rows = []
  for label, m, n, k in shapes:
    ka, kb = jax.random.split(jax.random.key(m * 7919 + n * 31 + k))
    a = jax.random.normal(ka, (m, k), jnp.float32)
    b = jax.random.normal(kb, (n, k), jnp.float32)
    flops = 2.0 * m * n * k
    a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    cases = {"bf16": (jax.jit(lambda x, y: jnp.dot(x, y.T, preferred_element_type=jnp.bfloat16)),
                      (a16, b16))}
    if _has_fp8():
      a8, b8 = a.astype(jnp.float8_e4m3fn), b.astype(jnp.float8_e4m3fn)
      cases["fp8 e4m3"] = (jax.jit(lambda x, y: jnp.dot(x, y.T, preferred_element_type=jnp.bfloat16)),
                           (a8, b8))
    errors, exact = {}, {}
    for fmt in ("mxfp4", "nvfp4"):
      qa, qb = quant.quantize(a, fmt, impl="xla"), quant.quantize(b, fmt, impl="xla")
      if fmt == "mxfp4":
        emu = jax.jit(lambda x, y: jnp.dot(quant.dequantize(x, jnp.bfloat16),
                                           quant.dequantize(y, jnp.bfloat16).T,
                                           preferred_element_type=jnp.bfloat16))
        cases["emulated mxfp4"] = (emu, (qa, qb))
      kern = jax.jit(lambda x, y: pallas.fp4_matmul(x, y, out_dtype=jnp.bfloat16, tile=tile,
                                                    interpret=interpret))
      name = f"kernel {fmt}"
      cases[name] = (kern, (qa, qb))
      ref = jnp.dot(quant.dequantize(qa), quant.dequantize(qb).T,
                    precision=jax.lax.Precision.HIGHEST)
      y32 = pallas.fp4_matmul(qa, qb, tile=tile, interpret=interpret)
      errors[name] = float(jnp.abs(y32 - ref).max() / jnp.abs(ref).max())
      if check_exact:
        exact[name] = _exact_check(qa, qb, y32)
      if fmt == "mxfp4" and _has_fp8():  # Hopper: the same blocks on the FP8 tensor cores
        cases["kernel mxfp4 fp8 dots"] = (jax.jit(lambda x, y: pallas.fp4_matmul(
            x, y, out_dtype=jnp.bfloat16, tile=tile, dot_dtype="float8_e4m3fn")), (qa, qb))
    times = {name: median_seconds(fn, *args, repeats=repeats, warmup=1)
             for name, (fn, args) in cases.items()}
    for name, s in times.items():
      rows.append(dict(shape=label, m=m, n=n, k=k, impl=name, ms=s * 1e3,
                       tflops=flops / s / 1e12, x_bf16=times["bf16"] / s,
                       rel_error=errors.get(name), exact=exact.get(name)))
  return rows


def _trainer_step(size, recipe, batch_size, workdir, dry_run):
  from lpjax.train import Trainer  # noqa: PLC0415
  from lpjax.train.config import llama_config  # noqa: PLC0415
  c = llama_config(size, recipe=recipe)  # the offline corpus, byte tokens
  c.batch_size = batch_size
  c.model.compute_dtype = "bfloat16"
  c.progress_bar = False
  c.mesh.data = 1
  if dry_run:
    c.seq_len = 32
  trainer = Trainer(c, workdir, devices=jax.devices()[:1])
  state = trainer.init_state()
  _, local = next(trainer.task.batches(0, 1, 0, 1))
  batch = jax.device_put(local, trainer.batch_sharding)
  key = jax.random.key(0)
  step = trainer.compiled_train_step(trainer.precision.policy, state, batch, key)
  held = {"state": step(state, batch, key)[0]}

  def one_step() -> float:
    t0 = time.perf_counter()
    held["state"], metrics = step(held["state"], batch, key)
    jax.block_until_ready(metrics)
    return time.perf_counter() - t0
  return one_step


def measure_steps(models, recipes, *, batch_size: int, rounds: int, dry_run: bool):
  """Median train-step seconds per (model, recipe), and x bf16 of the same model."""
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for model in models:
      steps = {r: _trainer_step(model, r, batch_size, os.path.join(tmp, f"{model}_{i}"), dry_run)
               for i, r in enumerate(recipes)}
      med = interleaved_medians(steps, rounds)
      for r in recipes:
        rows.append(dict(model=model, recipe=r, step_ms=med[r] * 1e3,
                         x_bf16=med[r] / med[recipes[0]]))
  return rows


def run(dry_run: bool, *, repeats: int = 10, tokens: int = 2048, tile=None, gemms_only=False,
        batch_size: int = 32, rounds: int = 5, models=("60m", "1b")) -> dict:
  """Every figure of the benchmark as a dict (and the tables printed)."""
  on_gpu = jax.default_backend() == "gpu"
  dry_run = dry_run or not on_gpu
  if dry_run:
    repeats, rounds, batch_size, models = 1, 1, 2, ("tiny",)
  device = jax.devices()[0].device_kind
  gemms = measure_gemms(gemm_shapes(tokens, dry_run), repeats=repeats, tile=tile,
                        interpret=True if dry_run else None, check_exact=dry_run)
  note = ("DRY RUN on the CPU (Pallas interpret mode): the timings below are not measurements"
          if dry_run else f"{device}, median of {repeats}")
  print(f"\n{note}\n\n| GEMM | M x N x K | impl | ms | TFLOP/s | x bf16 | rel. error | exact |")
  print("|---|---|---|---|---|---|---|---|")
  for r in gemms:
    err = "" if r["rel_error"] is None else f"{r['rel_error']:.1e}"
    exact = "" if r["exact"] is None else ("yes" if r["exact"] else "NO")
    print(f"| {r['shape']} | {r['m']}x{r['n']}x{r['k']} | {r['impl']} | {r['ms']:.3f} | "
          f"{r['tflops']:.2f} | {r['x_bf16']:.2f} | {err} | {exact} |")
  steps = []
  if not gemms_only:
    recipes = ["bf16", "quartet", "quartet:gemm_impl=pallas"]
    steps = measure_steps(models, recipes, batch_size=batch_size, rounds=rounds, dry_run=dry_run)
    print(f"\nTrain step ({batch_size} sequences, one device)\n\n| model | recipe | step ms | x bf16 |")
    print("|---|---|---|---|")
    for r in steps:
      print(f"| {r['model']} | {r['recipe']} | {r['step_ms']:.1f} | {r['x_bf16']:.2f} |")
  result = dict(device=device, dry_run=dry_run, repeats=repeats, tile=tile, gemms=gemms,
                steps=steps)
  print(json.dumps(result))
  return result


def main():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--dry-run", action="store_true", help="tiny CPU run (default without a GPU)")
  p.add_argument("--repeats", type=int, default=10)
  p.add_argument("--tokens", type=int, default=2048, help="M of the LLaMA-1B GEMMs")
  p.add_argument("--tile", default=None, help="kernel output tile caps, e.g. 128x128")
  p.add_argument("--gemms-only", action="store_true")
  p.add_argument("--batch-size", type=int, default=32, help="sequences per train step")
  p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of train steps")
  p.add_argument("--models", default="60m,1b")
  args = p.parse_args()
  if not args.dry_run and jax.default_backend() != "gpu":
    print("No GPU: running the dry run (tiny, interpret mode; timings are not measurements).")
  run(args.dry_run, repeats=args.repeats, tokens=args.tokens,
      tile=tuple(int(t) for t in args.tile.split("x")) if args.tile else None,
      gemms_only=args.gemms_only, batch_size=args.batch_size, rounds=args.rounds,
      models=tuple(args.models.split(",")))


if __name__ == "__main__":
  main()
