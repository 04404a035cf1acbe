"""Any JAX function's GEMMs through lpjax's recipes, with no rewrite: `quantized(fn, policy)`.

`quantized` traces `fn` once to a jaxpr and evaluates it equation by equation, running every
`dot_general` and `conv_general_dilated` (what `jnp.dot`, `@`, `jnp.matmul`, `jnp.einsum`,
`lax.conv_general_dilated` and Flax's layers lower to) through `lpjax.quant.dot_general` /
`conv_general_dilated` with the recipe that `policy.recipe_for(path)` gives the call site, and
binding every other equation unchanged. It is the same GEMM path as lpjax's own layers
(`lpjax.nn`): one path, two ways in.

- Which operand is the weight is read from the data flow, not from argument order: an operand
  computed from a leaf of the weights argument (`weights_argnums`, by default the first: the
  params of `loss(params, batch)`) through layout-only ops (dtype casts, reshapes, transposes,
  slices of a stacked layer) is the weight, and it becomes the recipe's W (rhs): NVFP4's 16x16
  weight blocks, REUSE_FWD / from_fwd and the FP4 weight all-gather (`weight_axes`) apply to it.
- Paths and blocks: see `lpjax.quant.intercept.sites`. A scan whose inputs include stacked
  weights is a scan over blocks: its iteration is the block index (keys fold it in); when the
  policy keeps some blocks in high precision (keep_first / keep_last) such a scan is unrolled so
  that each block gets its own recipe, as lpjax's LLaMA unrolls its blocks then.
- Keys: one key per call (`quant_key=`), folded per site and block by `QuantPolicy.site_key`
  (the same derivation as lpjax's layers); a call site reached twice (a layer applied twice)
  gets its own key each time.
- Nested `jax.jit`, `jax.checkpoint` (`nn.remat`), `lax.scan` (`nn.scan`, `nnx.scan`) and
  `lax.cond` are rewritten inside; a GEMM inside a primitive that cannot be rewritten (a
  `custom_jvp` / `custom_vjp` function's body, a `while_loop`, `shard_map`) keeps its original
  op and is listed with the reason, as is a GEMM that cannot be attributed (integer operands or
  output, a weight multiplied by a weight, a weight with batch dimensions).

Examples:
  >>> import jax, jax.numpy as jnp
  >>> def mlp(params, x):
  ...   return jnp.tanh(x @ params["up"]["kernel"]) @ params["down"]["kernel"]
  >>> params = {"up": {"kernel": jnp.ones((64, 128))}, "down": {"kernel": jnp.ones((128, 64))}}
  >>> x = jnp.ones((8, 64))
  >>> qmlp = quantized(mlp, "mxfp4")
  >>> qmlp(params, x, quant_key=jax.random.key(0)).shape
  (8, 64)
  >>> print(report(qmlp, params, x, quant_key=jax.random.key(0)))   # doctest: +NORMALIZE_WHITESPACE
  path  op           lhs        rhs        weight  block  recipe  status
  up    dot_general  (8, 64)    (64, 128)  rhs            mxfp4   quantized
  down  dot_general  (8, 128)   (128, 64)  rhs            mxfp4   quantized
  2 GEMM call sites: 2 quantized, 0 high precision, 0 unchanged
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import warnings
from typing import Callable, Sequence

import jax

from lpjax.quant import backends, recipes
from lpjax.quant.gemm.dot_general import as_key
from lpjax.quant.recipes.gemm_recipe import GemmRecipe
from lpjax.quant.intercept import jax_compat
from lpjax.quant.intercept.evaluator import SITES_FOUND, STACKED_FOUND, Run, Scope, Weight
from lpjax.quant.intercept.sites import Report
from lpjax.quant.policy import QuantPolicy, param_path


# The key `report` lends to the calls it traces (None otherwise): nothing is computed, so a
# stochastic-rounding recipe needs no key of the caller's (a real call still does).
_TRACE_ONLY_KEY: contextvars.ContextVar = contextvars.ContextVar("lpjax_trace_key", default=None)
# The policies of the interceptions traced by `report` (their rules are checked against the sites)
_POLICIES_FOUND: contextvars.ContextVar[list | None] = contextvars.ContextVar("lpjax_policies",
                                                                               default=None)


def as_policy(policy) -> QuantPolicy:
  """A QuantPolicy, or a recipe name / GemmRecipe for every GEMM (the default keeps applying)."""
  if isinstance(policy, QuantPolicy):
    return policy
  if isinstance(policy, (str, GemmRecipe)):
    return QuantPolicy(recipe=recipes.get(policy))
  raise TypeError(f"policy must be a QuantPolicy, a recipe name or a GemmRecipe, got "
                  f"{type(policy).__name__} {policy!r}.")


def _weight_leaves(args, weights_argnums: Sequence[int]):
  """{flat leaf index: parameter path} of the leaves of the weight arguments."""
  out, offset = {}, 0
  for i, a in enumerate(args):
    leaves = jax.tree_util.tree_flatten_with_path(a)[0]
    if i in weights_argnums:
      for j, (kp, _) in enumerate(leaves):
        out[offset + j] = param_path(kp)  # the one naming of lpjax (QuantPolicy's paths)
    offset += len(leaves)
  return out


def _is_array(x) -> bool:
  return (isinstance(x, jax.Array) or hasattr(x, "__jax_array__")
          or (hasattr(x, "dtype") and hasattr(x, "shape")))


def _check_weights_argument(args, weights_argnums, weight_paths: dict):
  """Refuses a weights argument that is missing, and warns when it holds no named parameter (a
  bare array, e.g. the input passed where the params belong): its leaves would all be "the
  weight" with an empty path, and the next GEMM would be taken for attention."""
  missing = [i for i in weights_argnums if i >= len(args)]
  if missing:
    raise TypeError(f"weights_argnums={weights_argnums} names argument(s) {missing}, but the call "
                    f"has {len(args)} positional argument(s): pass the params positionally, or "
                    "set quantized(fn, ..., weights_argnums=...) to the params' position.")
  if weight_paths and not any(weight_paths.values()):
    warnings.warn(
        f"The weights argument (weights_argnums={weights_argnums}) holds no named parameter, only "
        f"bare arrays: they are taken as the weights and every other operand as an activation. "
        "If the params are another argument, set quantized(fn, ..., weights_argnums=<its "
        "position>); if they are this one, pass them as a dict ({'dense': {'kernel': w}}) so "
        "that the report and the policy see their names.", UserWarning, stacklevel=4)


