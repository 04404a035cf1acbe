"""Which machine a training run ran on, so that a sweep never compares runs from two machines.

The same config and seed do not train to the same loss on two machines: XLA generates different
code for another CPU (vector width, library kernels), thread count or jax version, and float32
rounding differences grow over a run. Measured with the recipes sweep's reference row (LLaMA-tiny,
FP32 Adam, 1000 steps, seed 0, the same commit): final eval loss 1.7820 on one 2-core CPU, 1.7537
on another (AVX-512), a gap as large as the differences between the FP4 recipes. A row and its
reference must therefore come from one machine; `benchmarks/sweeps/ablate.py` records the fingerprint
below with every run and its report leaves out (and names) runs from another machine than the
reference run of their seed.

The fingerprint is read without starting a JAX backend (no GPU memory is taken by the process that
plans a sweep).

Examples:
  >>> m = fingerprint()
  >>> sorted(m) == ["cores", "cpu", "gpus", "jax", "jaxlib", "platforms", "xla_flags"]
  True
  >>> same_machine(m, dict(m)), same_machine(m, {**m, "cpu": "another"}), same_machine(m, None)
  (True, False, True)
"""

from __future__ import annotations

import functools
import glob
import importlib.metadata
import os
import platform

# XLA flags that only make the virtual devices visible do not change a one-device run's code.
_NEUTRAL_FLAG_PREFIXES = ("--xla_force_host_platform_device_count",)


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def _gpu_models() -> list[str]:
  """NVIDIA GPU models from the driver's /proc entries (empty without an NVIDIA driver)."""
  models = []
  for path in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
    try:
      with open(path) as f:
        models += [line.split(":", 1)[1].strip() for line in f if line.startswith("Model:")]
    except OSError:
      continue
  return models


def _version(package: str) -> str:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return ""


@functools.lru_cache(maxsize=None)
def usable_cores() -> int:
  """The cores this process may run on, read once per process (at its first run).

  XLA's CPU client sizes its thread pool when it starts, so pinning a running worker to fewer
  cores later (`taskset`) does not change what its runs execute with: the first reading is the
  one that describes them.
  """
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    return os.cpu_count() or 0


def fingerprint() -> dict:
  """What decides the code XLA runs: CPU model, usable cores, GPUs, jax/jaxlib, platforms, flags."""
  cores = usable_cores()
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith(_NEUTRAL_FLAG_PREFIXES)]
  return {"cpu": _cpu_model(), "cores": cores, "gpus": _gpu_models(), "jax": _version("jax"),
          "jaxlib": _version("jaxlib"), "platforms": os.environ.get("JAX_PLATFORMS", ""),
          "xla_flags": " ".join(sorted(flags))}


def same_machine(a: dict | None, b: dict | None) -> bool:
  """Whether two recorded fingerprints are the same machine; a run recorded before fingerprints
  existed (None) is taken to match anything, since nothing can be said about it."""
  if a is None or b is None:
    return True
  return all(a.get(k) == b.get(k) for k in a.keys() | b.keys())


def describe(m: dict | None) -> str:
  """A short human-readable form: 'Intel Xeon ..., 2 cores, jax 0.10.2'."""
  if m is None:
    return "unknown machine"
  gpus = f", {len(m['gpus'])}x {m['gpus'][0]}" if m.get("gpus") else ""
  return f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores{gpus}, jax {m.get('jax', '?')}"
