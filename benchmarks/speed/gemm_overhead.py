"""Forward + backward time of a transformer MLP block per GEMM recipe, as a ratio to bf16.

The block is LLaMA's SwiGLU MLP, y = (silu(x W_gate) * (x W_up)) W_down, with every matmul run
through `lpjax.quant.dot_general` and the recipe under test; one jitted step computes the loss and
the gradients of x and the three weights. Recipes are timed interleaved in one process (each
round times every recipe once, in a rotating order) and the median over rounds is reported, so
that drifts of the machine hit all recipes alike. The baseline is the `bf16` recipe measured in
the same run. On CPUs and pre-Blackwell GPUs FP4 is emulated (quantize, dequantize, bf16 GEMM),
so these ratios measure the cost of the emulation, not FP4 speed.

Run:
  python benchmarks/speed/gemm_overhead.py                          # tokens 2048, d 512, ff 1376
  python benchmarks/speed/gemm_overhead.py --recipes bf16,mxfp4 --rounds 5 --tokens 512
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from lpjax.quant import OperandQuant, dot_general, recipes
from lpjax.quant.gemm import operand as opq  # the operand quantizers the GEMMs use (no public API)
from timing import allocator, interleaved_medians  # benchmarks/speed/timing.py

_DN = (((1,), (0,)), ((), ()))  # (tokens, d) x (d, f)


def mlp_loss(params, x, key, recipe):
  """Loss of one SwiGLU MLP block whose three matmuls run with `recipe`."""
  keys = [jax.random.fold_in(key, i) for i in range(3)]
  gate = dot_general(x, params["w_gate"], _DN, recipe, key=keys[0])
  up = dot_general(x, params["w_up"], _DN, recipe, key=keys[1])
  h = (jax.nn.silu(gate.astype(jnp.float32)) * up.astype(jnp.float32)).astype(x.dtype)
  y = dot_general(h, params["w_down"], _DN, recipe, key=keys[2])
  return jnp.mean(jnp.square(y.astype(jnp.float32)))


def make_step(recipe):
  grad_fn = jax.value_and_grad(mlp_loss, argnums=(0, 1))
  return jax.jit(lambda params, x, key: grad_fn(params, x, key, recipe))


def _time_once(fn, *args) -> float:
  t0 = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - t0


def run(names, *, tokens: int, d: int, ff: int, rounds: int, dtype=jnp.bfloat16):
  k = jax.random.split(jax.random.key(0), 4)
  params = {"w_gate": (jax.random.normal(k[0], (d, ff)) / d**0.5).astype(dtype),
            "w_up": (jax.random.normal(k[1], (d, ff)) / d**0.5).astype(dtype),
            "w_down": (jax.random.normal(k[2], (ff, d)) / ff**0.5).astype(dtype)}
  x = jax.random.normal(k[3], (tokens, d)).astype(dtype)
  key = jax.random.key(1)
  steps = {name: make_step(name) for name in names}
  for name, step in steps.items():  # compile and warm up
    _time_once(step, params, x, key)
    _time_once(step, params, x, key)
  return interleaved_medians(
      {name: (lambda s=step: _time_once(s, params, x, key)) for name, step in steps.items()}, rounds)


def quantizer_costs(*, tokens: int, ff: int, rounds: int = 9):
  """ns per element of one operand quantization (bf16 (tokens, ff) input, the MLP's largest
  activation), and of the bf16 GEMM (tokens, d=512) x (512, ff) per output element.

  The key (and the RHT signs drawn from it) is an argument of the jitted function, as in a train
  step: a key captured as a constant lets XLA fold the random bits into the program.
  """
  x = jax.random.normal(jax.random.key(0), (tokens, ff)).astype(jnp.bfloat16)
  w = jax.random.normal(jax.random.key(1), (512, ff)).astype(jnp.bfloat16)
  key = jax.random.key(2)
  signs = lambda k: opq.hadamard_signs(k, "wgrad", 32)
  rtn = OperandQuant("mxfp4")
  sr = OperandQuant("mxfp4", rounding="stochastic", scale_mode="rceil", sr_prescale=0.75)
  cases = {
      "bf16 GEMM, per output (K=512)": (
          lambda x, k: jnp.dot(x[:, :512], w, preferred_element_type=jnp.float32)),
      "MXFP4 RTN": lambda x, k: opq.fake(x, rtn, axis=-1, key=None, dtype=jnp.bfloat16),
      "MXFP4 SR x3/4": lambda x, k: opq.fake(x, sr, axis=-1, key=k, dtype=jnp.bfloat16),
      "RHT-32 alone": lambda x, k: opq.rotate(x, 32, -1, signs(k)).astype(jnp.bfloat16),
      "MXFP4 SR x3/4 + RHT-32": lambda x, k: opq.fake(x, sr, axis=-1, key=k, signs=signs(k),
                                                      block=32, dtype=jnp.bfloat16),
      "NVFP4 RTN": lambda x, k: opq.fake(x, OperandQuant("nvfp4"), axis=-1, key=None,
                                         dtype=jnp.bfloat16),
      "FP8 e4m3 per tensor": lambda x, k: opq.fake(x, OperandQuant("fp8_e4m3"), axis=-1, key=None,
                                                   dtype=jnp.bfloat16),
  }
  out = {}
  for name, fn in cases.items():
    f = jax.jit(fn)
    _time_once(f, x, key)
    out[name] = statistics.median(_time_once(f, x, key) for _ in range(rounds)) / x.size * 1e9
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--recipes", default=",".join(recipes.NAMES))
  p.add_argument("--tokens", type=int, default=2048)
  p.add_argument("--d", type=int, default=512)
  p.add_argument("--ff", type=int, default=1376)
  p.add_argument("--rounds", type=int, default=15)
  p.add_argument("--no-breakdown", action="store_true", help="skip the per-element quantizer costs")
  args = p.parse_args(argv)
  names = [n for n in args.recipes.split(",") if n]
  if "bf16" not in names:
    names = ["bf16"] + names
  med = run(names, tokens=args.tokens, d=args.d, ff=args.ff, rounds=args.rounds)
  base = med["bf16"]
  print(f"SwiGLU MLP fwd+bwd, tokens={args.tokens} d={args.d} ff={args.ff}, bf16 inputs, "
        f"{jax.devices()[0].platform} x{jax.device_count()}, median of {args.rounds} interleaved rounds, "
        f"{allocator()}")
  print(f"{'recipe':<16} {'ms':>9} {'x bf16':>8}")
  for name in names:
    print(f"{name:<16} {med[name] * 1e3:9.2f} {med[name] / base:8.2f}")
  if not args.no_breakdown:
    # Each of the 9 GEMMs quantizes both operands, so every X, W, H and dY is quantized twice
    # (once per contraction axis): 6 x (tokens x d + d x ff + tokens x ff) elements per step.
    t, d, f = args.tokens, args.d, args.ff
    elements = 6 * (t * d + d * f + t * f)
    print(f"\nquantized elements per step (all 9 GEMMs, both operands): {elements / 1e6:.1f}M")
    print(f"{'per element':<32} {'ns':>6}")
    for name, ns in quantizer_costs(tokens=t, ff=f).items():
      print(f"{name:<32} {ns:6.2f}")
  return med


if __name__ == "__main__":
  sys.exit(main() and 0)
