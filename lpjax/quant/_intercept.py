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
- Paths and blocks: see `lpjax.quant._intercept_sites`. A scan whose inputs include stacked
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
import dataclasses
import functools
import importlib
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax.extend import core as jcore

from lpjax.quant import recipes
from lpjax.quant._conv import conv_general_dilated
from lpjax.quant._gemm import as_key, dot_general
from lpjax.quant._gemm_recipe import GemmRecipe
from lpjax.quant import _intercept_sites as sites_lib
from lpjax.quant._intercept_sites import HIGH_PRECISION, QUANTIZED, UNCHANGED, Report, Site
from lpjax.quant._policy import QuantPolicy, path_str

_GEMMS = ("dot_general", "conv_general_dilated")
# Ops that move or cast a weight without mixing it with anything: their result is still it.
_LAYOUT_OPS = {"convert_element_type", "reshape", "transpose", "copy", "copy_p", "squeeze",
               "expand_dims", "sharding_constraint", "mesh_cast", "slice", "dynamic_slice",
               "reduce_precision"}

# Ops with n operands and n results, the i-th result being the i-th operand (moved or pinned).
_PER_OPERAND_OPS = {"optimization_barrier", "device_put", "pvary", "pbroadcast"}

_SITES: contextvars.ContextVar[list | None] = contextvars.ContextVar("lpjax_sites", default=None)
# parameter paths that a scan over blocks slices (stacked layers), collected while tracing
_STACKED: contextvars.ContextVar[set | None] = contextvars.ContextVar("lpjax_stacked", default=None)


def as_policy(policy) -> QuantPolicy:
  """A QuantPolicy, or a recipe name / GemmRecipe for every GEMM (the default keeps applying)."""
  if isinstance(policy, QuantPolicy):
    return policy
  if isinstance(policy, (str, GemmRecipe)):
    return QuantPolicy(recipe=recipes.get(policy))
  raise TypeError(f"policy must be a QuantPolicy, a recipe name or a GemmRecipe, got "
                  f"{type(policy).__name__} {policy!r}.")


@dataclasses.dataclass(frozen=True)
class _Weight:
  path: str  # the parameter's path
  stacked: bool = False  # a scan slices its leading (block) axis


@dataclasses.dataclass(frozen=True)
class _Scope:
  """Where the evaluation is: the block (static int, traced index, or None), extra key folds
  (iterations of scans that are not over blocks), and the named scope prefix."""

  block: Any = None
  folds: tuple = ()
  names: str = ""  # the name stack of the equations that enclose this jaxpr

  def inside(self, eqn) -> "_Scope":
    stack = str(eqn.source_info.name_stack)
    return dataclasses.replace(self, names="/".join(p for p in (self.names, stack) if p))


