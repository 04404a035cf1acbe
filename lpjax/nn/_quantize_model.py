"""`quantize_model` for Flax: a linen or NNX model, unchanged, with every GEMM through a policy.

The interception itself (`lpjax.quant.quantized`) knows no Flax; this module adapts the two Flax
APIs to it: the weights are the model's `nnx.Param`s (NNX) or its "params" collection (linen),
and their paths are the module paths the policy matches ("layers/0/mlp/up_proj").
It registers them as the "linen" and "nnx" model adapters of `lpjax.quant.backends`, through
which `lpjax.quant.quantize_model` reaches them.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from flax import linen as nn, nnx
  >>> from lpjax import quant
  >>> class MLP(nnx.Module):
  ...   def __init__(self, rngs):
  ...     self.up, self.down = nnx.Linear(64, 128, rngs=rngs), nnx.Linear(128, 64, rngs=rngs)
  ...   def __call__(self, x):
  ...     return self.down(jax.nn.gelu(self.up(x)))
  >>> qmodel = quant.quantize_model(MLP(nnx.Rngs(0)), "mxfp4", rngs=nnx.Rngs(quant=1))
  >>> qmodel(jnp.ones((8, 64))).shape   # a fresh stochastic-rounding key per call
  (8, 64)
  >>> [s.path for s in quant.report(qmodel, jnp.ones((8, 64))).quantized]
  ['up', 'down']
  >>> dense = quant.quantize_model(nn.Dense(32), "mxfp4_naive")   # linen: init / apply as before
  >>> variables = dense.init(jax.random.key(0), jnp.ones((4, 64)))
  >>> dense.apply(variables, jnp.ones((4, 64))).shape
  (4, 32)
"""

from __future__ import annotations

from typing import Any

import jax
from flax import linen as nn
from flax import nnx

from lpjax.quant import QuantPolicy, backends
from lpjax.quant.intercept.entry_points import as_policy, run


class QuantizedModel(nnx.Module):
  """An NNX model whose calls run every GEMM through `policy` (see `quantize_model`)."""

  def __init__(self, model: nnx.Module, policy: QuantPolicy, *, rngs=None,
               weight_axes: dict | None = None):
    self.model = model
    self.policy = policy
    self.weight_axes = dict(weight_axes or {})
    stream = None
    if isinstance(rngs, nnx.Rngs):
      stream = rngs["quant"] if "quant" in rngs else (rngs["default"] if "default" in rngs else None)
    elif rngs is not None:
      stream = rngs
    self.quant_rngs = stream.fork() if stream is not None else nnx.data(None)

  def __call__(self, *args, quant_key=None, **kwargs):
    """`model(*args, **kwargs)` with quantized GEMMs; `quant_key` (default: the next key of the
    "quant" stream given at construction) is this call's stochastic-rounding / RHT key."""
    if quant_key is None and self.quant_rngs is not None:
      quant_key = self.quant_rngs()
    out, state = self._run(args, kwargs, quant_key)
    nnx.update(self.model, state)
    return out

  def _run(self, args, kwargs, quant_key):
    graphdef, params, rest = nnx.split(self.model, nnx.Param, ...)

    def call(params, rest, *a, **kw):
      model = nnx.merge(graphdef, params, rest)
      out = model(*a, **kw)
      return out, nnx.state(model, nnx.Not(nnx.Param))  # parameters are not written back

    return run(call, self.policy, (params, rest) + tuple(args), kwargs, quant_key=quant_key,
               weights_argnums=(0,), weight_axes=self.weight_axes)

  def lpjax_report_target(self, *args, quant_key=None, **kwargs):
    """A call that leaves the model's state alone (what `lpjax.quant.report` traces)."""
    if quant_key is None and self.quant_rngs is not None:
      quant_key = jax.random.key(0)  # only traced, never drawn from the stream
    return self._run(args, kwargs, quant_key)[0]


