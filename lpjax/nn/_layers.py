"""Flax NNX layers whose matmuls / convolutions run through a GEMM recipe.

Each layer picks its recipe at trace time: from `policy.recipe_for(path)` when it has a policy
(`apply_policy(model, policy)` sets the policy and each layer's path), else from its own `recipe`.
Stochastic rounding and RHT signs take a fresh key per call from the layer's RNG stream (the
"quant" stream of the `nnx.Rngs` it was built with, falling back to "default"; or `key=` at call
time). With `collect_stats=True` a layer sows the numerics statistics of its forward operands
(`lpjax.quant.operand_stats`) as `nnx.Intermediate` "quant_stats"; collect them with
`nnx.capture`. They are computed beside the GEMM and never change its result.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from flax import nnx
  >>> layer = QDense(64, 32, recipe="mxfp4", rngs=nnx.Rngs(params=0, quant=1))
  >>> nnx.jit(lambda m, x: m(x))(layer, jnp.ones((4, 64))).shape   # a new SR key per call
  (4, 32)
  >>> layer = QDense(64, 32, recipe="mxfp4_naive", collect_stats=True, rngs=nnx.Rngs(0))
  >>> forward = nnx.jit(lambda m, x: nnx.capture(m, nnx.Intermediate)(x))
  >>> y, inter = forward(layer, jnp.ones((4, 64)))
  >>> sorted(inter["quant_stats"][0])
  ['lhs', 'rhs']
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import dtypes, initializers

from lpjax import quant
from lpjax.quant import GemmRecipe, QuantPolicy, path_str
from lpjax.quant.monitor import observer as monitor

default_kernel_init = initializers.lecun_normal()
default_bias_init = initializers.zeros_init()


class _Quantized(nnx.Module):
  """Recipe, policy, path, RNG stream and statistics shared by the quantized layers."""

  def _setup_quant(self, recipe, policy, path, collect_stats, rngs):
    self.recipe = recipe  # GemmRecipe or preset name (used when policy is None)
    self.policy = policy  # QuantPolicy or None
    self.path = path  # this layer's module path, for the policy
    self.collect_stats = collect_stats
    if isinstance(rngs, nnx.Rngs):
      stream = rngs["quant"] if "quant" in rngs else (rngs["default"] if "default" in rngs else None)
    else:
      stream = rngs
    self.quant_rngs = stream.fork() if stream is not None else nnx.data(None)

  def active_recipe(self) -> GemmRecipe:
    """The recipe this layer runs now (the policy's, else its own `recipe`)."""
    if self.policy is not None:
      return self.policy.recipe_for(self.path)
    return quant.get_recipe(self.recipe)

  def site_key(self, key, block=None):
    """This layer's key for one step's `key`: `QuantPolicy.site_key` of its path and `block` (the
    derivation that the interception, `lpjax.quant.quantize_model`, gives the same GEMM)."""
    policy = self.policy if self.policy is not None else QuantPolicy()
    monitor.note_block(self.path, block)  # for lpjax.quant.site_stats (nothing otherwise)
    return policy.site_key(key, self.path, block)

  def _key(self, recipe: GemmRecipe, key):
    if key is not None or recipe.is_high_precision:
      return key
    if self.quant_rngs is None:
      if recipe.needs_key:
        raise ValueError(f"{type(self).__name__} at {self.path!r}: recipe {recipe} needs random "
                         "keys; build the layer with nnx.Rngs(quant=...) or pass key=.")
      return None
    return self.quant_rngs()

  def _init_bias(self, use_bias, bias_init, n, param_dtype, rngs):
    return nnx.Param(bias_init(rngs.params(), (n,), param_dtype)) if use_bias else nnx.data(None)

  def _prepare(self, x, key, kernel=None):
    """(x, kernel, bias) promoted to the layer's dtype, the active recipe and its key; `kernel`
    (None: the layer's own) is the kernel's value as the caller already has it."""
    bias = self.bias[...] if self.bias is not None else None
    kernel = self.kernel[...] if kernel is None else kernel
    x, kernel, bias = dtypes.promote_dtype((x, kernel, bias), dtype=self.dtype)
    recipe = self.active_recipe()
    return x, kernel, bias, recipe, self._key(recipe, key)

  def _monitored(self, recipe: GemmRecipe):
    """The context of this layer's GEMM: measured as site `path` by lpjax.quant.site_stats."""
    return monitor.layer_site(self.path, recipe,
                              self.policy.num_blocks if self.policy is not None else None)

  def _sow_stats(self, stats_fn):
    if self.collect_stats:
      self.sow(nnx.Intermediate, "quant_stats", jax.lax.stop_gradient(stats_fn()))


class QDense(_Quantized):
  """nnx.Linear with its GEMMs quantized: y = x @ kernel (+ bias), kernel (in_features, out_features)."""

  def __init__(self, in_features: int, out_features: int, *, use_bias: bool = True, dtype=None,
               param_dtype=jnp.float32, kernel_init=default_kernel_init,
               bias_init=default_bias_init, recipe="bf16", policy: QuantPolicy | None = None,
               path: str = "", collect_stats: bool = False, kernel_axes=None, rngs: nnx.Rngs):
    self.in_features, self.out_features = in_features, out_features
    # logical axes of the kernel, e.g. ("embed", "mlp"): under FSDP (`quant.weight_sharding`) a
    # quantized kernel is then gathered as FP4 codes + scales (`quant.dot_general(rhs_axes=)`)
    self.kernel_axes = tuple(kernel_axes) if kernel_axes is not None else None
    self.dtype, self.param_dtype = dtype, param_dtype
    self.kernel = nnx.Param(kernel_init(rngs.params(), (in_features, out_features), param_dtype))
    self.bias = self._init_bias(use_bias, bias_init, out_features, param_dtype, rngs)
    self._setup_quant(recipe, policy, path, collect_stats, rngs)

  def __call__(self, x, *, key=None, kernel=None):
    """x @ kernel (+ bias); `kernel`: another (in, out) kernel than the layer's own (a tied
    LM head's embedding table)."""
    x, kernel, bias, recipe, key = self._prepare(x, key, kernel)
    dn = (((x.ndim - 1,), (0,)), ((), ()))
    self._sow_stats(lambda: quant.operand_stats(x, kernel, dn, recipe, key=key))
    with self._monitored(recipe):
      y = quant.dot_general(x, kernel, dn, recipe, key=key, rhs_axes=self.kernel_axes)
    return y if bias is None else y + bias

  def columns(self, x, start, size: int, *, key=None, kernel=None):
    """`self(x)[..., start:start + size]` without the other columns: the kernel's columns from
    `start` (an int or a traced scalar, e.g. a loop index) through a high-precision recipe (a
    block-scaled recipe would quantize a slice differently from the whole kernel). `kernel`: the
    layer's kernel as the caller prepared it outside a loop over slices, e.g. gathered once with
    `quant.gather_weight(layer.kernel[...], layer.kernel_axes)` (None: the layer's own).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from flax import nnx
      >>> layer = QDense(8, 6, rngs=nnx.Rngs(0))
      >>> x = jnp.ones((2, 8))
      >>> bool(jnp.allclose(layer.columns(x, 2, 3), layer(x)[:, 2:5]))
      True
    """
    x, kernel, bias, recipe, key = self._prepare(x, key, kernel)
    if not recipe.is_high_precision:
      raise ValueError(f"QDense at {self.path!r}: columns() needs a high-precision recipe, the "
                       f"layer runs {recipe}; a slice of a block-scaled kernel is quantized with "
                       "other scales than the whole kernel.")
    kernel = jax.lax.dynamic_slice_in_dim(kernel, start, size, axis=1)
    dn = (((x.ndim - 1,), (0,)), ((), ()))
    y = quant.dot_general(x, kernel, dn, recipe, key=key)
    return y if bias is None else y + jax.lax.dynamic_slice_in_dim(bias, start, size)


class QEinsum(_Quantized):
  """A two-operand einsum through a recipe.

  With `kernel_shape`: `layer(x)` computes einsum(einsum_str, x, kernel) (+ bias), like
  nnx.Einsum. Without: `layer(a, b)` multiplies two activations (e.g. the attention products,
  named "attn_scores" / "attn_values" so that the default policy keeps them in bf16).
  """

  def __init__(self, einsum_str: str, kernel_shape: Sequence[int] | None = None,
               bias_shape: Sequence[int] | None = None, *, dtype=None, param_dtype=jnp.float32,
               kernel_init=default_kernel_init, bias_init=default_bias_init, recipe="bf16",
               policy: QuantPolicy | None = None, path: str = "", collect_stats: bool = False,
               rngs: nnx.Rngs):
    self.einsum_str = einsum_str.replace(" ", "")
    self.dtype, self.param_dtype = dtype, param_dtype
    self.kernel = (nnx.Param(kernel_init(rngs.params(), tuple(kernel_shape), param_dtype))
                   if kernel_shape is not None else nnx.data(None))
    self.bias = (nnx.Param(bias_init(rngs.params(), tuple(bias_shape), param_dtype))
                 if bias_shape is not None else nnx.data(None))
    self._setup_quant(recipe, policy, path, collect_stats, rngs)

  def __call__(self, a, b=None, *, key=None):
    if self.kernel is not None:
      if b is not None:
        raise TypeError("This QEinsum has a kernel: call it with one operand.")
      b = self.kernel[...]
    elif b is None:
      raise TypeError("This QEinsum has no kernel: call it with two operands.")
    bias = self.bias[...] if self.bias is not None else None
    a, b, bias = dtypes.promote_dtype((a, b, bias), dtype=self.dtype)
    recipe = self.active_recipe()
    key = self._key(recipe, key)
    self._sow_stats(lambda: quant.einsum_operand_stats(self.einsum_str, a, b, recipe, key=key))
    with self._monitored(recipe):
      y = quant.einsum(self.einsum_str, a, b, recipe=recipe, key=key)
    return y if bias is None else y + bias


def _tuple(v, n: int) -> tuple[int, ...]:
  return (v,) * n if isinstance(v, int) else tuple(v)


class QConv(_Quantized):
  """nnx.Conv (channels-last inputs (N, *spatial, C), kernel (*kernel_size, C / groups, out))
  whose three GEMMs run through the recipe (`lpjax.quant.conv_general_dilated`, im2col)."""

  def __init__(self, in_features: int, out_features: int, kernel_size: int | Sequence[int], *,
               strides: int | Sequence[int] = 1, padding: Any = "SAME",
               input_dilation: int | Sequence[int] = 1, kernel_dilation: int | Sequence[int] = 1,
               feature_group_count: int = 1, use_bias: bool = True, dtype=None,
               param_dtype=jnp.float32, kernel_init=default_kernel_init,
               bias_init=default_bias_init, recipe="bf16", policy: QuantPolicy | None = None,
               path: str = "", collect_stats: bool = False, rngs: nnx.Rngs):
    self.kernel_size = _tuple(kernel_size, 1 if isinstance(kernel_size, int) else len(kernel_size))
    n = len(self.kernel_size)
    self.strides, self.padding = _tuple(strides, n), padding
    self.input_dilation, self.kernel_dilation = _tuple(input_dilation, n), _tuple(kernel_dilation, n)
    self.feature_group_count = feature_group_count
    self.dtype, self.param_dtype = dtype, param_dtype
    if in_features % feature_group_count:
      raise ValueError(f"in_features {in_features} is not divisible by feature_group_count "
                       f"{feature_group_count}.")
    shape = self.kernel_size + (in_features // feature_group_count, out_features)
    self.kernel = nnx.Param(kernel_init(rngs.params(), shape, param_dtype))
    self.bias = self._init_bias(use_bias, bias_init, out_features, param_dtype, rngs)
    self._setup_quant(recipe, policy, path, collect_stats, rngs)

  def __call__(self, x, *, key=None):
    x, kernel, bias, recipe, key = self._prepare(x, key)
    n = len(self.kernel_size)
    spatial = "DHW"[-n:] if n <= 3 else None
    if spatial is None:
      raise ValueError("QConv supports 1-3 spatial dimensions.")
    dn = ("N" + spatial + "C", spatial + "IO", "N" + spatial + "C")
    padding = self.padding.upper() if isinstance(self.padding, str) else self.padding
    if isinstance(padding, int):
      padding = [(padding, padding)] * n
    self._sow_stats(lambda: quant.conv_operand_stats(
        x, kernel, self.strides, padding, lhs_dilation=self.input_dilation,
        rhs_dilation=self.kernel_dilation, feature_group_count=self.feature_group_count,
        recipe=recipe, key=key))
    with self._monitored(recipe):
      y = quant.conv_general_dilated(
          x, kernel, self.strides, padding, lhs_dilation=self.input_dilation,
          rhs_dilation=self.kernel_dilation, dimension_numbers=dn,
          feature_group_count=self.feature_group_count, recipe=recipe, key=key)
    return y if bias is None else y + bias


QUANTIZED_LAYERS = (QDense, QEinsum, QConv)


def apply_policy(model: nnx.Module, policy: QuantPolicy) -> list[tuple[str, str]]:
  """Gives every quantized layer of `model` the policy and its module path.

  Returns [(path, recipe name)] for logging.
  """
  out = []
  for path, module in nnx.iter_modules(model):
    if isinstance(module, QUANTIZED_LAYERS):
      module.policy = policy
      module.path = path_str(path)
      out.append((module.path, str(policy.recipe_for(module.path))))
  return out


def layer_report(model: nnx.Module, *, scanned: Sequence[str] = ()) -> quant.Report:
  """The GEMM call sites of `model`'s quantized layers under the policy `apply_policy` gave
  them, as `lpjax.quant.report` lists an intercepted model's (what `quant_report.txt` holds for
  lpjax's own models): path, weight shape (the input is not traced: "()"), block, recipe and
  status; the policy's rules ride along (`Report.unmatched_rules`). `scanned`: paths of scanned
  stacks of blocks (their layers' block is "scan": one path for all blocks).

  Examples:
    >>> layer = QDense(64, 32, policy=QuantPolicy(recipe="mxfp4"), path="up", rngs=nnx.Rngs(0))
    >>> print(layer_report(layer))   # doctest: +NORMALIZE_WHITESPACE
    path  op           lhs  rhs       weight  block  recipe  status
    up    dot_general  ()   (64, 32)  rhs            mxfp4   quantized
    1 GEMM call sites: 1 quantized, 0 high precision, 0 unchanged
  """
  sites, rules = [], ()
  for _, module in nnx.iter_modules(model):
    if not isinstance(module, QUANTIZED_LAYERS):
      continue
    path, policy = module.path, module.policy if module.policy is not None else QuantPolicy()
    rules = rules + tuple(r for r in policy.rules if r not in rules)
    recipe = module.active_recipe()
    kernel = getattr(module, "kernel", None)
    stacked = any(path == s or path.startswith(s + "/") for s in scanned)
    index = None if stacked else policy.block_index(path)
    block = "scan" if stacked else "" if index is None else str(index)
    kept = recipe.is_high_precision and policy.kept_high_precision(path, block=index)
    sites.append(quant.Site(
        path=path, op="conv_general_dilated" if isinstance(module, QConv) else "dot_general",
        lhs_shape=(), rhs_shape=tuple(kernel.shape) if kernel is not None else (),
        weight="rhs" if kernel is not None else "none",
        weight_path=f"{path}/kernel" if kernel is not None else None, block=block,
        recipe=str(recipe), status="high precision" if recipe.is_high_precision else "quantized",
        reason="kept by the policy" if kept else ""))
  return quant.Report(tuple(sites), rules=rules)