class _Run:
  """One evaluation of a traced function: the policy, the step key and the sites it found."""

  def __init__(self, policy: QuantPolicy, key, weight_axes: dict, num_blocks: int | None,
               scope_root: str = ""):
    self.scope_root = scope_root
    if policy.num_blocks is None and num_blocks is not None:
      policy = policy.for_model(num_blocks=num_blocks)
    self.policy, self.key, self.weight_axes = policy, key, weight_axes
    self.sites: list[Site] = []
    self.calls: dict[str, int] = {}  # sites reached so far per (path, block): repeats get own keys

  # -- evaluation -------------------------------------------------------------------------------
  def evaluate(self, jaxpr, consts, args, weights: dict, scope: _Scope):
    """Evaluates `jaxpr` on `args`; `weights` maps its invars (positions) to _Weight."""
    env, wenv, feeds = {}, {}, {}

    def read(v):
      return v.val if isinstance(v, jcore.Literal) else env[v]

    def weight_of(v):
      return None if isinstance(v, jcore.Literal) else wenv.get(v)

    for v, x in zip(jaxpr.constvars, consts):
      env[v] = x
    for i, (v, x) in enumerate(zip(jaxpr.invars, args)):
      env[v] = x
      if i in weights:
        wenv[v] = weights[i]
    for eqn in jaxpr.eqns:
      invals = [read(v) for v in eqn.invars]
      name = eqn.primitive.name
      in_feeds = frozenset().union(*(feeds.get(v, frozenset()) for v in eqn.invars
                                     if not isinstance(v, jcore.Literal)))
      if name in _GEMMS:
        out, site = self._gemm(eqn, invals, [weight_of(v) for v in eqn.invars[:2]], in_feeds,
                               scope)
        outs = [out]
        for v in eqn.outvars:
          feeds[v] = frozenset({site})
      else:
        outs = self._other(eqn, invals, [weight_of(v) for v in eqn.invars], scope)
        for v in eqn.outvars:
          feeds[v] = in_feeds
        if name in _LAYOUT_OPS and eqn.invars and weight_of(eqn.invars[0]) is not None:
          for v in eqn.outvars:
            wenv[v] = wenv[eqn.invars[0]]
        elif name in _PER_OPERAND_OPS:  # n operands -> n results, each its operand
          for v_in, v_out in zip(eqn.invars, eqn.outvars):
            if weight_of(v_in) is not None:
              wenv[v_out] = wenv[v_in]
        else:
          computed = _computed_weight(eqn, weight_of)
          if computed is not None:
            for v in eqn.outvars:
              wenv[v] = computed
      for v, x in zip(eqn.outvars, outs):
        env[v] = x
    return [read(v) for v in jaxpr.outvars]

  def _other(self, eqn, invals, wrefs, scope: _Scope):
    name = eqn.primitive.name
    if not _has_gemm(eqn):
      return _bind(eqn, invals)
    params = eqn.params
    weights = {i: w for i, w in enumerate(wrefs) if w is not None}
    scope = scope.inside(eqn)
    if name in ("jit", "pjit", "closed_call", "core_call"):
      closed = params.get("jaxpr") or params.get("call_jaxpr")
      return self.evaluate(closed.jaxpr, closed.consts, invals, weights, scope)
    if "prevent_cse" in params and "jaxpr" in params:  # jax.checkpoint / nn.remat
      jaxpr = params["jaxpr"]
      fn = lambda *a: self.evaluate(jaxpr, (), a, weights, scope)
      return jax.checkpoint(fn, prevent_cse=params["prevent_cse"], policy=params["policy"])(*invals)
    if name == "scan":
      return self._scan(eqn, invals, weights, scope)
    if name == "cond":
      index, ops = invals[0], invals[1:]
      w = {i - 1: x for i, x in weights.items() if i > 0}
      branches = [functools.partial(self._closed, b, w, scope) for b in params["branches"]]
      return jax.lax.switch(index, branches, *ops)
    self._list_inner(eqn, scope, f"inside {name}: its body runs as written")
    return _bind(eqn, invals)

  def _closed(self, closed, weights, scope, *args):
    return self.evaluate(closed.jaxpr, closed.consts, args, weights, scope)

  def _scan(self, eqn, invals, weights, scope: _Scope):
    p = eqn.params
    nc, ncarry, length = p["num_consts"], p["num_carry"], p["length"]
    consts, carry, xs = invals[:nc], invals[nc:nc + ncarry], invals[nc + ncarry:]
    body = p["jaxpr"]
    inner = {i: w for i, w in weights.items() if i < nc}
    inner.update({i: _Weight(w.path, stacked=True) for i, w in weights.items() if i >= nc + ncarry})
    over_blocks = any(i >= nc + ncarry for i in weights)
    stacked = _STACKED.get()
    if stacked is not None:
      stacked.update(w.path for i, w in weights.items() if i >= nc + ncarry)
    if over_blocks and self.policy.varies_by_block:  # each block its own recipe: unroll
      order = range(length - 1, -1, -1) if p["reverse"] else range(length)
      ys = [None] * length
      for i in order:
        x_i = [x[i] for x in xs]
        out = self.evaluate(body.jaxpr, body.consts, [*consts, *carry, *x_i], inner,
                        dataclasses.replace(scope, block=i))
        carry, ys[i] = out[:ncarry], out[ncarry:]
      ys = [jnp.stack([y[j] for y in ys]) for j in range(len(body.jaxpr.outvars) - ncarry)]
      return [*carry, *ys]

    def step(c, x):
      i, c = c[0], c[1]
      s = (dataclasses.replace(scope, block=i) if over_blocks
           else dataclasses.replace(scope, folds=scope.folds + (i,)))
      out = self.evaluate(body.jaxpr, body.consts, [*consts, *c, *x], inner, s)
      return (i + 1, out[:ncarry]), out[ncarry:]

    start = jnp.asarray(length - 1 if p["reverse"] else 0, jnp.int32)
    if p["reverse"]:
      step_rev = step

      def step(c, x):  # noqa: F811  (the counter counts down)
        (_, c_out), y = step_rev(c, x)
        return (c[0] - 1, c_out), y
    (_, carry), ys = jax.lax.scan(step, (start, list(carry)), list(xs), length=length,
                                  reverse=p["reverse"], unroll=p["unroll"])
    return [*carry, *ys]

  # -- one GEMM ---------------------------------------------------------------------------------
  def _gemm(self, eqn, invals, wrefs, feeds, scope: _Scope):
    op = eqn.primitive.name
    lhs, rhs = invals[:2]
    wl, wr = wrefs
    weight = "both" if (wl and wr) else "rhs" if wr else "lhs" if wl else "none"
    wref = wr or wl
    block = scope.block
    if wref is not None:
      path = sites_lib.module_path(wref.path)
    else:
      path = self._activation_path(eqn, feeds, scope)
    if block is None:
      block = self.policy.block_index(path)
    static_block = block if isinstance(block, int) else None
    block_label = ("" if block is None else str(block) if static_block is not None else "scan")
    record = functools.partial(Site, path=path, op=op, lhs_shape=tuple(lhs.shape),
                               rhs_shape=tuple(rhs.shape), weight=weight,
                               weight_path=wref.path if wref else None, block=block_label)
    reason = self._unattributable(eqn, lhs, rhs, weight)
    if reason:
      self._add(record(recipe="", status=UNCHANGED, reason=reason))
      return _bind(eqn, invals)[0], path
    recipe = self.policy.recipe_for(path, block=static_block)
    if _is_identity(recipe, lhs, rhs, eqn.params.get("preferred_element_type")):
      self._add(record(recipe=str(recipe), status=UNCHANGED, reason="fp32 recipe: the original op"))
      return _bind(eqn, invals)[0], path
    hp = recipe.is_high_precision
    why = "" if not hp else ("kept by the policy" if self.policy.kept_high_precision(
        path, block=static_block) else "")
    count = self.calls.get((path, block_label), 0)
    self.calls[(path, block_label)] = count + 1
    key = self._site_key(path, block, count, scope)
    if key is None and recipe.needs_key:
      raise ValueError(f"GEMM at {path!r} runs recipe {recipe}, which rounds stochastically: pass "
                       "one key per step, quant_key=jax.random.key(...) (for an NNX model: "
                       "nnx.Rngs(quant=...) or quant_key=; for linen: rngs={'quant': key}).")
    self._add(record(recipe=str(recipe), status=HIGH_PRECISION if hp else QUANTIZED, reason=why))
    if op == "dot_general":
      return _quantized_dot(eqn, lhs, rhs, weight, recipe, key, self._axes(wref)), path
    return _quantized_conv(eqn, lhs, rhs, recipe, key), path

  def _unattributable(self, eqn, lhs, rhs, weight: str) -> str:
    pet = eqn.params.get("preferred_element_type")
    floats = all(jnp.issubdtype(x.dtype, jnp.floating) for x in (lhs, rhs))
    if not floats or (pet is not None and not jnp.issubdtype(pet, jnp.floating)):
      return "integer or non-float operands: not a quantizable GEMM"
    if weight == "both":
      return "both operands are parameters: write a rule or compute it outside"
    if eqn.primitive.name == "dot_general" and weight != "none":
      (_, _), (lb, rb) = eqn.params["dimension_numbers"]
      if (rb if weight == "rhs" else lb):
        return "a weight with batch dimensions (per-example weights)"
    if eqn.primitive.name == "conv_general_dilated":
      if eqn.params.get("batch_group_count", 1) != 1:
        return "batch_group_count > 1"
      if weight == "lhs":
        return "the weight is the convolution's input"
    return ""

  def _activation_path(self, eqn, feeds, outer: _Scope) -> str:
    scope = sites_lib.scope_of_name_stack(outer.inside(eqn).names, self.scope_root)
    if not scope:
      weight_feeds = [f for f in feeds if not _is_activation_site(f)]
      scope = sites_lib.common_path(sorted(weight_feeds))
    after = any(_is_activation_site(f) and f.rpartition("/")[0] == scope for f in feeds)
    name = "attn_values" if after else "attn_scores"
    return f"{scope}/{name}" if scope else name

  def _site_key(self, path, block, count: int, scope: _Scope):
    if self.key is None:
      return None
    key = self.policy.site_key(self.key, path, block=block)
    if count:
      key = jax.random.fold_in(key, 0x5A17 + count)  # a second call of one site
    for i in scope.folds:  # iterations of scans that are not over blocks
      key = jax.random.fold_in(key, i)
    return key

  def _axes(self, wref):
    return self.weight_axes.get(wref.path) if (wref is not None and not wref.stacked) else None

  def _add(self, site: Site):
    self.sites.append(site)
    collected = _SITES.get()
    if collected is not None:
      collected.append(site)

  def _list_inner(self, eqn, scope: _Scope, reason: str):
    """Lists the GEMMs inside a primitive that runs unchanged."""
    for sub in _inner_jaxprs(eqn):
      for inner in sub.eqns:
        if inner.primitive.name in _GEMMS:
          lhs, rhs = (v.aval for v in inner.invars[:2])
          path = sites_lib.scope_of_name_stack(scope.inside(inner).names,
                                               self.scope_root) or eqn.primitive.name
          self._add(Site(path=path, op=inner.primitive.name, lhs_shape=tuple(lhs.shape),
                         rhs_shape=tuple(rhs.shape), weight="?", weight_path=None, block="",
                         recipe="", status=UNCHANGED, reason=reason))
        elif _has_gemm(inner):
          self._list_inner(inner, scope.inside(inner), reason)


