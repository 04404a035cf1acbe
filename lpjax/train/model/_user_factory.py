"""A user's model factory (`model.factory="package.module:build"`): found, and called with the
keyword arguments it takes.

`load_factory` imports the function a spec names; `call_factory` calls it with those of the
trainer's arguments it accepts (`factory_kwargs`: `FACTORY_ARGS`, by keyword: `vocab_size`,
`seq_len`, `num_classes`, `image_shape`, `config` (the run's config) and, for NNX, `rngs`) and
checks that it returned a Flax linen or NNX module. Each problem is a ConfigError that names the
spec and the fix. lpjax/train/model/_user_model.py runs the model it returns.

Examples:
  >>> load_factory("json:dumps").__name__
  'dumps'
  >>> load_factory("json.dumps")
  Traceback (most recent call last):
  ...
  lpjax.train.schema._config_schema.ConfigError: model.factory='json.dumps': write 'package.module:fun...
"""

from __future__ import annotations

import importlib
import inspect
from typing import Callable

from flax import linen as nn
from flax import nnx

from lpjax.train import config as cfg_lib

FACTORY_ARGS = ("vocab_size", "seq_len", "num_classes", "image_shape", "config", "rngs")


def load_factory(spec: str) -> Callable:
  """"package.module:function" -> the function; a ConfigError that says what is wrong."""
  module_name, sep, attr = spec.partition(":")
  if not sep or not module_name or not attr:
    raise cfg_lib.ConfigError(f"model.factory={spec!r}: write 'package.module:function' (a "
                              "function that returns a Flax module), e.g. 'mypkg.models:build'.")
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise cfg_lib.ConfigError(f"model.factory={spec!r}: cannot import {module_name!r} ({e}). Is "
                              "its package installed, or its folder on PYTHONPATH?") from None
  fn = getattr(module, attr, None)
  if not callable(fn):
    raise cfg_lib.ConfigError(f"model.factory={spec!r}: {module_name} has no function {attr!r}.")
  return fn


def factory_kwargs(factory: Callable, available: dict, spec: str = "") -> dict:
  """The keyword arguments of `available` that `factory` takes (all of them for **kwargs); a
  ConfigError naming what the trainer passes when the factory needs an argument it does not.

  Examples:
    >>> factory_kwargs(lambda vocab_size, rngs=None: None, {"vocab_size": 5, "seq_len": 8})
    {'vocab_size': 5}
    >>> factory_kwargs(lambda vocab, dim: None, {"vocab_size": 5, "seq_len": 8}, "m:build")
    Traceback (most recent call last):
    ...
    lpjax.train.schema._config_schema.ConfigError: model.factory='m:build': <lambda>() needs the
    argument(s) vocab, dim, which the trainer does not pass. The trainer passes by keyword those
    of vocab_size, seq_len that the factory takes: ...
  """
  try:
    params = inspect.signature(factory).parameters
  except (TypeError, ValueError):  # no signature to read (a builtin): pass everything
    return dict(available)
  takes_all = any(p.kind == p.VAR_KEYWORD for p in params.values())
  by_name = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
  kwargs = {k: v for k, v in available.items()
            if takes_all or (k in params and params[k].kind in by_name)}
  missing = [name for name, p in params.items()
             if p.default is p.empty and name not in kwargs
             and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
  if missing:
    name = getattr(factory, "__name__", type(factory).__name__)
    raise cfg_lib.ConfigError(
        f"model.factory={spec!r}: {name}() needs the argument(s) {', '.join(missing)}, which the "
        f"trainer does not pass. The trainer passes by keyword those of {', '.join(available)} "
        "that the factory takes: rename the factory's arguments to these names, or give the "
        "others default values.")
  return kwargs


def call_factory(factory: Callable, available: dict, spec: str = ""):
  model = factory(**factory_kwargs(factory, available, spec))
  if not isinstance(model, (nn.Module, nnx.Module)):
    raise cfg_lib.ConfigError(f"model.factory returned {type(model).__name__}; it must return a "
                              "Flax linen or NNX module.")
  return model
