"""Which formats and shapes the kernels handle, argument checks, and where they run.

Examples:
  >>> from lpjax.quant.formats import specs as formats
  >>> unsupported_reason(formats.get_format("mxfp4")) is None
  True
  >>> unsupported_reason(formats.get_format("nvfp4_16x16"))
  'nvfp4_16x16 (16x16 tiles)'
  >>> resolve_interpret(None)  # no GPU here: interpret mode
  True
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

from lpjax.quant.formats import specs as formats
from lpjax.quant.formats import packing

SUPPORTED_FORMATS = ("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2", "nvfp4")
_SUPPORTED_TEXT = (f"{', '.join(SUPPORTED_FORMATS)} (and custom block formats with e8m0 or ue4m3 "
                   "scales, float elements and a power-of-two block size >= 2)")


def on_gpu() -> bool:
  """Whether JAX's default backend is a GPU (where the kernels compile with Triton)."""
  return jax.default_backend() == "gpu"


def resolve_interpret(interpret) -> bool:
  """interpret=None means: compile for the GPU when the default backend is one, else interpret."""
  return (not on_gpu()) if interpret is None else bool(interpret)


def unsupported_reason(fmt) -> str | None:
  """None when a kernel handles `fmt`; otherwise what it lacks, for an error message."""
  fmt = formats.get_format(fmt)
  name = fmt.name or "this format"
  if fmt.granularity != "block":
    return f"{name} (per-{fmt.granularity} scaling)"
  if fmt.tile:
    return f"{name} ({fmt.block_size}x{fmt.block_size} tiles)"
  if getattr(fmt, "fixed_scale_exponent", None) is not None:
    return f"{name} (a fixed scale exponent)"
  if fmt.scale not in ("e8m0", "ue4m3") or fmt.element.kind != "float":
    return f"{name} ({fmt.element.name} elements with {fmt.scale} scales)"
  b = fmt.block_size
  if b < 2 or b & (b - 1):
    return f"{name} (block size {b}, not a power of two >= 2)"
  return None


def check_supported(fmt):
  """Returns the QuantFormat, or raises NotImplementedError naming the supported formats."""
  fmt = formats.get_format(fmt)
  reason = unsupported_reason(fmt)
  if reason is not None:
    raise NotImplementedError(f"The Pallas kernels do not handle {reason}. Supported: "
                              f"{_SUPPORTED_TEXT}. Use impl='xla' (or 'auto') for this format.")
  return fmt


def check_options(fmt, rounding, scale_mode, key):
  """Validates the quantizer options as lpjax.quant.quantize does; returns (fmt, scale_mode)."""
  fmt = check_supported(fmt)
  formats.check_rounding(rounding)
  scale_mode = formats.check_scale_mode(fmt, scale_mode)
  if rounding == "stochastic" and key is None:
    raise ValueError("rounding='stochastic' needs an explicit key, e.g. key=jax.random.key(0).")
  return fmt, scale_mode


def check_input(x, what: str = "quantize"):
  """x as a float array the kernels can load (fp64 is first rounded to fp32, like the XLA path)."""
  dtype = jnp.result_type(x)
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"{what} needs a float array (bf16, fp16, fp32), got dtype {dtype}; cast it "
                    "first, e.g. x.astype(jnp.float32).")
  x = jnp.asarray(x)
  return x


def kernel_input(x):
  """The array handed to a kernel: bf16 / fp16 / fp32 as is, anything wider as fp32."""
  return x if x.dtype in (jnp.bfloat16, jnp.float16, jnp.float32) else x.astype(jnp.float32)


def normalize_axis(axis: int, shape, fmt) -> int:
  """The non-negative blocked axis; rejects scalars and empty arrays with a clear message."""
  if 0 in tuple(shape):
    raise ValueError(f"Cannot quantize an empty array (shape {tuple(shape)}): there is nothing to "
                     "scale. Skip the call for empty inputs.")
  if len(shape) == 0:
    raise ValueError(f"Format {fmt} scales blocks along an axis; got a scalar. Use a per-tensor "
                     "format (e.g. 'fp8_e4m3') or reshape to rank >= 1.")
  return packing.normalize_axis(axis, len(shape))