def _computed_weight(eqn, weight_of):
  """A weight computed from parameters alone (weight normalisation, a LoRA product, a scale
  folded in): the operands are all parameters (or literals), and the result is named after the
  largest of them."""
  refs = [(v, weight_of(v)) for v in eqn.invars if not isinstance(v, jcore.Literal)]
  if not refs or any(w is None for _, w in refs) or _has_gemm(eqn):
    return None
  return max(refs, key=lambda r: r[0].aval.size if hasattr(r[0].aval, "size") else 0)[1]


def _inner_jaxprs(eqn):
  out = []
  for v in eqn.params.values():
    for j in (v if isinstance(v, (tuple, list)) else (v,)):
      if isinstance(j, jcore.ClosedJaxpr):
        out.append(j.jaxpr)
      elif isinstance(j, jcore.Jaxpr):
        out.append(j)
  return out


def _has_gemm(eqn) -> bool:
  return any(_jaxpr_has_gemm(j) for j in _inner_jaxprs(eqn))


@functools.lru_cache(maxsize=4096)
def _jaxpr_has_gemm_cached(jaxpr) -> bool:
  return any(e.primitive.name in _GEMMS or _has_gemm(e) for e in jaxpr.eqns)


def _jaxpr_has_gemm(jaxpr) -> bool:
  try:
    return _jaxpr_has_gemm_cached(jaxpr)
  except TypeError:  # unhashable
    return any(e.primitive.name in _GEMMS or _has_gemm(e) for e in jaxpr.eqns)