def run(fn: Callable, policy: QuantPolicy, args: tuple, kwargs: dict, *, quant_key=None,
        weights_argnums: Sequence[int] = (0,), weight_axes: dict | None = None,
        num_blocks: int | None = None, scope_root: str = ""):
  """`fn(*args, **kwargs)` with its GEMMs through `policy` (the engine of `quantized`);
  `scope_root`: the first name scope of every equation (a linen model's), left out of paths."""
  if quant_key is None:  # `report` traces only: a recipe that rounds stochastically gets a key
    quant_key = _TRACE_ONLY_KEY.get()
  weights_argnums = tuple(weights_argnums)
  weight_paths = _weight_leaves(args, weights_argnums)
  _check_weights_argument(args, weights_argnums, weight_paths)
  flat_fn, dynamic, dyn_vals = _with_static_arguments(fn, args, kwargs)
  closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*dyn_vals)
  weights = {pos: Weight(weight_paths[i]) for pos, i in enumerate(dynamic) if i in weight_paths}
  if num_blocks is None:
    num_blocks = _count_blocks(policy, weight_paths.values(), closed.jaxpr, weights)
  engine = Run(policy, as_key(quant_key), dict(weight_axes or {}), num_blocks, scope_root)
  policies = _POLICIES_FOUND.get()
  if policies is not None:
    policies.append(policy)
  outs = engine.evaluate(closed.jaxpr, closed.consts, dyn_vals, weights, Scope())
  return jax.tree.unflatten(jax.tree.structure(out_shape), outs)


