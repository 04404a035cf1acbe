"""Throughput of quantize and fake_quant (GB/s of bytes read + written) against a device copy.

    python benchmarks/speed/quant_throughput.py                 # 64M-element fp32 tensor, CPU
    python benchmarks/speed/quant_throughput.py --elements 4194304 --repeats 5
    python benchmarks/speed/quant_throughput.py --reference     # also the integer reference path

The copy baseline is a jitted elementwise negation of the same tensor (one read and one write of
every byte), measured in the same process and interleaved with the quantizers. The table prints
each kernel's GB/s and its ratio to the copy. Targets (issue 14, on a 2-core CPU): fake_quant
RTN >= 0.6x the copy for mxfp4 and nvfp4, SR >= 0.4x, packed quantize >= 0.3x. `--reference`
adds rows for `lpjax.quant.reference_arithmetic()` (same bits, integer arithmetic).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics

import jax
import jax.numpy as jnp

from lpjax import quant
from timing import allocator, median_seconds  # benchmarks/speed/timing.py


def _compiled(fn, x, key, reference: bool):
  """fn jitted and compiled now (the path is chosen when it is traced)."""
  with quant.reference_arithmetic() if reference else contextlib.nullcontext():
    return jax.jit(fn).lower(x, key).compile()


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--elements", type=int, default=64 * 2**20)
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--formats", default="mxfp4,nvfp4")
  parser.add_argument("--reference", action="store_true",
                      help="also time the integer reference path (quant.reference_arithmetic)")
  args = parser.parse_args()

  n = args.elements
  x = jax.random.normal(jax.random.key(0), (n // 4096, 4096), jnp.float32)
  key = jax.random.key(1)
  copy = jax.jit(lambda x: -x)
  cases = []
  for name in args.formats.split(","):
    fmt = quant.get_format(name)
    scales = jax.eval_shape(lambda x, f=name: quant.quantize(x, f).scales, x)
    # codes + the scales (a byte per block, or fp32 per tensor / channel)
    q_bytes = n * fmt.element.bits / 8 + math.prod(scales.shape) * scales.dtype.itemsize
    for rounding in ("nearest_even", "stochastic"):
      tag = "RTN" if rounding == "nearest_even" else "SR"
      for reference in (False, True) if args.reference else (False,):
        suffix = " (reference)" if reference else ""
        qfn = _compiled(lambda x, k, f=name, r=rounding: quant.quantize(x, f, rounding=r, key=k),
                        x, key, reference)
        ffn = _compiled(lambda x, k, f=name, r=rounding: quant.fake_quant(x, f, rounding=r, key=k),
                        x, key, reference)
        cases.append((f"quantize {name} {tag}{suffix}", qfn, 4 * n + q_bytes))
        cases.append((f"fake_quant {name} {tag}{suffix}", ffn, 8 * n))

  copy_times, times = [], {c[0]: [] for c in cases}
  for _ in range(args.repeats):  # interleave so drift hits every kernel alike
    copy_times.append(median_seconds(copy, x, repeats=1))
    for label, fn, _ in cases:
      times[label].append(median_seconds(fn, x, key, repeats=1))
  copy_gbs = 8 * n / statistics.median(copy_times) / 1e9

  print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {n} fp32 elements, "
        f"median of {args.repeats}, {allocator()}")
  print(f"| kernel | GB/s | vs copy |\n|---|---|---|\n| copy (-x) | {copy_gbs:.2f} | 1.00 |")
  result = {"elements": n, "copy_gbs": copy_gbs}
  for label, _, nbytes in cases:
    gbs = nbytes / statistics.median(times[label]) / 1e9
    result[label] = gbs
    print(f"| {label} | {gbs:.2f} | {gbs / copy_gbs:.2f} |")
  print(json.dumps(result))


if __name__ == "__main__":
  main()
