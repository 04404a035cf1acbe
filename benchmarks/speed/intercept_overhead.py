"""What the interception costs: lpjax's LLaMA (its own quantized layers) against the same model
written with plain Flax layers and quantized by `lpjax.quant.quantize_model`, per recipe.

    python benchmarks/speed/intercept_overhead.py
    python benchmarks/speed/intercept_overhead.py --recipes=mxfp4,nvfp4 --size=tiny --steps=10

For each recipe, both ways compute `jax.value_and_grad` of the summed logits of one batch on the
same weights and key (the two are bit-identical, checked here), and this script measures in one
process:
- `trace_s`: `jax.jit(f).trace(...)` (Python: the model, and for the interception its jaxpr and
  the rewrite), `lower_s` the lowering to StableHLO, `compile_s` XLA's compile, each the median
  of `--compiles` fresh compiles;
- `hlo_ops`: the instruction count of the optimized HLO, and the count of its fusions;
- `step_s`: the median step time over `--steps` rounds, the two ways interleaved.
Ratios are intercepted / lpjax's own; the goal is HLO counts equal, step <= 1.02x, trace +
lower + compile <= 1.1x.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _parse():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--recipes", default="bf16,mxfp4,nvfp4,quartet")
  p.add_argument("--size", default="tiny", help="a LLaMA size (lpjax.models.llama_sizes)")
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--compiles", type=int, default=3,
                 help="trace + lower + compile repeated this many times, medians reported")
  return p.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "quant"))
sys.path[:0] = [os.path.join(os.path.join(ROOT, "benchmarks"), d)
                for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/

from lpjax import quant  # noqa: E402
from lpjax.models import llama  # noqa: E402
from plain_llama import PlainLlama  # noqa: E402  (tests/quant/plain_llama.py)
from timing import allocator, interleaved_medians  # noqa: E402


def _functions(cfg, recipe, tokens, key):
  policy = quant.QuantPolicy.from_settings(recipe)
  graphdef, _ = llama.abstract_model(cfg, policy)
  params = llama.init_params(cfg, jax.random.key(0), policy)
  own = lambda p: llama.apply(graphdef, cfg, p, tokens, None, key).sum()
  plain = PlainLlama(cfg, scan=True, rngs=nnx.Rngs(0))
  nnx.update(plain, params)
  pg, pstate = nnx.split(plain, nnx.Param)
  ours = lambda s: quant.quantize_model(nnx.merge(pg, s), policy)(tokens, quant_key=key).sum()
  return (jax.value_and_grad(own), params), (jax.value_and_grad(ours), pstate)


def _compile_once(fn, arg):
  """Trace, lower and compile `fn` afresh: a new function object, so jit's trace cache misses
  (the persistent compilation cache is off)."""
  t0 = time.perf_counter()
  traced = jax.jit(lambda a: fn(a)).trace(arg)
  t1 = time.perf_counter()
  lowered = traced.lower()
  t2 = time.perf_counter()
  compiled = lowered.compile()
  t3 = time.perf_counter()
  return compiled, (t1 - t0, t2 - t1, t3 - t2)


def _measure_pair(fns, args, repeats):
  """Both ways compiled `repeats` times, interleaved; the median of each phase per way."""
  times = {name: [] for name in fns}
  compiled = {}
  for _ in range(max(repeats, 1)):
    for name, fn in fns.items():
      compiled[name], t = _compile_once(fn, args[name])
      times[name].append(t)
  out = {}
  for name in fns:
    trace_s, lower_s, compile_s = np.median(np.asarray(times[name]), axis=0)
    text = compiled[name].as_text()
    ops = len(re.findall(r"^\s+(?:ROOT )?%?[\w.\-]+ = ", text, flags=re.M))
    fusions = len(re.findall(r"^\s*(?:ROOT )?%?[\w.\-]+ = \S+ fusion\(", text, flags=re.M))
    out[name] = compiled[name], dict(trace_s=trace_s, lower_s=lower_s, compile_s=compile_s,
                                     hlo_ops=ops, fusions=fusions)
  return out


def main(args):
  cfg = llama.LlamaConfig.from_size(args.size, vocab_size=256, max_seq_len=args.seq)
  tokens = jax.random.randint(jax.random.key(3), (args.batch, args.seq), 0, 256)
  key = jax.random.key(7)
  print(f"LLaMA-{args.size}, batch {args.batch} x {args.seq}, {jax.devices()[0].platform}, "
        f"{allocator()}")
  head = (f"{'recipe':<8} {'way':<12} {'trace s':>8} {'lower s':>8} {'compile s':>9} "
          f"{'HLO ops':>8} {'fusions':>8} {'step ms':>8} {'same bits':>9}")
  print(head)
  for recipe in args.recipes.split(","):
    (own, p_own), (ours, p_ours) = _functions(cfg, recipe, tokens, key)
    m = _measure_pair({"own": own, "ours": ours}, {"own": p_own, "ours": p_ours}, args.compiles)
    (c_own, m_own), (c_ours, m_ours) = m["own"], m["ours"]
    a, b = c_own(p_own), c_ours(p_ours)
    same = float(a[0]) == float(b[0]) and all(
        np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a[1]), jax.tree.leaves(b[1])))

    def timed(c, p):
      def run():
        t = time.perf_counter()
        jax.block_until_ready(c(p))
        return time.perf_counter() - t
      return run

    steps = interleaved_medians({"own": timed(c_own, p_own), "ours": timed(c_ours, p_ours)},
                                args.steps)
    m_own["step_s"], m_ours["step_s"] = steps["own"], steps["ours"]
    for way, m in (("lpjax.nn", m_own), ("intercepted", m_ours)):
      print(f"{recipe:<8} {way:<12} {m['trace_s']:>8.2f} {m['lower_s']:>8.2f} "
            f"{m['compile_s']:>9.2f} {m['hlo_ops']:>8d} {m['fusions']:>8d} "
            f"{1e3 * m['step_s']:>8.1f} {str(same) if way == 'intercepted' else '':>9}")
    total = lambda m: m["trace_s"] + m["lower_s"] + m["compile_s"]
    print(f"{recipe:<8} {'ratio':<12} {m_ours['trace_s'] / m_own['trace_s']:>8.2f} "
          f"{m_ours['lower_s'] / m_own['lower_s']:>8.2f} "
          f"{m_ours['compile_s'] / m_own['compile_s']:>9.2f} "
          f"{m_ours['hlo_ops'] / m_own['hlo_ops']:>8.3f} "
          f"{m_ours['fusions'] / max(m_own['fusions'], 1):>8.3f} "
          f"{m_ours['step_s'] / m_own['step_s']:>8.3f}   (trace+lower+compile "
          f"{total(m_ours) / total(m_own):.2f}x)")


if __name__ == "__main__":
  main(ARGS)
