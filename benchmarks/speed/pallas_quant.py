"""GB/s of the Pallas quantization kernels, of the XLA implementation, and of a device copy.

    python benchmarks/speed/pallas_quant.py                          # on a GPU: 8192 x 8192 bf16
    python benchmarks/speed/pallas_quant.py --rows 16384 --cols 8192 --dtype float32 --repeats 20
    python benchmarks/speed/pallas_quant.py --tile 64x256             # another kernel tile
    python benchmarks/speed/pallas_quant.py --smoke                   # tiny interpret-mode run (any CPU)

GB/s counts the bytes each operation must read and write once (x in, codes + scales out; values
out for fake_quant / dequantize; x in, both code sets out for double_quantize), whatever extra
passes an implementation makes (NVFP4's tensor-amax reduction reads x a second time). The copy
baseline is a jitted elementwise negation of the same tensor (one read, one write), measured in the
same process. Each figure is the median of --repeats timed runs after a warm-up, each ended by
block_until_ready. Every kernel's output is also compared bit for bit with the XLA one ("same"
column). Goal (issue 7): on an H200, MXFP4 and NVFP4 RTN quantize >= 70% of copy bandwidth.
Without a GPU the script says so and runs the tiny interpret-mode smoke version, whose timings
mean nothing. The last line printed is a JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from lpjax import pallas, quant
from timing import median_seconds  # benchmarks/speed/timing.py


def _nbytes(tree):
  return sum(int(np.prod(a.shape)) * jnp.dtype(a.dtype).itemsize for a in jax.tree.leaves(tree))


def _same(a, b):
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  if len(leaves_a) != len(leaves_b):
    return False
  for u, v in zip(leaves_a, leaves_b):
    u, v = np.asarray(u), np.asarray(v)
    if u.shape != v.shape or u.dtype != v.dtype:
      return False
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32}[u.dtype.itemsize]
    if not np.array_equal(u.view(width), v.view(width)):
      return False
  return True


def _cases(fmt, smoke, tile):
  """(name, kernel fn, xla fn, takes a QArray) for one format."""
  key = jax.random.key(1)
  kt = dict(tile=tile)
  cases = [
      ("quantize RTN", lambda x: pallas.quantize(x, fmt, **kt),
       lambda x: quant.quantize(x, fmt, impl="xla"), False),
      ("quantize SR", lambda x: pallas.quantize(x, fmt, rounding="stochastic", key=key, **kt),
       lambda x: quant.quantize(x, fmt, rounding="stochastic", key=key, impl="xla"), False),
      ("fake_quant RTN", lambda x: pallas.fake_quant(x, fmt, **kt),
       lambda x: quant.fake_quant(x, fmt, impl="xla"), False),
      ("dequantize", lambda q: pallas.dequantize(q, jnp.bfloat16, **kt),
       lambda q: quant.dequantize(q, jnp.bfloat16, impl="xla"), True),
  ]
  if not smoke:
    cases.append(("double_quantize SR", lambda x: pallas.double_quantize(
        x, fmt, rounding="stochastic", key=key, col_key=key, **kt), lambda x: (
            quant.quantize(x, fmt, axis=-1, rounding="stochastic", key=key, impl="xla"),
            quant.quantize(x, fmt, axis=-2, rounding="stochastic", key=key, impl="xla")), False))
    g = 16 if fmt == "nvfp4" else 32
    signs = quant.random_signs(jax.random.key(2), g)
    cases.append((f"RHT-{g} + quantize", lambda x: pallas.hadamard_quantize(
        x, fmt, block=g, signs=signs, **kt), lambda x: quant.quantize(
            quant.hadamard(x.astype(jnp.float32), g, signs=signs), fmt, impl="xla"), False))
  return cases


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rows", type=int, default=8192)
  parser.add_argument("--cols", type=int, default=8192)
  parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--formats", default="mxfp4,nvfp4,mxfp8_e4m3")
  parser.add_argument("--tile", default=None, help="kernel tile caps, e.g. 64x256")
  parser.add_argument("--smoke", action="store_true",
                      help="tiny interpret-mode run (the default without a GPU)")
  args = parser.parse_args()

  on_gpu = jax.default_backend() == "gpu"
  smoke = args.smoke or not on_gpu
  if not on_gpu:
    print("No GPU: these kernels are benchmarked on a GPU. Running the tiny interpret-mode smoke "
          "version instead (timings are not meaningful).")
  rows, cols, repeats = (64, 128, 2) if smoke else (args.rows, args.cols, args.repeats)
  tile = tuple(int(t) for t in args.tile.split("x")) if args.tile else None
  dtype = jnp.dtype(args.dtype)
  x = jax.random.normal(jax.random.key(0), (rows, cols), jnp.float32).astype(dtype)

  copy = jax.jit(jnp.negative)
  copy_s = median_seconds(copy, x, repeats=repeats, warmup=2)
  copy_gbps = 2 * _nbytes(x) / copy_s / 1e9
  results = []
  for fmt in args.formats.split(","):
    for name, kernel_fn, xla_fn, takes_q in _cases(fmt, smoke, tile):
      arg = jax.jit(lambda x: quant.quantize(x, fmt, impl="xla"))(x) if takes_q else x
      kernel_fn, xla_fn = jax.jit(kernel_fn), jax.jit(xla_fn)
      out_k, out_x = kernel_fn(arg), xla_fn(arg)
      moved = _nbytes(arg) + _nbytes(out_x)
      same = _same(out_k, out_x)
      for impl, fn in (("pallas", kernel_fn), ("xla", xla_fn)):
        seconds = median_seconds(fn, arg, repeats=repeats, warmup=2)
        gbps = moved / seconds / 1e9
        results.append(dict(op=name, fmt=fmt, impl=impl, ms=seconds * 1e3, gbps=gbps,
                            frac_of_copy=gbps / copy_gbps, same_bits=same))

  device = jax.devices()[0].device_kind
  print(f"\n{device}, x = {rows} x {cols} {dtype.name}, median of {repeats}; "
        f"copy: {copy_gbps:.1f} GB/s ({copy_s * 1e3:.3f} ms)\n")
  print("| op | format | impl | ms | GB/s | % of copy | same bits as xla |")
  print("|---|---|---|---|---|---|---|")
  for r in results:
    print(f"| {r['op']} | {r['fmt']} | {r['impl']} | {r['ms']:.3f} | {r['gbps']:.1f} | "
          f"{100 * r['frac_of_copy']:.0f}% | {'yes' if r['same_bits'] else 'NO'} |")
  print(json.dumps(dict(device=device, shape=[rows, cols], dtype=dtype.name, smoke=smoke,
                        repeats=repeats, tile=tile, copy_gbps=copy_gbps, results=results)))


if __name__ == "__main__":
  main()
