"""lpjax: low-precision training in JAX/Flax (MXFP4, NVFP4, FP8, INT4) and Stable-SPAM.

Submodules are imported lazily so that ``import lpjax.quant`` does not pull in Flax.

Examples:
  >>> import jax.numpy as jnp, lpjax
  >>> q = lpjax.quant.quantize(jnp.ones((4, 32)), "mxfp4")
  >>> q.codes.shape, q.scales.shape
  ((4, 16), (4, 1))
"""

import importlib

__version__ = "0.1.0"
_SUBMODULES = ("quant", "optim", "nn", "models", "data", "train", "pallas", "eval")


def __getattr__(name):
  if name in _SUBMODULES:
    return importlib.import_module(f"lpjax.{name}")
  raise AttributeError(f"module 'lpjax' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + list(_SUBMODULES))