class QuantizedLinen:
  """A linen model whose `apply` runs every GEMM through `policy`; `init` is the model's own
  (parameters do not depend on the recipe). Other attributes are the model's."""

  def __init__(self, model: nn.Module, policy: QuantPolicy, weight_axes: dict | None = None):
    self.module = model
    self.policy = policy
    self.weight_axes = dict(weight_axes or {})

  def init(self, rngs, *args, **kwargs):
    return self.module.init(rngs, *args, **kwargs)

  def init_with_output(self, rngs, *args, **kwargs):
    return self.module.init_with_output(rngs, *args, **kwargs)

  def apply(self, variables, *args, rngs: Any = None, quant_key=None, **kwargs):
    """`model.apply` with quantized GEMMs. The key: `quant_key`, else `rngs["quant"]`."""
    rngs = dict(rngs) if isinstance(rngs, dict) else rngs
    if quant_key is None and isinstance(rngs, dict) and "quant" in rngs:
      quant_key = rngs.pop("quant")
    variables = dict(variables)
    params = variables.pop("params", {})
    module = self.module

    def call(params, others, *a, **kw):
      if rngs is not None:
        kw["rngs"] = rngs
      return module.apply({"params": params, **others}, *a, **kw)

    return run(call, self.policy, (params, variables) + tuple(args), kwargs,
               quant_key=quant_key, weights_argnums=(0,), weight_axes=self.weight_axes,
               scope_root=type(module).__name__)

  @property
  def lpjax_report_target(self):
    return self.apply

  def __call__(self, *args, **kwargs):
    """Refused: a linen model runs through `init` / `apply`, and inside a larger linen model the
    parent's apply holds the parameters; quantize the whole model, rules choose the part."""
    name = type(self.module).__name__
    raise TypeError(
        f"A quantize_model linen model ({name}) is not a module to call inside another linen "
        f"model: call its init / apply, or quantize the outer model and choose the quantized part "
        f"with rules, e.g. quantize_model(Outer(), QuantPolicy(recipe='fp32', "
        f"rules=((r'(^|/)encoder(/|$)', 'mxfp4'),))): layers no rule matches run as written "
        f"(recipe 'fp32'), the matched ones in the rule's recipe.")

  def __getattr__(self, name):
    return getattr(self.__dict__["module"], name)

  def __repr__(self):
    return f"QuantizedLinen({self.module!r}, policy={self.policy!r})"


def quantize_model(model, policy="bf16", *, rngs=None, weight_axes: dict | None = None):
  """`model` (a Flax linen or NNX module) with every GEMM inside it quantized by `policy`.

  Args:
    model: a `flax.linen.Module` (unbound) or a `flax.nnx.Module`; it is not modified.
    policy: a `QuantPolicy` or a recipe name (`lpjax.quant.recipes.NAMES`).
    rngs: NNX only: `nnx.Rngs` whose "quant" (else "default") stream gives each call its
      stochastic-rounding key (or pass `quant_key=` to each call). Linen takes the key per call,
      as `apply(..., rngs={"quant": key})` or `quant_key=`.
    weight_axes: {parameter path: logical axes of a 2-D (K, N) weight} for the FP4 weight
      all-gather under `lpjax.quant.weight_sharding` (the trainer fills it in).

  Returns:
    NNX: a `QuantizedModel` (an nnx.Module holding `model`: nnx.jit / grad / split / optimizers
    see the same parameters, under the "model" attribute). Linen: a `QuantizedLinen` with the
    model's `init` and a quantized `apply`.
  """
  wrapped = _adapt_nnx(model, as_policy(policy), rngs=rngs, weight_axes=weight_axes)
  if wrapped is NotImplemented:
    wrapped = _adapt_linen(model, as_policy(policy), rngs=rngs, weight_axes=weight_axes)
  if wrapped is NotImplemented:
    raise TypeError(f"quantize_model takes a Flax linen or NNX module, got {type(model).__name__}; "
                    "for a plain JAX function use lpjax.quant.quantized(fn, policy).")
  return wrapped


def _adapt_nnx(model, policy: QuantPolicy, *, rngs=None, weight_axes: dict | None = None):
  """The "nnx" model adapter of lpjax.quant (NotImplemented for a model that is not NNX)."""
  if not isinstance(model, nnx.Module):
    return NotImplemented
  return QuantizedModel(model, policy, rngs=rngs, weight_axes=weight_axes)


def _adapt_linen(model, policy: QuantPolicy, *, rngs=None, weight_axes: dict | None = None):
  """The "linen" model adapter of lpjax.quant (NotImplemented for a model that is not linen)."""
  if not isinstance(model, nn.Module):
    return NotImplemented
  if rngs is not None:
    raise TypeError("A linen model takes its key per call: apply(..., rngs={'quant': key}).")
  return QuantizedLinen(model, policy, weight_axes)


# `lpjax.quant.quantize_model` finds these in its registry (declared at `import lpjax`).
backends.MODEL_ADAPTERS.register("nnx", _adapt_nnx)
backends.MODEL_ADAPTERS.register("linen", _adapt_linen)
