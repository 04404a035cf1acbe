"""Stage d: GB/s of each Pallas kernel and of the XLA path on 64M and 256M float32 elements, as a
fraction of a same-size device copy measured in the same process (benchmarks/speed/pallas_quant.py's
method: the bytes an op must read and write once, median of timed runs after a warm-up).

Goals (issue 38): Pallas quantize RTN >= 70% of the copy's bandwidth, SR >= 60%.
"""

from __future__ import annotations

import time

RTN_GOAL, SR_GOAL = 0.70, 0.60


def sizes(dry_run: bool) -> list[tuple[int, int]]:
  """(rows, cols): 64M and 256M elements on a GPU (8192^2, 16384^2); tiny in the dry run."""
  return [(64, 256)] if dry_run else [(8192, 8192), (16384, 16384)]


def ops(fmt: str, interpret):
  """(op name, kernel fn, XLA fn, takes a QArray) of one format; the kernels in `interpret` mode."""
  import jax
  import jax.numpy as jnp

  from lpjax import pallas, quant

  key, col_key = jax.random.key(1), jax.random.key(2)
  g = 16 if fmt == "nvfp4" else 32
  signs = quant.random_signs(jax.random.key(3), g)
  sr = dict(rounding="stochastic", key=key)
  kw = dict(interpret=interpret)
  return [
      ("quantize RTN", lambda x: pallas.quantize(x, fmt, **kw),
       lambda x: quant.quantize(x, fmt, impl="xla"), False),
      ("quantize SR", lambda x: pallas.quantize(x, fmt, **sr, **kw),
       lambda x: quant.quantize(x, fmt, impl="xla", **sr), False),
      ("fake_quant RTN", lambda x: pallas.fake_quant(x, fmt, **kw),
       lambda x: quant.fake_quant(x, fmt, impl="xla"), False),
      ("dequantize", lambda q: pallas.dequantize(q, jnp.float32, **kw),
       lambda q: quant.dequantize(q, jnp.float32, impl="xla"), True),
      ("double_quantize SR", lambda x: pallas.double_quantize(x, fmt, col_key=col_key, **sr, **kw),
       lambda x: (quant.quantize(x, fmt, axis=-1, impl="xla", **sr),
                  quant.quantize(x, fmt, axis=-2, rounding="stochastic", key=col_key,
                                 impl="xla")), False),
      (f"RHT-{g} + quantize", lambda x: pallas.hadamard_quantize(x, fmt, block=g, signs=signs,
                                                                  **kw),
       lambda x: quant.quantize(quant.hadamard(x, g, signs=signs), fmt, impl="xla"), False),
  ]


def _nbytes(tree) -> int:
  import jax
  return sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(tree))


def _median_s(fn, *args, repeats: int, rec=None) -> float:
  """Median wall time after one warm-up call; the run time goes to `rec`."""
  from benchmarks.gpu_check import _timing
  return _timing.median_s(fn, *args, repeats=repeats, rec=rec)


def _equal_on_device(a, b) -> bool:
  """Bit equality computed on the device (no 1 GiB transfer to the host), NaN as one category
  (`_data.differing`: any NaN matches any NaN, never a number)."""
  import jax
  import jax.numpy as jnp

  def same(u, v):
    if u.shape != v.shape or u.dtype != v.dtype:
      return jnp.bool_(False)
    width = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[u.dtype.itemsize]
    equal = (jax.lax.bitcast_convert_type(u, width) == jax.lax.bitcast_convert_type(v, width))
    if jnp.issubdtype(u.dtype, jnp.floating):
      nan_u, nan_v = jnp.isnan(u), jnp.isnan(v)
      equal = jnp.where(nan_u & nan_v, True, equal & (nan_u == nan_v))
    return jnp.all(equal)

  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(bool(jax.jit(same)(u, v)) for u, v in zip(la, lb))


def _compile_all(fns: dict, args: dict, workers: int) -> dict:
  """{name: compiled fn or the exception} for {name: (fn, arg name)}; compiled side by side in
  threads (XLA and Triton compile outside the GIL), so a GPU spends seconds, not minutes."""
  import concurrent.futures

  import jax

  def compile_one(item):
    fn, arg = item
    return jax.jit(fn).lower(jax.eval_shape(lambda: args[arg])).compile()

  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    futures = {name: pool.submit(compile_one, item) for name, item in fns.items()}
  out = {}
  for name, future in futures.items():
    try:
      out[name] = future.result()
    except Exception as e:  # noqa: BLE001 (that op fails; the others run)
      out[name] = e
  return out