def _count_blocks(policy: QuantPolicy, paths, jaxpr, weights) -> int | None:
  """The model's number of blocks: distinct block indices in the parameter paths, else the
  length of a scan over stacked weights (None: no blocks)."""
  found = {policy.block_index(p) for p in paths} - {None}
  if found:
    return max(found) + 1
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "scan":
      scan = jax_compat.scan_params(eqn)
      ins = [i for i, v in enumerate(jaxpr.invars) if i in weights]
      xs = eqn.invars[scan.num_consts + scan.num_carry:]
      if any(v in xs for v in (jaxpr.invars[i] for i in ins)):
        return scan.length
  return None


def quantized(fn: Callable, policy="bf16", *, weights_argnums: int | Sequence[int] = 0,
              weight_axes: dict | None = None) -> Callable:
  """`fn` with every GEMM inside it quantized by `policy` (a QuantPolicy or a recipe name).

  Args:
    fn: any JAX function, e.g. `loss(params, batch)` or `apply(params, x)`.
    policy: a `QuantPolicy` (regex rules over paths, the default high-precision list, kept
      first / last blocks, `pure`, `residuals`, `forward_only`), a preset name or a GemmRecipe.
    weights_argnums: the argument(s) whose leaves are the weights (default: the first).
    weight_axes: {parameter path: logical axes of a 2-D (K, N) weight}, for the FP4 weight
      all-gather under `lpjax.quant.weight_sharding` (the trainer fills it in under fsdp).

  Returns:
    `g(*args, quant_key=None, **kwargs)`: `fn`'s result; `quant_key` is the step's key for
    stochastic rounding and RHT signs (folded per call site and block; required by recipes that
    round stochastically). Works under jit, grad, vmap, checkpoint and scan.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> loss = lambda w, x: jnp.sum(jnp.tanh(x @ w["dense"]["kernel"]) ** 2)
    >>> w = {"dense": {"kernel": jnp.full((32, 16), 0.5)}}
    >>> qloss = quantized(loss, "mxfp4_naive")
    >>> g = jax.jit(jax.grad(qloss))(w, jnp.ones((4, 32)))
    >>> g["dense"]["kernel"].shape
    (32, 16)
  """
  _refuse_models(fn)
  policy = as_policy(policy)
  argnums = (weights_argnums,) if isinstance(weights_argnums, int) else tuple(weights_argnums)

  @functools.wraps(fn)
  def wrapped(*args, quant_key=None, **kwargs):
    return run(fn, policy, args, kwargs, quant_key=quant_key, weights_argnums=argnums,
               weight_axes=weight_axes)

  wrapped.lpjax_policy = policy
  return wrapped


def _refuse_models(fn):
  """`quantized` takes a function: a Flax module (which some model adapter takes) is refused with
  the pointer to `quantize_model`."""
  if getattr(fn, "lpjax_policy", None) is not None or isinstance(fn, type):
    return
  backends.MODEL_ADAPTERS.load_all()
  for name, adapter in backends.MODEL_ADAPTERS.items():
    try:
      taken = adapter(fn, QuantPolicy()) is not NotImplemented
    except Exception:  # noqa: BLE001  (an adapter that refuses it otherwise: not its kind)
      taken = False
    if taken:
      raise TypeError(
          f"quantized() takes a JAX function; {type(fn).__name__} is a {name} model: use "
          f"lpjax.quant.quantize_model(model, policy) (it returns the model with the same "
          f"init / apply or call), or quantized(fn, policy) on a function that takes the params "
          f"first, e.g. quantized(model.apply, policy) for linen.")


def _with_static_arguments(fn, args, kwargs):
  """(call, dynamic, values): `call(*values)` is `fn(*args, **kwargs)` with only the array leaves
  (and tracers) as arguments; the others (Python numbers, strings, callables) stay static, as
  they are in the call itself. `dynamic`: the flat leaf index of each value."""
  leaves, treedef = jax.tree.flatten((args, kwargs))
  dynamic = [i for i, x in enumerate(leaves) if _is_array(x)]

  def call(*dyn):
    full = list(leaves)
    for i, x in zip(dynamic, dyn):
      full[i] = x
    a, kw = jax.tree.unflatten(treedef, full)
    return fn(*a, **kw)

  return call, dynamic, [leaves[i] for i in dynamic]


