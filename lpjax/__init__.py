"""lpjax: low-precision training in JAX/Flax (MXFP4, NVFP4, FP8, INT4) and Stable-SPAM.

Submodules are imported lazily so that ``import lpjax.quant`` does not pull in Flax. This is also
where lpjax.quant's registries learn which higher package fills them (lpjax.quant names no package
above it): the Pallas kernels and the Flax model adapters are imported the first time quant needs
them (lpjax/quant/backends.py).

Examples:
  >>> import jax.numpy as jnp, lpjax
  >>> q = lpjax.quant.quantize(jnp.ones((4, 32)), "mxfp4")
  >>> q.codes.shape, q.scales.shape
  ((4, 16), (4, 1))
"""

import importlib

from lpjax.quant import backends as _backends

__version__ = "0.1.0"
_SUBMODULES = ("quant", "optim", "nn", "models", "data", "train", "pallas", "eval")


def __getattr__(name):
  if name in _SUBMODULES:
    return importlib.import_module(f"lpjax.{name}")
  raise AttributeError(f"module 'lpjax' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + list(_SUBMODULES))


# The providers of lpjax.quant's registries: importing each registers its entries.
_backends.KERNELS.provide("pallas", "lpjax.pallas")
_backends.MODEL_ADAPTERS.provide("nnx", "lpjax.nn")
_backends.MODEL_ADAPTERS.provide("linen", "lpjax.nn")