def _jax_version() -> tuple:
  return tuple(int(p) for p in jax.__version__.split(".")[:2] if p.isdigit())


# The GPU that a CPU machine lowers the kernels for from jax 0.11: compute capability 9.0, what
# jax 0.10's lowering falls back to without a GPU.
AOT_GPU_KIND = "NVIDIA H100 80GB HBM3"


def _has_gpu() -> bool:
  """Whether JAX has a GPU to lower for (the backend itself: tests that make `on_gpu` answer True
  to trace the kernels as a GPU would still lower for the abstract one)."""
  return jax.default_backend() == "gpu"


def _abstract_devices() -> bool:
  """Whether this jax lowers for an abstract device (an AbstractMesh with an AbstractDevice)."""
  try:
    jax.sharding.AbstractMesh((1,), ("x",), abstract_device=jax.sharding.AbstractDevice(
        device_kind=AOT_GPU_KIND, num_cores=132, platform="gpu"))
  except (AttributeError, TypeError):
    return False
  return hasattr(jax.sharding, "use_abstract_mesh")


def cuda_lowering_unavailable(version: tuple | None = None, gpu: bool | None = None,
                              abstract: bool | None = None) -> str | None:
  """None when `jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))` can lower the Triton
  kernels on this machine (inside `cuda_lowering_target()`); otherwise why not (the lowering
  tests skip with this reason).

  jax 0.10's Pallas-Triton lowering falls back to compute capability 9.0 when there is no GPU, so
  a CPU machine lowers for "cuda" as it is. From jax 0.11 the lowering asks for the GPU's
  information, from the default device or from the abstract device of the abstract mesh in
  context (`jax.sharding.use_abstract_mesh`, an ahead-of-time target): `cuda_lowering_target`
  names an H100 there (docs/pallas.md, "Newer JAX"). A jax without abstract devices needs a GPU.

  Examples:
    >>> cuda_lowering_unavailable(version=(0, 10), gpu=False) is None
    True
    >>> cuda_lowering_unavailable(version=(0, 12), gpu=False, abstract=True) is None
    True
    >>> cuda_lowering_unavailable(version=(0, 13), gpu=False, abstract=False)[:61]
    'jax 0.13 lowers Pallas-Triton kernels only for a GPU it knows'
  """
  version = _jax_version() if version is None else tuple(version)
  gpu = _has_gpu() if gpu is None else gpu
  if version < (0, 11) or gpu:
    return None
  if _abstract_devices() if abstract is None else abstract:
    return None
  version_text = ".".join(map(str, version))
  return (f"jax {version_text} lowers Pallas-Triton kernels only for a GPU it knows: "
          "its pallas_call lowering asks the default device, or an abstract mesh's AbstractDevice, "
          "for the compute capability (jax 0.10 fell back to 9.0), and this jax has no abstract "
          "devices; run these tests on a GPU machine")


def cuda_lowering_target():
  """The context in which the kernels lower for "cuda" on this machine: none on jax 0.10 or on a
  GPU; from jax 0.11 without a GPU, an abstract mesh whose device is an H100 (AOT_GPU_KIND), from
  which the Pallas-Triton lowering reads compute capability 9.0. Only tracing and lowering: an
  array computed inside the context fails (its device is abstract), so make the inputs first.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from lpjax import pallas
    >>> f = lambda x: pallas.quantize(x, "mxfp4", interpret=False)
    >>> x = jnp.zeros((32, 64))  # made outside: no array can be computed for an abstract device
    >>> with cuda_lowering_target():
    ...   lowered = jax.jit(f).trace(x).lower(lowering_platforms=("cuda",))
    >>> "xla.gpu.triton" in lowered.as_text()
    True
  """
  if _jax_version() < (0, 11) or _has_gpu():
    return contextlib.nullcontext()
  device = jax.sharding.AbstractDevice(device_kind=AOT_GPU_KIND, num_cores=132, platform="gpu")
  # an Auto axis: the mesh only names the device; its axis shards nothing (an Explicit one would
  # give every traced array a sharding type on it)
  return jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh(
      (1,), ("lowering",), axis_types=(jax.sharding.AxisType.Auto,), abstract_device=device))
