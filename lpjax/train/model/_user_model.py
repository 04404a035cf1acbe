"""A user's own Flax model in the trainer: `model.factory="package.module:build"`.

The factory returns a Flax NNX or linen module: for the LM task one mapping tokens (B, L) int32 to
logits (B, L, vocab), for classification one mapping images (B, H, W, C) to logits (B, classes).
It is called with the keyword arguments it accepts among `vocab_size`, `seq_len`, `num_classes`,
`image_shape`, `config` (the run's config) and, for NNX, `rngs` (an `nnx.Rngs` seeded by the
run's `seed`); a required argument outside these is a ConfigError that lists them. Its output
shape is checked with `jax.eval_shape` before anything compiles. Its GEMMs run through the run's
`QuantPolicy` by interception (`lpjax.quant.quantize_model` / `quantized`), so recipes, kept
layers, stochastic-rounding keys, the precision schedule and the FP4 weight all-gather apply as
to lpjax's own models.

Training and evaluation: the model runs as a pure function of (params, model state, inputs, key)
inside the jitted step. Its mutable variables (BatchNorm statistics: linen's non-"params"
collections, NNX's non-Param variables) are the run's model state, trained, checkpointed and
resumed with the parameters. Its rng streams come from the step's key, itself from (seed, step):
linen gets "dropout" (and any other stream, through linen's fallback to "params"); NNX's
`nnx.Rngs` streams (nnx.Dropout's) are redrawn each step and are not state. Evaluation is
deterministic: NNX runs in evaluation mode (`model.eval()`); linen gets `train=False` / `deterministic=True` by its
`__call__`'s (or its fields') own name, and no rng streams.

Sharding: a parameter's logical axes come from the model when it declares them, with lpjax's
logical names (embed, mlp, heads, vocab, norm): a `partition_rules` attribute of (regex over
parameter paths, axes) pairs as lpjax's models have, or `nnx.with_partitioning` /
`nn.with_logical_partitioning` metadata; otherwise FSDP over the largest dimension ("embed" on
that axis, which the mesh's fsdp axis splits). 2-D weights are gathered as FP4 codes and scales
under fsdp (`quant.gather_quantized_weights`), as lpjax's own layers are.

This module holds `UserModel` (the model built, its pure forward pass in training and evaluation,
its output checks) and `user_model`. The factory is found and called in
lpjax/train/model/_user_factory.py; the parameters' logical axes and partition rules come from
lpjax/train/model/_user_model_axes.py.

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

import dataclasses
import inspect
from typing import Callable, NamedTuple

import flax
import jax
from flax import linen as nn
from flax import nnx

from lpjax import quant
from lpjax.train.model import _user_model_axes as model_axes
from lpjax.train import config as cfg_lib
from lpjax.train.model._user_factory import (  # noqa: F401 (FACTORY_ARGS, factory_kwargs: re-exported)
    FACTORY_ARGS, call_factory, factory_kwargs, load_factory)

# linen's train / eval switches, by name, and the value that each takes in training
_MODE_NAMES = {"train": True, "training": True, "is_training": True, "deterministic": False,
               "use_running_average": False}
_RNG_TAG = 0x5EED  # fold_in tag of the model's own rng streams (dropout) from the step's key
_DROPOUT, _OTHER_STREAMS = 0, 1  # linen: "dropout" and "params" (every other stream falls back)


class Expected(NamedTuple):
  """The logits a task's loss takes, for a batch of 2 of the example input's rows."""

  axes: str  # what the task calls the output's axes: "(batch, seq_len, vocab_size)"
  shape: tuple  # the expected shape at batch 2: (2, 32, 257)
  size_key: str  # the config key that sets the last dimension: "model.vocab_size"


class UserModel:
  """A factory's model as the trainer's tasks use it: init, apply through a policy, rules.

  `expected`: the logits the task's loss takes (`Expected`); the model's output is checked
  against it with `jax.eval_shape` (training and evaluation mode) before anything is compiled.
  """

  def __init__(self, factory: Callable, available: dict, example_input, *, spec: str = "",
               expected: Expected | None = None, task: str = ""):
    self.factory, self.available, self.example = factory, dict(available), example_input
    self.spec, self.task = spec or getattr(factory, "__name__", "factory"), task
    self.policy_default = quant.QuantPolicy()
    self._graphdef = None
    self._rng_template = None  # NNX: the structure of the model's rng streams (nnx.RngState)
    probe = jax.eval_shape(lambda key: self._build(key)[1:], jax.random.key(0))
    self.kind = "nnx" if self._nnx else "linen"
    self.class_name = type(self._module).__name__
    params, state = probe
    self._abstract = probe
    self.partition_rules, self.weight_axes = model_axes.partition_rules(params, self._names)
    self._stacked = None  # parameter paths of stacked layers, found on first use
    if expected is not None:
      self._check_output(expected)

  def _build(self, key):
    """(module, params, model_state) built from `key`."""
    available = dict(self.available)
    available["rngs"] = nnx.Rngs(key)
    model = call_factory(self.factory, available, self.spec)
    self._nnx = isinstance(model, nnx.Module)
    self._module = model
    rules = getattr(model, "partition_rules", None)  # the model's own (regex, logical axes)
    if self._nnx:
      self._names = model_axes.nnx_axis_names(model)
      graphdef, params, rngs, rest = nnx.split(model, nnx.Param, nnx.RngState, ...)
      self._graphdef = graphdef
      # the rng streams (nnx.Dropout's) are not state: each step draws them from its own key
      self._rng_template = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), rngs)
      self._names.update(model_axes.axes_by_rules(params, rules))
      return model, params, (rest if jax.tree.leaves(rest) else None)
    self._linen = model
    variables = self._module_in(False).init(key, self.example, **_mode_kwargs(model, False))
    self._names = model_axes.linen_axis_names(variables.get("params", {}))
    variables = nn.meta.unbox(variables)
    params = variables.pop("params", {})
    self._names.update(model_axes.axes_by_rules(params, rules))
    return model, params, dict(variables) or None

  def init_variables(self, key):
    _, params, state = self._build(key)
    return params, state

  def describe(self) -> str:
    """"mypkg.models:build (NNX MyCNN)": what the log and results.json call the model."""
    return f"{self.spec} ({'NNX' if self._nnx else 'linen'} {self.class_name})"

  # --- the forward pass -------------------------------------------------------------------------

  def _module_in(self, train: bool):
    """The linen module with its train / eval fields set (a switch that is a module field, not a
    `__call__` argument: `MyModel(deterministic=...)`)."""
    fields = {f.name for f in dataclasses.fields(self._linen) if f.init}
    call_args = inspect.signature(type(self._linen).__call__).parameters
    for name, in_training in _MODE_NAMES.items():
      if name in fields and name not in call_args:
        return self._linen.clone(**{name: train if in_training else not train})
    return self._linen

  def _rng_state(self, key):
    """The NNX model's rng streams, drawn from `key` (the step's key): every step gets its own
    dropout masks, the same ones again when the step runs again after a resume."""
    leaves, treedef = jax.tree.flatten(self._rng_template)
    out = []
    for i, leaf in enumerate(leaves):
      if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        k = jax.random.fold_in(key, i)
        out.append(jax.random.split(k, leaf.shape) if leaf.shape else k)
      else:  # the streams' counters
        out.append(jax.numpy.zeros(leaf.shape, leaf.dtype))
    return treedef.unflatten(out)

  def forward(self, policy, *, train: bool) -> Callable:
    """f(params, model_state, inputs, key) -> (logits, new model_state): the model as a pure
    function, every GEMM through `policy` (None: the model's own GEMMs, no interception). `key`:
    the step's key, both the quantization's (stochastic rounding) and, folded, the model's
    dropout masks. Evaluation (`train=False`) is deterministic: NNX models run in evaluation mode (`.eval()`),
    linen models get no rng streams; both get `train=False` / `deterministic=True` when their
    `__call__` takes such an argument (by its own name)."""
    if self._nnx:
      return self._nnx_forward(policy, train)
    module = self._module_in(train)
    mode = _mode_kwargs(self._linen, train)
    qmodule = (quant.quantize_model(module, policy, weight_axes=self.weight_axes)
               if policy is not None else None)

    def f(params, model_state, inputs, key):
      variables = {"params": params, **(model_state or {})}
      mutable = list(model_state) if (train and model_state) else False
      kwargs = dict(mode, mutable=mutable)
      if train:  # "dropout", and any other stream a model asks for (linen falls back to "params")
        rng = jax.random.fold_in(key, _RNG_TAG)
        kwargs["rngs"] = {"dropout": jax.random.fold_in(rng, _DROPOUT),
                          "params": jax.random.fold_in(rng, _OTHER_STREAMS)}
      if qmodule is not None:
        out = qmodule.apply(variables, inputs, quant_key=key, **kwargs)
      else:
        out = module.apply(variables, inputs, **kwargs)
      if mutable:
        logits, new = out
        return logits, {**model_state, **new}
      return out, model_state
    return f

  def _nnx_forward(self, policy, train):
    graphdef = self._graphdef
    mode = _mode_kwargs(self._module, train)  # a `train` / `deterministic` argument, if any

    def call(params, model_state, rng_state, inputs):
      # merged and split in the same trace as the call: BatchNorm's statistics and the dropout
      # streams are written there, never into a module of an outer trace
      model = nnx.merge(graphdef, params, rng_state,
                        *([model_state] if model_state is not None else []))
      if not train:
        model.eval()
      logits = model(inputs, **mode)
      new = nnx.split(model, nnx.Param, nnx.RngState, nnx.Intermediate, ...)[-1]
      return logits, (new if model_state is not None else None)

    qcall = (quant.quantized(call, policy, weights_argnums=0, weight_axes=self.weight_axes)
             if policy is not None else None)

    def f(params, model_state, inputs, key):
      rng_state = self._rng_state(jax.random.fold_in(key, _RNG_TAG))
      if qcall is not None:
        return qcall(params, model_state, rng_state, inputs, quant_key=key)
      return call(params, model_state, rng_state, inputs)
    return f

  def apply(self, params, model_state, inputs, policy, key, *, train: bool):
    """(logits, new model_state) with every GEMM through `policy` (None: all high precision)."""
    policy = policy if policy is not None else self.policy_default
    return self.forward(policy, train=train)(params, model_state, inputs, key)

  def stacked_layers(self, params):
    """True for the parameters that a scan over blocks slices (nnx.scan / nn.scan stacks), as
    the interception finds them in one abstract call; False elsewhere."""
    if self._stacked is None:
      call = self.forward(self.policy_default, train=False)
      key = jax.random.key(0)
      self._stacked = quant.stacked_weights(lambda p, s: call(p, s, self.example, key),
                                            *self._abstract)
    return jax.tree_util.tree_map_with_path(
        lambda kp, _: model_axes.param_path(kp) in self._stacked, params)

  def report(self, policy) -> quant.Report:
    """The call sites of one training call with `policy` (`lpjax.quant.report`): which GEMMs
    are quantized, which kept in high precision, and why. Traced abstractly: nothing runs."""
    call = self.forward(policy, train=True)
    key = jax.random.key(0)
    return quant.report(lambda p, s: call(p, s, self.example, key), *self._abstract)

  # --- checks -----------------------------------------------------------------------------------

  def _check_output(self, expected: Expected):
    """A ConfigError unless the model maps a batch of 2 to the expected logits, in training and
    in evaluation mode (and evaluation draws no random numbers)."""
    axes, shape, size_key = expected
    x = jax.ShapeDtypeStruct((2,) + tuple(self.example.shape[1:]), self.example.dtype)
    key = jax.random.key(0)
    for train in (True, False):
      f = self.forward(None, train=train)
      try:
        out = jax.eval_shape(lambda p, s, x: f(p, s, x, key)[0], *self._abstract, x)
      except (flax.errors.InvalidRngError, flax.errors.ModifyScopeVariableError) as e:
        if train:
          raise
        raise cfg_lib.ConfigError(self._not_deterministic(e)) from None
      mode = "training" if train else "evaluation"
      inputs = f"inputs {x.shape} {x.dtype}"
      if not isinstance(out, jax.ShapeDtypeStruct):
        raise cfg_lib.ConfigError(
            f"model.factory={self.spec!r}: in {mode} the model returns a "
            f"{type(out).__name__} for {inputs}; the trainer needs one array of logits "
            f"{axes} = {shape}. Return the logits alone.")
      if tuple(out.shape) != tuple(shape):
        hint = ""
        if out.ndim == len(shape) and tuple(out.shape[:-1]) == tuple(shape[:-1]):
          hint = (f" The last dimension is {out.shape[-1]}, not {shape[-1]}: logits over more "
                  "or fewer classes than the data has would train on the wrong targets. Build "
                  "the output layer from the factory's argument; if the extra columns are "
                  f"deliberate (padding), set --config.{size_key}={out.shape[-1]}.")
        raise cfg_lib.ConfigError(
            f"model.factory={self.spec!r}: in {mode} the model maps {inputs} to logits "
            f"{tuple(out.shape)}; the {self.task} task expects "
            f"{axes} = {tuple(shape)}.{hint}")


  def _not_deterministic(self, error) -> str:
    """The message for a linen model that, in evaluation mode, still draws random numbers
    (dropout) or updates its statistics (BatchNorm): it has no switch the trainer knows."""
    what = str(error).split(" (https")[0].rstrip(".")
    if isinstance(error, flax.errors.InvalidRngError):
      return (f"model.factory={self.spec!r}: in evaluation the model still draws random numbers "
              f"({what}), so evaluation would not be deterministic. Give its __call__ a `train` "
              "(or `deterministic`) argument and pass it on, e.g. nn.Dropout(rate, "
              "deterministic=not train): the trainer passes train=True in training and "
              "train=False in evaluation.")
    return (f"model.factory={self.spec!r}: in evaluation the model still updates its statistics "
            f"({what}). Give its __call__ a `train` argument and pass it on, e.g. "
            "nn.BatchNorm(use_running_average=not train): the trainer passes train=True in "
            "training and train=False in evaluation.")


def _mode_kwargs(module, train: bool) -> dict:
  """linen's train / eval switch, by the model's own argument name (`train`, `deterministic`,
  `training`, `is_training`, `use_running_average`)."""
  params = inspect.signature(type(module).__call__).parameters
  for name, in_training in _MODE_NAMES.items():
    if name in params:
      return {name: train if in_training else not train}
  return {}



def user_model(config, available: dict, example_input,
               expected: Expected | None = None) -> UserModel | None:
  """The UserModel of `config.model.factory` (None when it is empty: lpjax's own model), its
  output checked against `expected`."""
  spec = config.model.get("factory", "")
  if not spec:
    return None
  return UserModel(load_factory(spec), {**available, "config": config}, example_input, spec=spec,
                   expected=expected, task=config.task)