def _is_activation_site(path: str) -> bool:
  return path.endswith("attn_scores") or path.endswith("attn_values")


def _bind(eqn, invals):
  """The equation as written (with its context: name scope, compute placement)."""
  params = eqn.primitive.get_bind_params(eqn.params)
  subfuns = []
  if isinstance(params, tuple):  # JAX before 0.7: (subfuns, params)
    subfuns, params = params
  ctx = getattr(getattr(eqn, "ctx", None), "manager", None)
  with ctx if ctx is not None else contextlib.nullcontext():
    out = eqn.primitive.bind(*subfuns, *invals, **params)
  return list(out) if eqn.primitive.multiple_results else [out]


def _is_identity(recipe: GemmRecipe, lhs, rhs, pet) -> bool:
  """A high-precision recipe that would compute exactly the original op (fp32 on fp32)."""
  if not recipe.is_high_precision:
    return False
  dt = recipe.compute_dtype
  return dt is None or (dt == jnp.float32 and lhs.dtype == rhs.dtype == jnp.float32)


def _natural(x, contracting, batch, first: bool) -> bool:
  """True when `x`'s contracting dims come right after its batch dims (first=True: the rhs of a
  row-major GEMM) or last (False: the lhs), so that the canonical GEMM needs no transpose."""
  free = [d for d in range(x.ndim) if d not in batch]
  k = len(contracting)
  return list(contracting) == (free[:k] if first else free[len(free) - k:])


