"""A user's own Flax model in the trainer: `model.factory="package.module:build"`.

The factory returns a Flax NNX or linen module: for the LM task one mapping tokens (B, L) int32 to
logits (B, L, vocab), for classification one mapping images (B, H, W, C) to logits (B, classes).
It is called with the keyword arguments it accepts among `vocab_size`, `seq_len`, `num_classes`,
`image_shape`, `config` (the run's config) and, for NNX, `rngs` (an `nnx.Rngs` seeded by the
run's `seed`). Its GEMMs run through the run's `QuantPolicy` by interception
(`lpjax.quant.quantize_model`), so recipes, kept layers, stochastic-rounding keys, the precision
schedule and the FP4 weight all-gather apply as to lpjax's own models.

Sharding: a parameter's logical axes come from the model when it declares them, with lpjax's
logical names (embed, mlp, heads, vocab, norm): a `partition_rules` attribute of (regex over
parameter paths, axes) pairs as lpjax's models have, or `nnx.with_partitioning` /
`nn.with_logical_partitioning` metadata; otherwise FSDP over the largest dimension ("embed" on
that axis, which the mesh's fsdp axis splits). 2-D weights are gathered as FP4 codes and scales
under fsdp (`quant.gather_quantized_weights`), as lpjax's own layers are.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from flax import nnx
  >>> def build(vocab_size, rngs):
  ...   return nnx.Sequential(nnx.Embed(vocab_size, 32, rngs=rngs), nnx.Linear(32, vocab_size, rngs=rngs))
  >>> model = UserModel(build, dict(vocab_size=50), jnp.zeros((2, 8), jnp.int32))
  >>> params, state = model.init_variables(jax.random.key(0))
  >>> logits, _ = model.apply(params, state, jnp.zeros((2, 8), jnp.int32), model.policy_default,
  ...                         jax.random.key(1), train=True)
  >>> logits.shape, model.partition_rules[0][1]
  ((2, 8, 50), ('embed', None))
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Callable

import jax
from flax import linen as nn
from flax import nnx

from lpjax import quant
from lpjax.train import config as cfg_lib
from lpjax.train._sharding import LOGICAL_RULES, logical_axes_for

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


def _call_factory(factory: Callable, available: dict):
  params = inspect.signature(factory).parameters
  takes_all = any(p.kind == p.VAR_KEYWORD for p in params.values())
  kwargs = {k: v for k, v in available.items() if takes_all or k in params}
  model = factory(**kwargs)
  if not isinstance(model, (nn.Module, nnx.Module)):
    raise cfg_lib.ConfigError(f"model.factory returned {type(model).__name__}; it must return a "
                              "Flax linen or NNX module.")
  return model


class UserModel:
  """A factory's model as the trainer's tasks use it: init, apply through a policy, rules."""

  def __init__(self, factory: Callable, available: dict, example_input):
    self.factory, self.available, self.example = factory, dict(available), example_input
    self.policy_default = quant.QuantPolicy()
    probe = jax.eval_shape(lambda key: self._build(key)[1:], jax.random.key(0))
    self.kind = "nnx" if self._nnx else "linen"
    params, _ = probe
    self.partition_rules, self.weight_axes = _rules(params, self._names)
    self._graphdef = None
    self._stacked = None  # parameter paths of stacked layers, found on first use

  def _build(self, key):
    """(module, params, model_state) built from `key`."""
    available = dict(self.available)
    available["rngs"] = nnx.Rngs(key)
    model = _call_factory(self.factory, available)
    self._nnx = isinstance(model, nnx.Module)
    rules = getattr(model, "partition_rules", None)  # the model's own (regex, logical axes)
    if self._nnx:
      self._names = _nnx_axis_names(model)
      graphdef, params, rest = nnx.split(model, nnx.Param, ...)
      self._graphdef = graphdef
      self._names.update(_axes_by_rules(params, rules))
      return model, params, (rest if jax.tree.leaves(rest) else None)
    self._linen = model
    variables = model.init(key, self.example)
    self._names = _linen_axis_names(variables.get("params", {}))
    variables = nn.meta.unbox(variables)
    params = variables.pop("params", {})
    self._names.update(_axes_by_rules(params, rules))
    return model, params, dict(variables) or None

  def init_variables(self, key):
    _, params, state = self._build(key)
    return params, state

  def stacked_layers(self, params):
    """True for the parameters that a scan over blocks slices (nnx.scan / nn.scan stacks), as
    the interception finds them in one abstract call; False elsewhere."""
    if self._stacked is None:
      key = jax.random.key(0)
      def call(params, state):
        if self._nnx:
          model = nnx.merge(self._graphdef, params, *([state] if state is not None else []))
          return quant.quantize_model(model, self.policy_default).lpjax_report_target(
              self.example, quant_key=key)
        return quant.quantize_model(self._linen, self.policy_default).apply(
            {"params": params, **(state or {})}, self.example, quant_key=key,
            **_mode_kwargs(self._linen, False))
      params_, state_ = jax.eval_shape(self.init_variables, key)
      self._stacked = quant.stacked_weights(call, params_, state_)
    return jax.tree_util.tree_map_with_path(lambda kp, _: _path(kp) in self._stacked, params)

  def apply(self, params, model_state, inputs, policy, key, *, train: bool):
    """(logits, new model_state) with every GEMM through `policy` (None: all high precision)."""
    policy = policy if policy is not None else self.policy_default
    if self._nnx:
      model = nnx.merge(self._graphdef, params, *([model_state] if model_state is not None else []))
      if not train:
        model.eval()
      qmodel = quant.quantize_model(model, policy, weight_axes=self.weight_axes)
      logits = qmodel(inputs, quant_key=key)
      return logits, (nnx.state(model, nnx.Not(nnx.Param)) if model_state is not None else None)
    qmodel = quant.quantize_model(self._linen, policy, weight_axes=self.weight_axes)
    variables = {"params": params, **(model_state or {})}
    mutable = list(model_state) if (train and model_state) else False
    out = qmodel.apply(variables, inputs, quant_key=key, mutable=mutable,
                       **_mode_kwargs(self._linen, train))
    if mutable:
      logits, new = out
      return logits, {**model_state, **new}
    return out, model_state


def _mode_kwargs(module, train: bool) -> dict:
  """linen's train / eval switch, by the model's own argument name (`train` or `deterministic`)."""
  params = inspect.signature(type(module).__call__).parameters
  if "train" in params:
    return {"train": train}
  if "deterministic" in params:
    return {"deterministic": not train}
  return {}


def _path(kp) -> str:
  names = []
  for k in kp:
    names.append(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))))
  if names and names[-1] in ("value", "raw_value"):
    names = names[:-1]
  return "/".join(names)


def _nnx_axis_names(model) -> dict:
  out = {}
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    meta = var.get_metadata() if hasattr(var, "get_metadata") else {}
    names = meta.get("out_sharding") or meta.get("sharding_names") or meta.get("sharding")
    if names and all(n is None or isinstance(n, str) for n in names):
      out["/".join(str(p) for p in path)] = tuple(names)
  return out


def _linen_axis_names(params) -> dict:
  out = {}
  flat = jax.tree_util.tree_flatten_with_path(
      params, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))[0]
  for kp, leaf in flat:
    if isinstance(leaf, nn.LogicallyPartitioned):
      out[_path(kp)] = tuple(leaf.names)
  return out


def _axes_by_rules(params, rules) -> dict:
  """{path: logical axes} of the parameters that a model's own `partition_rules` attribute
  ((regex, axes), as lpjax's models declare them) names."""
  if not rules:
    return {}
  out = {}
  for kp, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    path = _path(kp)
    axes = logical_axes_for(path, len(getattr(leaf, "shape", ())), rules)
    if any(a is not None for a in axes):
      out[path] = axes
  return out


def _rules(params, names: dict) -> tuple[tuple, dict]:
  """(partition rules {exact path regex: logical axes}, {path: axes of 2-D weights})."""
  rules, weight_axes = [], {}
  for kp, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    path, shape = _path(kp), tuple(getattr(leaf, "shape", ()))
    axes = names.get(path)
    if axes is None or len(axes) != len(shape) or not all(a is None or a in LOGICAL_RULES
                                                          for a in axes):
      axes = _fsdp_axes(shape)
    rules.append((rf"(^|/){re.escape(path)}(/value)?$", axes))
    if len(shape) == 2:
      weight_axes[path] = axes
  return tuple(rules), weight_axes


def _fsdp_axes(shape) -> tuple:
  """FSDP over the largest dimension; vectors (biases, norm scales) replicated."""
  if len(shape) < 2:
    return ("norm",) * len(shape)
  largest = max(range(len(shape)), key=lambda i: (shape[i], -i))
  return tuple("embed" if i == largest else None for i in range(len(shape)))


def user_model(config, available: dict, example_input) -> UserModel | None:
  """The UserModel of `config.model.factory` (None when it is empty: lpjax's own model)."""
  spec = config.model.get("factory", "")
  if not spec:
    return None
  return UserModel(load_factory(spec), {**available, "config": config}, example_input)

