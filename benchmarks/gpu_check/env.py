"""Stage a: the environment. GPU model, compute capability, memory, driver / CUDA, versions of
jax, jaxlib and the jax plugins, and whether the optional packages are present."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess

OPTIONAL = ("tensorflow_datasets", "grain", "array_record", "tensorflow", "tensorboardX",
            "sentencepiece", "sklearn")


def _versions() -> dict:
  """Versions of jax, jaxlib and every installed distribution whose name starts with 'jax'."""
  out = {}
  for dist in importlib.metadata.distributions():
    name = (dist.metadata["Name"] or "").lower().replace("_", "-")
    if name.startswith("jax") or name in ("flax", "optax", "orbax-checkpoint", "ml-collections",
                                          "ml-dtypes", "numpy"):
      out[name] = dist.version
  return dict(sorted(out.items()))


def _nvidia_smi() -> str | None:
  if shutil.which("nvidia-smi") is None:
    return None
  try:
    return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                           "--format=csv,noheader"], capture_output=True, text=True,
                          timeout=20).stdout.strip() or None
  except (OSError, subprocess.SubprocessError):
    return None


def describe() -> dict:
  """What this machine is, as the report's Environment section shows it."""
  import jax

  devices = jax.devices()
  d = devices[0]
  stats = getattr(d, "memory_stats", lambda: None)() or {}
  info = dict(device_kind=d.device_kind, platform=d.platform, device_count=len(devices),
              process_count=jax.process_count(),
              compute_capability=getattr(d, "compute_capability", None),
              memory_gib=round(stats["bytes_limit"] / 2**30, 2) if "bytes_limit" in stats else None,
              python=platform.python_version(), machine=platform.machine())
  try:  # "PJRT C API cuda 12080" and the like; where the backend object lives moved across jax
    import jax.extend.backend
    backend = jax.extend.backend.get_backend()
    info["platform_version"] = " ".join(str(backend.platform_version).split())
  except Exception:  # noqa: BLE001 (a description, never a failure)
    info["platform_version"] = None
  info["nvidia_smi"] = _nvidia_smi()
  info["versions"] = {"jax": jax.__version__, **_versions()}
  info["optional_packages_missing"] = [m for m in OPTIONAL if importlib.util.find_spec(m) is None]
  for module in ("lpjax", "ml_collections"):  # the machine's, or the bundle's site folder
    spec = importlib.util.find_spec(module)
    info[f"{module}_from"] = (os.path.dirname(os.path.dirname(os.path.abspath(spec.origin)))
                              if spec and spec.origin else None)
  return info


def run(rec, dry_run: bool) -> None:
  info = describe()
  rec.data["info"] = info
  gpu = info["platform"] == "gpu"
  rec.figure("device", f"{info['device_kind']} x{info['device_count']}")
  if info["compute_capability"] is not None:
    rec.figure("compute capability", str(info["compute_capability"]))
  rec.figure("memory", info["memory_gib"], "GiB")
  rec.figure("jax", info["versions"].get("jax", "?"))
  rec.check("a GPU is the default backend", gpu or dry_run,
            f"default backend is {info['platform']}: jax found no GPU (is a CUDA jaxlib / "
            "jax-cuda plugin installed, and JAX_PLATFORMS not set to cpu?)")
  import lpjax  # noqa: F401  (the package imports in this environment)
  rec.check("lpjax imports", True)
  rec.check("ml_collections imports (stage f's configs)", info["ml_collections_from"] is not None,
            "not importable: on a machine without a package index, run with the offline bundle "
            "(make gpu-bundle here, make gpu-check BUNDLE=.. there; README)")
