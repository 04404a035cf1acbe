"""Per-device memory of a LLaMA train step, AOT-compiled from ShapeDtypeStructs (nothing allocated).

    python benchmarks/memory/llama_memory.py --config=configs/llama_1b_mxfp4.py --devices=8
    python benchmarks/memory/llama_memory.py --config=configs/llama_1b_mxfp4.py --devices=8 --remat=off

Compiles the config's train step and, as the baseline, the same model and mesh with FP32 Adam,
no quantization (recipe fp32), float32 parameters, optimizer state and gradient accumulators,
and the whole logits at once, and reports XLA's memory analysis per device: arguments +
temporaries + outputs - aliased (donated) buffers. The last output line is a JSON object with
`per_device_bytes` and `baseline_per_device_bytes`. On CPU the numbers are XLA:CPU's buffer
assignment for the same program; a GPU backend schedules differently, so treat them as an
estimate of the GPU footprint, not a measurement of it. `--remat` forces block rematerialization
on or off in both programs. The steps are traced with the activation sharding hints, as the
trainer's are. Results and the breakdown: docs/results.md, "Memory". `--record [NAME]` also writes
the figures the docs state (GiB per device, the baseline's, the ratio) to
docs/results/records/<NAME>.json (benchmarks/common/records.py), e.g. `--licm=off --record=llama_memory_1b`.

`--licm=off` removes an XLA:CPU artifact. XLA:CPU has no bfloat16 arithmetic: it converts bf16
values to float32, and while-loop-invariant code motion then hoists the converts of the layer
scan's stacked bf16 residuals out of the backward loop, so float32 copies of every layer's saved
activations are live at once. A GPU computes in bf16 natively and has no such converts. The
float32 baseline has none either, so its figure barely moves; the bf16 program's drops to what it
saves. Use it to estimate a GPU's footprint from CPU; report which setting a figure used.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys


sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", d)
                for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/
from llama_step import add_step_arguments, compile_train_step, load_config  # noqa: E402
from records import add_record_argument, write_record  # noqa: E402


def _parse():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  add_step_arguments(p)
  p.add_argument("--remat", choices=("config", "on", "off"), default="config",
                 help="block rematerialization of both programs: the config's, or forced on/off")
  p.add_argument("--licm", choices=("on", "off"), default="on",
                 help="off: disable XLA's while-loop-invariant code motion, removing an XLA:CPU "
                      "artifact that inflates bf16 programs (see the module docstring)")
  p.add_argument("--skip_baseline", action="store_true")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="a config override of the measured program (not the baseline), e.g. "
                      "--set model.param_dtype=bfloat16; repeatable")
  add_record_argument(p, "llama_memory")
  return p.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:  # before jax is imported
  from cpu_devices import use_virtual_cpu_devices
  use_virtual_cpu_devices(ARGS.devices, *(["--xla_disable_hlo_passes=while-loop-invariant-code-"
                                           "motion"] if ARGS.licm == "off" else []))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from ablate_sweeps import parse_sets, set_key  # noqa: E402


def shard_bytes(tree, dtype=None) -> int:
  """Bytes one device holds of a tree of ShapeDtypeStructs (each with its sharding), each leaf in
  its own dtype or in `dtype`."""
  return sum(math.prod(a.sharding.shard_shape(a.shape)) * jnp.dtype(dtype or a.dtype).itemsize
             for a in jax.tree.leaves(tree))


def per_device_bytes(config, vocab: int, devices) -> tuple[int, dict, float]:
  """(XLA's per-device bytes, its parts plus the state's breakdown, compile seconds).

  The breakdown: parameters and optimizer state are the step's arguments (their shards); the
  gradients are one copy of the parameters' shards in the parameters' dtypes and, with
  microbatches, the accumulators one more in `grad_accum_dtype`, both inside XLA's temporaries;
  "activations and other temporaries" is the rest of the temporaries (XLA's buffer assignment
  does not say which buffer is an activation).
  """
  compiled, compile_s, state = compile_train_step(config, vocab, devices, with_state=True)
  m = compiled.memory_analysis()
  parts = {"arguments": m.argument_size_in_bytes, "temporaries": m.temp_size_in_bytes,
           "outputs": m.output_size_in_bytes, "aliased": m.alias_size_in_bytes}
  total = parts["arguments"] + parts["temporaries"] + parts["outputs"] - parts["aliased"]
  accumulators = (shard_bytes(state.params, config.grad_accum_dtype)
                  if config.grad_accum_steps > 1 else 0)
  params = shard_bytes(state.params)
  parts.update(parameters=params, optimizer_state=shard_bytes(state.opt_state), gradients=params,
               accumulators=accumulators)
  parts["activations_and_other"] = parts["temporaries"] - parts["gradients"] - accumulators
  return total, parts, compile_s


def baseline_of(config):
  """The FP32 Adam baseline of `config`: the same model, batch, mesh, remat and microbatches with
  Adam as the AdamW configs run it (global-norm clipping at 1.0, whatever the config's optimizer
  uses), no quantization and float32 throughout."""
  base = config.copy_and_resolve_references()
  with base.unlocked():
    base.quant.recipe = "fp32"
    base.quant.residuals = ""
    base.optimizer.name = "adam"
    base.optimizer.grad_clip = 1.0  # not the FP4 configs' Stable-SPAM settings (clipping off)
    base.optimizer.total_steps = 0
    base.optimizer.state_dtype = "float32"
    base.model.compute_dtype = "float32"
    base.model.param_dtype = "float32"
    base.model.vocab_chunks = 0
    base.grad_accum_dtype = "float32"
    base.quant.gather_quantized_weights = False
  return base


def main():
  devices = jax.devices()[:ARGS.devices]
  config = load_config(ARGS.config)
  if ARGS.batch_size:
    config.batch_size = ARGS.batch_size
  if ARGS.remat != "config":
    config.model.remat = ARGS.remat == "on"
  gib = 2.0**30
  rows = []
  measured = config.copy_and_resolve_references()
  for key, value in parse_sets(ARGS.set):
    set_key(measured, key, value)
  total, parts, secs = per_device_bytes(measured, ARGS.vocab, devices)
  rows.append(("config", total, parts, secs))
  base_total = None
  if not ARGS.skip_baseline:
    base_total, base_parts, base_secs = per_device_bytes(baseline_of(config), ARGS.vocab, devices)
    rows.append(("FP32 Adam, no quantization", base_total, base_parts, base_secs))
  print(f"{ARGS.config}: model {config.model.size}, batch {config.batch_size} x {config.seq_len}, "
        f"mesh data {config.mesh.data} fsdp {config.mesh.fsdp} tensor {config.mesh.tensor}, "
        f"remat {config.model.remat}, loop-invariant code motion {ARGS.licm}, "
        f"overrides {ARGS.set or 'none'}, "
        f"{len(devices)} devices, jax {jax.__version__}")
  print("| program | per device GiB | arguments | temporaries | outputs | aliased | compile s |")
  print("|---|---|---|---|---|---|---|")
  for name, t, p, s in rows:
    print(f"| {name} | {t / gib:.2f} | {p['arguments'] / gib:.2f} | {p['temporaries'] / gib:.2f} | "
          f"{p['outputs'] / gib:.2f} | {p['aliased'] / gib:.2f} | {s:.0f} |")
  print("\nBreakdown, GiB per device (arguments = parameters + optimizer state + the batch; "
        "temporaries = gradients + accumulators + activations and other temporaries):")
  print("| program | parameters | optimizer state | gradients | accumulators | activations and "
        "other temporaries |")
  print("|---|---|---|---|---|---|")
  for name, _, p, _ in rows:
    print(f"| {name} | {p['parameters'] / gib:.2f} | {p['optimizer_state'] / gib:.2f} | "
          f"{p['gradients'] / gib:.2f} | {p['accumulators'] / gib:.2f} | "
          f"{p['activations_and_other'] / gib:.2f} |")
  result = {"config": ARGS.config, "devices": len(devices), "remat": bool(config.model.remat),
            "licm": ARGS.licm == "on", "per_device_bytes": int(total),
            "baseline_per_device_bytes": int(base_total) if base_total is not None else None,
            "breakdown": {name: {k: int(v) for k, v in p.items()} for name, _, p, _ in rows}}
  if base_total:
    result["ratio"] = total / base_total
    print(f"ratio to baseline: {total / base_total:.3f} (goal <= 0.6); fits a 40 GB A100: "
          f"{total < 40e9}")
  if ARGS.record:
    figures = {"per_device_gib": total / gib, "arguments_gib": parts["arguments"] / gib,
               "temporaries_gib": parts["temporaries"] / gib, "per_device_bytes": int(total)}
    if base_total:
      figures.update(baseline_gib=base_total / gib, ratio=total / base_total,
                     baseline_per_device_bytes=int(base_total))
    path = write_record(ARGS.record, figures, notes=(
        f"XLA's per-device memory (arguments + temporaries + outputs - aliased) of the train step "
        f"vs FP32 Adam; {len(devices)} devices, remat {config.model.remat}, loop-invariant code "
        f"motion {ARGS.licm}, overrides {ARGS.set or 'none'}"))
    print(f"record: {path}")
  print(json.dumps(result))  # the last line
  sys.stdout.flush()


if __name__ == "__main__":
  main()