def run(rec, dry_run: bool) -> None:
  import jax
  import jax.numpy as jnp

  from lpjax import quant

  gpu = jax.default_backend() == "gpu"
  interpret = None if gpu else True
  repeats = 2 if dry_run else 10
  worst = {"quantize RTN": None, "quantize SR": None}  # the lowest fraction over formats
  for rows, cols in sizes(dry_run):
    size = f"{rows * cols / 2**20:.0f}M" if rows * cols >= 2**20 else f"{rows * cols}"
    if rec.out_of_time(f"{size} elements"):
      continue
    x = jax.random.normal(jax.random.key(0), (rows, cols), jnp.float32)
    args = {"x": x}
    cases, fns = [], {}
    for fmt in ("mxfp4", "nvfp4"):
      # Interpret mode is slow on a CPU: the dry run times NVFP4's two quantize ops only.
      for name, kernel_fn, xla_fn, takes_q in ops(fmt, interpret)[:2 if dry_run and fmt == "nvfp4"
                                                                   else None]:
        arg = "x"
        if takes_q:
          arg = f"q_{fmt}"
          args[arg] = jax.jit(lambda v, f=fmt: quant.quantize(v, f, impl="xla"))(x)
        cases.append((fmt, name, arg))
        fns[(fmt, name, "pallas")], fns[(fmt, name, "xla")] = (kernel_fn, arg), (xla_fn, arg)
    fns[("-", "device copy", "xla")] = (jnp.negative, "x")
    start = time.perf_counter()
    compiled = _compile_all(fns, args, workers=1 if dry_run else 8)
    rec.add_time(compile_s=time.perf_counter() - start)  # wall time of the parallel compiles
    copy_s = _median_s(compiled[("-", "device copy", "xla")], x, repeats=repeats, rec=rec)
    copy_gbps = 2 * _nbytes(x) / copy_s / 1e9
    rec.row("bandwidth", elements=size, op="device copy", fmt="-", impl="xla",
            ms=copy_s * 1e3, gbps=copy_gbps, of_copy=1.0, same_bits="-")
    for fmt, name, arg_name in cases:
      if rec.out_of_time(f"{fmt} {name} at {size}"):
        continue
      kernel_fn, xla_fn = compiled[(fmt, name, "pallas")], compiled[(fmt, name, "xla")]
      try:
        for fn in (kernel_fn, xla_fn):
          if isinstance(fn, Exception):
            raise fn
        arg = args[arg_name]
        out_k, out_x = kernel_fn(arg), xla_fn(arg)
        moved = _nbytes(arg) + _nbytes(out_x)
        same = _equal_on_device(out_k, out_x)
        del out_k, out_x
        rec.check(f"{fmt} {name} at {size}: same bits as XLA", same)
        for impl, fn in (("pallas", kernel_fn), ("xla", xla_fn)):
          gbps = moved / _median_s(fn, arg, repeats=repeats, rec=rec) / 1e9
          rec.row("bandwidth", elements=size, op=name, fmt=fmt, impl=impl,
                  ms=moved / gbps / 1e6, gbps=gbps, of_copy=gbps / copy_gbps, same_bits=same)
          if impl == "pallas" and name in worst:
            frac = gbps / copy_gbps
            worst[name] = frac if worst[name] is None else min(worst[name], frac)
            _goal_figures(rec, worst, gpu)  # kept up to date: a stage cut short still has them
      except Exception as e:  # noqa: BLE001 (e.g. out of memory at 256M: the next op runs)
        rec.check(f"{fmt} {name} at {size}", False, f"{type(e).__name__}: {e}"[:500])
    del x, args, compiled
  _goal_figures(rec, worst, gpu)


def _goal_figures(rec, worst: dict, gpu: bool) -> None:
  """The goals' figures: the lowest fraction of the copy's bandwidth over formats and sizes."""
  for name, goal in (("quantize RTN", RTN_GOAL), ("quantize SR", SR_GOAL)):
    frac = worst[name]
    rec.figure(f"Pallas {name.split()[1]} (worst of mxfp4, nvfp4)",
               None if frac is None else 100 * frac, "% of copy", goal=f">= {100 * goal:.0f}%",
               met=None if frac is None or not gpu else frac >= goal)
