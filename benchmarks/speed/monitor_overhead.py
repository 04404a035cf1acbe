"""What the trainer's monitor costs: LLaMA-tiny step time with `monitor.every=N` against the
monitor off, in one process, plus the compile times, the plain train step's HLO with and without
the monitor (which must be the same), and whether both runs end with the same parameters (the
measured step makes the same update).

Two Trainers (monitor off / on) train the same batches from the same initial state, through
`Trainer.one_step` as train.py does. The steps are timed interleaved in rounds of `every` steps
(off, then on: each "on" round holds exactly one measured step, with its JSON lines and scalars
written), so a drift of the shared machine hits both alike; the overhead is the median over
rounds of on / off - 1. On a busy machine that ratio is noisy, so the time of each measured step
itself (synchronized: the queued steps finish first) is reported too: its excess over the median
plain step, as a fraction of `every` plain steps. The measured step's compile (once per policy)
is reported apart, as the train step's compile is.

Run:
  python benchmarks/speed/monitor_overhead.py                                  # 300 steps, every 100
  python benchmarks/speed/monitor_overhead.py --steps 200 --every 100 --recipe nvfp4 --batch_size 16
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import jax

from lpjax.train import llama_config
from lpjax.train.outputs._metrics import MetricWriter
from lpjax.train.loop._trainer import Trainer, _global_batch
from timing import allocator  # benchmarks/speed/timing.py


def make(args, every, workdir):
  c = llama_config("tiny", recipe=args.recipe)
  c.steps, c.batch_size, c.seq_len = args.steps, args.batch_size, args.seq_len
  c.progress_bar, c.data.prefetch = False, 0
  c.monitor.every = every
  return Trainer(c, workdir)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--every", type=int, default=100)
  p.add_argument("--recipe", default="mxfp4")
  p.add_argument("--batch_size", type=int, default=8)
  p.add_argument("--seq_len", type=int, default=128)
  args = p.parse_args(argv)
  root = tempfile.mkdtemp(prefix="lpjax_monitor_overhead_")
  trainers = {name: make(args, every, os.path.join(root, name))
              for name, every in (("off", 0), ("on", args.every))}
  t0 = trainers["off"]
  key = jax.random.key(t0.config.seed + 1)
  batches = [(step, _global_batch(local, t0.batch_sharding))
             for step, local in t0.task.batches(0, args.steps, 0, 1)]
  states = {name: t.init_state() for name, t in trainers.items()}
  for name, t in trainers.items():  # the plain train steps' compiles
    t.compiled_train_step(t.precision.policy_at(0), states[name], batches[0][1], key)
  on = trainers["on"]
  on.monitor.start({}, 0)
  writer = MetricWriter(on.workdir, tensorboard=False)
  hlo = [t.train_step(t.precision.policy).lower(states["off"], batches[0][1], key).as_text()
         for t in trainers.values()]
  first = args.every - 1  # the measured step's compile, apart (once per policy)
  sites = on.monitor.sites_to_measure(first, states["on"], batches[first][1], key,
                                      on.precision.policy_at(first))
  before = on.compile_seconds
  on.compiled_train_step(on.precision.policy_at(first), states["on"], batches[first][1], key,
                         sites)
  measure_compile = on.compile_seconds - before

  def steps(name, chunk):
    t, state = trainers[name], states[name]
    begin = time.perf_counter()
    for step, batch in chunk:
      state, _ = t.one_step(step, state, batch, key, t.precision.policy_at(step), writer)
    jax.block_until_ready(state)
    states[name] = state
    return time.perf_counter() - begin

  steps("off", batches[:3])  # warm both (first-run allocations), then restart from step 0
  steps("on", batches[:3])
  for name, t in trainers.items():
    states[name] = t.init_state()
  on.monitor.measure_seconds, on.monitor.measurements = 0.0, 0
  ratios, times = [], {"off": [], "on": []}
  for i in range(0, args.steps, args.every):
    chunk = batches[i:i + args.every]
    for name in ("off", "on"):
      times[name].append(steps(name, chunk) / len(chunk))
    ratios.append(times["on"][-1] / times["off"][-1])
  writer.close()
  on.monitor.finish()
  device = jax.devices()[0]
  print(f"LLaMA-tiny {args.recipe}, batch {args.batch_size} x {args.seq_len}, {args.steps} steps, "
        f"{device.platform} ({device.device_kind}), {allocator()}")
  print(f"| monitor | step time (median of {len(ratios)} rounds of {args.every}) | overhead |")
  print("|---|---|---|")
  print(f"| off | {statistics.median(times['off']) * 1e3:.1f} ms | |")
  print(f"| every={args.every} | {statistics.median(times['on']) * 1e3:.1f} ms | "
        f"{(statistics.median(ratios) - 1) * 100:+.2f}% (rounds: "
        f"{', '.join(f'{(r - 1) * 100:+.1f}%' for r in ratios)}) |")
  measured = max(on.monitor.measurements, 1)
  each = on.monitor.measure_seconds / measured
  plain = statistics.median(times["off"])
  same = all(bool((a == b).all()) for a, b in zip(jax.tree.leaves(states["off"].params),
                                                  jax.tree.leaves(states["on"].params)))
  print(f"one measured step: {each * 1e3:.0f} ms (synchronized, {on.monitor.measurements} "
        f"measured) = {plain * 1e3:.0f} ms step + {(each - plain) * 1e3:.0f} ms measuring = "
        f"{(each - plain) / (args.every * plain) * 100:.2f}% of the step time at "
        f"every={args.every} (the rounds' ratio above includes the machine's noise)")
  print(f"train step compile: {t0.compile_seconds:.1f} s (off); measured step compile: "
        f"{measure_compile:.1f} s (on, once per policy)")
  print(f"plain train step HLO with the monitor on == off: {hlo[0] == hlo[1]}; "
        f"same parameters after {args.steps} steps: {same}")
  return 0 if hlo[0] == hlo[1] and same else 1


if __name__ == "__main__":
  sys.exit(main())