def _quantized_dot(eqn, lhs, rhs, weight: str, recipe, key, rhs_axes):
  (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
  pet = eqn.params.get("preferred_element_type")
  if weight == "none":
    # Two activations: `jnp.einsum` may have put them in either order. Run them in the order
    # whose canonical GEMM needs no transposes (probabilities x values, not values x
    # probabilities): the order lpjax's own layers use, same bits and no transposed copy.
    as_is = _natural(lhs, lc, lb, False) + _natural(rhs, rc, rb, True)
    swapped = _natural(rhs, rc, rb, False) + _natural(lhs, lc, lb, True)
    weight = "lhs" if swapped > as_is else "none"
  if weight != "lhs":
    axes = rhs_axes if _plain_weight(rhs, rc, rb) else None
    return dot_general(lhs, rhs, ((lc, rc), (lb, rb)), recipe, key=key,
                       preferred_element_type=pet, rhs_axes=axes)
  # the weight (or the operand swapped in above) is the lhs: run it as the recipe's rhs, then
  # restore lax's (batch, lhs, rhs) order
  axes = rhs_axes if (rhs_axes is not None and _plain_weight(lhs, lc, lb)) else None
  y = dot_general(rhs, lhs, ((rc, lc), (rb, lb)), recipe, key=key, preferred_element_type=pet,
                  rhs_axes=axes)
  nb, n_act = len(lb), rhs.ndim - len(rc) - len(rb)
  n_w = lhs.ndim - len(lc) - len(lb)
  perm = list(range(nb)) + [nb + n_act + i for i in range(n_w)] + [nb + i for i in range(n_act)]
  return jnp.transpose(y, perm)


def _plain_weight(w, contracting, batch) -> bool:
  """A 2-D weight contracted on its first axis: the layout the FP4 weight gather takes."""
  return w.ndim == 2 and not batch and tuple(contracting) == (0,)


def _quantized_conv(eqn, lhs, rhs, recipe, key):
  p = eqn.params
  dn = p["dimension_numbers"]
  specs = (dn.lhs_spec, dn.rhs_spec, dn.out_spec) if dn is not None else None
  dn = jax.lax.ConvDimensionNumbers(*specs) if specs is not None else None
  return conv_general_dilated(lhs, rhs, p["window_strides"], p["padding"], p["lhs_dilation"],
                              p["rhs_dilation"], dn, p["feature_group_count"], recipe=recipe,
                              key=key, preferred_element_type=p.get("preferred_element_type"))


def _weight_leaves(args, weights_argnums: Sequence[int]):
  """{flat leaf index: parameter path} of the leaves of the weight arguments."""
  out, offset = {}, 0
  for i, a in enumerate(args):
    leaves = jax.tree_util.tree_flatten_with_path(a)[0]
    if i in weights_argnums:
      for j, (kp, _) in enumerate(leaves):
        names = [_key_name(k) for k in kp]
        if names and type(kp[-1]).__name__ == "GetAttrKey" and names[-1] in ("value", "raw_value"):
          names = names[:-1]  # an NNX Variable's value: the path is the variable's
        out[offset + j] = path_str(tuple(names))
    offset += len(leaves)
  return out


def _key_name(k):
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return getattr(k, attr)
  return str(k)


def run(fn: Callable, policy: QuantPolicy, args: tuple, kwargs: dict, *, quant_key=None,
        weights_argnums: Sequence[int] = (0,), weight_axes: dict | None = None,
        num_blocks: int | None = None, scope_root: str = ""):
  """`fn(*args, **kwargs)` with its GEMMs through `policy` (the engine of `quantized`);
  `scope_root`: the first name scope of every equation (a linen model's), left out of paths."""
  weights_argnums = tuple(weights_argnums)
  leaves, treedef = jax.tree.flatten((args, kwargs))
  weight_paths = _weight_leaves(args, weights_argnums)
  # arrays (and tracers) are the jaxpr's inputs; anything else (Python numbers, strings) is static
  dynamic = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)
             or hasattr(x, "__jax_array__") or (hasattr(x, "dtype") and hasattr(x, "shape"))]

  def flat_fn(*dyn):
    full = list(leaves)
    for i, x in zip(dynamic, dyn):
      full[i] = x
    a, kw = jax.tree.unflatten(treedef, full)
    return fn(*a, **kw)

  dyn_vals = [leaves[i] for i in dynamic]
  closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*dyn_vals)
  weights = {pos: _Weight(weight_paths[i]) for pos, i in enumerate(dynamic) if i in weight_paths}
  if num_blocks is None:
    num_blocks = _count_blocks(policy, weight_paths.values(), closed.jaxpr, weights)
  engine = _Run(policy, as_key(quant_key), dict(weight_axes or {}), num_blocks, scope_root)
  outs = engine.evaluate(closed.jaxpr, closed.consts, dyn_vals, weights, _Scope())
  return jax.tree.unflatten(jax.tree.structure(out_shape), outs)