def _eval_shape(target, args, kwargs):
  """`jax.eval_shape` of `target(*args, **kwargs)`, its non-array arguments static."""
  call, _, values = _with_static_arguments(target, args, kwargs)
  return jax.eval_shape(call, *values)


@contextlib.contextmanager
def collect_sites():
  """Collects the `Site`s of every interception traced within the block (a list, appended to)."""
  found: list = []
  token = SITES_FOUND.set(found)
  try:
    yield found
  finally:
    SITES_FOUND.reset(token)


def stacked_weights(fn: Callable, *args, **kwargs) -> set[str]:
  """The parameter paths that a scan over blocks slices in one call of an intercepted function
  or model (stacked layers: optimizers keep their per-tensor statistics per layer there)."""
  target = getattr(fn, "lpjax_report_target", fn)
  found: set = set()
  token = STACKED_FOUND.set(found)
  try:
    _eval_shape(target, args, kwargs)
  finally:
    STACKED_FOUND.reset(token)
  return found


def report(fn: Callable, *args, **kwargs) -> Report:
  """The GEMM call sites of one call of an intercepted function or model, traced abstractly
  (nothing is computed): path, operand shapes, which operand is the weight, the recipe, and the
  sites left unchanged with the reason. `fn` is what `quantized` / `quantize_model` returned
  (a linen model's `apply` or the model itself; an NNX model), called with its usual arguments.
  A recipe that rounds stochastically needs no `quant_key` here: the trace is lent one (nothing
  is drawn). The report also lists the traced policies' rules that match no site
  (`Report.unmatched_rules`; `Report.check_rules()` raises on them).

  Examples:
    >>> import jax.numpy as jnp
    >>> f = quantized(lambda w, x: x @ w["up"]["kernel"], QuantPolicy(recipe="mxfp4", rules=(
    ...     ("^up/kernel$", "bf16"),)))
    >>> rep = report(f, {"up": {"kernel": jnp.ones((64, 32))}}, jnp.ones((8, 64)))
    >>> print(str(rep).splitlines()[-1])
    rule '^up/kernel$' -> bf16 matches no site (nearest site paths: up; a site's path is its layer's, without the parameter's name: drop the trailing '/kernel')
  """
  target = getattr(fn, "lpjax_report_target", fn)
  policies: list = []
  key_token = _TRACE_ONLY_KEY.set(jax.random.key(0))
  policy_token = _POLICIES_FOUND.set(policies)
  try:
    with collect_sites() as found:
      _eval_shape(target, args, kwargs)
  finally:
    _POLICIES_FOUND.reset(policy_token)
    _TRACE_ONLY_KEY.reset(key_token)
  rules = []
  for policy in policies:
    rules += [r for r in policy.rules if r not in rules]
  return Report(tuple(found), rules=tuple(rules))


def quantize_model(model, policy="bf16", **kwargs):
  """A Flax linen or NNX `model` with every GEMM inside it quantized by `policy`.

  The framework adapters register themselves in `lpjax.quant.backends.MODEL_ADAPTERS` (this
  package imports no Flax; `lpjax.nn` provides "linen" and "nnx"); see `lpjax.nn.quantize_model`
  for the arguments and what it returns.
  """
  policy = as_policy(policy)
  backends.MODEL_ADAPTERS.load_all()
  for adapter in backends.MODEL_ADAPTERS.values():
    wrapped = adapter(model, policy, **kwargs)
    if wrapped is not NotImplemented:
      return wrapped
  raise TypeError(f"quantize_model takes a Flax linen or NNX module, got {type(model).__name__}; "
                  "for a plain JAX function use lpjax.quant.quantized(fn, policy).")
