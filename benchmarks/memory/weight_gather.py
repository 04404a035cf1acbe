"""All-gather bytes per train step, with and without the FP4 weight all-gather, from compiled HLO.

    python benchmarks/memory/weight_gather.py --config=configs/llama_1b_mxfp4.py --devices=8

Compiles the config's train step twice (AOT from ShapeDtypeStructs, nothing allocated) with
`quant.gather_quantized_weights` off and on, and sums the bytes of every all-gather in the
compiled HLO, times the trip counts of the loops around it (layers x microbatches), per device.
With the option off, XLA gathers each FSDP-sharded weight in high precision (in whichever dtype
its partitioner picks) before quantizing it; with it on, each device quantizes its own shard and
the gather moves FP4 codes and block scales. The reference "bf16 weights" is the same gather
traffic with every float32/bf16 weight gather counted at 2 bytes per element. The last output
line is a JSON object with the byte counts. `--record` also writes the figures the docs state
(GiB before and after, the ratios) to docs/results/records/weight_gather.json (benchmarks/common/records.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", d)
                for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/
from llama_step import add_step_arguments, compile_train_step, load_config  # noqa: E402
from records import add_record_argument, write_record  # noqa: E402


def _parse():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  add_step_arguments(p)
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="a config override of both programs, e.g. --set model.vocab_chunks=8; "
                      "repeatable")
  add_record_argument(p, "weight_gather")
  return p.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:  # before jax is imported
  from cpu_devices import use_virtual_cpu_devices
  use_virtual_cpu_devices(ARGS.devices)

import jax  # noqa: E402

from ablate_sweeps import parse_sets, set_key  # noqa: E402
from hlo_collectives import collective_bytes  # noqa: E402


def gather_bytes(config, vocab: int, devices, on: bool) -> tuple[dict, float]:
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.quant.gather_quantized_weights = on
  compiled, secs = compile_train_step(config, vocab, devices)
  return collective_bytes(compiled.as_text(), "all-gather"), secs


def main():
  devices = jax.devices()[:ARGS.devices]
  config = load_config(ARGS.config)
  if ARGS.batch_size:
    config.batch_size = ARGS.batch_size
  for key, value in parse_sets(ARGS.set):
    set_key(config, key, value)
  mib = 2.0**20
  rows = {}
  for on in (False, True):
    rows[on] = gather_bytes(config, ARGS.vocab, devices, on)
  before, after = rows[False][0], rows[True][0]
  total = lambda d: sum(d.values())
  # the high-precision gathers of the "off" program, at bf16's 2 bytes per element
  as_bf16 = sum(v // (4 if k == "f32" else 1) * (2 if k == "f32" else 1) for k, v in before.items())
  print(f"{ARGS.config}: mesh data {config.mesh.data} fsdp {config.mesh.fsdp} tensor "
        f"{config.mesh.tensor}, batch {config.batch_size} x {config.seq_len}, "
        f"{config.grad_accum_steps} microbatches, {len(devices)} devices, overrides "
        f"{ARGS.set or 'none'}, jax {jax.__version__}")
  print("| gather_quantized_weights | all-gather MiB per step per device | by dtype | compile s |")
  print("|---|---|---|---|")
  for on in (False, True):
    d, secs = rows[on]
    parts = ", ".join(f"{k} {v / mib:.0f}" for k, v in sorted(d.items()))
    print(f"| {on} | {total(d) / mib:.0f} | {parts} | {secs:.0f} |")
  print(f"after / before: {total(after) / total(before):.3f}; after / (before's gathers at bf16): "
        f"{total(after) / as_bf16:.3f} (goal <= 0.35)")
  if ARGS.record:
    gib = 2.0**30
    path = write_record(ARGS.record, {
        "before_gib": total(before) / gib, "after_gib": total(after) / gib,
        "after_uint8_gib": after.get("u8", 0) / gib, "after_f32_gib": after.get("f32", 0) / gib,
        "gather_vs_f32": total(after) / total(before), "gather_vs_bf16": total(after) / as_bf16,
        "before_bytes": total(before), "after_bytes": total(after),
        "before_as_bf16_bytes": as_bf16},
        notes=f"all-gather bytes per train step per device from the compiled HLO, "
              f"gather_quantized_weights off (before) and on (after); {len(devices)} devices, "
              f"overrides {ARGS.set or 'none'}")
    print(f"record: {path}")
  print(json.dumps({"config": ARGS.config, "devices": len(devices),
                    "before_bytes": total(before), "after_bytes": total(after),
                    "before_as_bf16_bytes": as_bf16, "before": before, "after": after}))


if __name__ == "__main__":
  main()