def _count_blocks(policy: QuantPolicy, paths, jaxpr, weights) -> int | None:
  """The model's number of blocks: distinct block indices in the parameter paths, else the
  length of a scan over stacked weights (None: no blocks)."""
  found = {policy.block_index(p) for p in paths} - {None}
  if found:
    return max(found) + 1
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "scan":
      nc, ncarry = eqn.params["num_consts"], eqn.params["num_carry"]
      ins = [i for i, v in enumerate(jaxpr.invars) if i in weights]
      if any(v in eqn.invars[nc + ncarry:] for v in (jaxpr.invars[i] for i in ins)):
        return eqn.params["length"]
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
  policy = as_policy(policy)
  argnums = (weights_argnums,) if isinstance(weights_argnums, int) else tuple(weights_argnums)

  @functools.wraps(fn)
  def wrapped(*args, quant_key=None, **kwargs):
    return run(fn, policy, args, kwargs, quant_key=quant_key, weights_argnums=argnums,
               weight_axes=weight_axes)

  wrapped.lpjax_policy = policy
  return wrapped


@contextlib.contextmanager
def collect_sites():
  """Collects the `Site`s of every interception traced within the block (a list, appended to)."""
  found: list = []
  token = _SITES.set(found)
  try:
    yield found
  finally:
    _SITES.reset(token)


def stacked_weights(fn: Callable, *args, **kwargs) -> set[str]:
  """The parameter paths that a scan over blocks slices in one call of an intercepted function
  or model (stacked layers: optimizers keep their per-tensor statistics per layer there)."""
  target = getattr(fn, "lpjax_report_target", fn)
  found: set = set()
  token = _STACKED.set(found)
  try:
    jax.eval_shape(lambda *a: target(*a, **kwargs), *args)
  finally:
    _STACKED.reset(token)
  return found


def report(fn: Callable, *args, **kwargs) -> Report:
  """The GEMM call sites of one call of an intercepted function or model, traced abstractly
  (nothing is computed): path, operand shapes, which operand is the weight, the recipe, and the
  sites left unchanged with the reason. `fn` is what `quantized` / `quantize_model` returned
  (a linen model's `apply` or the model itself; an NNX model), called with its usual arguments.
  """
  target = getattr(fn, "lpjax_report_target", fn)
  with collect_sites() as found:
    jax.eval_shape(lambda *a: target(*a, **kwargs), *args)
  return Report(tuple(found))


def quantize_model(model, policy="bf16", **kwargs):
  """A Flax linen or NNX `model` with every GEMM inside it quantized by `policy`.

  The Flax adapters live in `lpjax.nn` (this package imports no Flax) and are loaded by name;
  see `lpjax.nn.quantize_model` for the arguments and what it returns.
  """
  adapters = importlib.import_module("lpjax.nn._quantize_model")
  return adapters.quantize_model(model, policy, **kwargs)
