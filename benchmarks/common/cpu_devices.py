"""Virtual CPU devices for the benchmarks; call before jax is imported (no jax import here)."""

from __future__ import annotations

import os


def use_virtual_cpu_devices(count: int, *extra_xla_flags: str) -> None:
  """JAX on the CPU (unless JAX_PLATFORMS says otherwise) with `count` devices, plus XLA flags."""
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  flags = [os.environ.get("XLA_FLAGS", ""), f"--xla_force_host_platform_device_count={count}",
           *extra_xla_flags]
  os.environ["XLA_FLAGS"] = " ".join(f for f in flags if f)
