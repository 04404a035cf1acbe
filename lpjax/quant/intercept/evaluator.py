"""The evaluator of the interception: a traced jaxpr run equation by equation, its GEMMs through
the policy's recipes (`lpjax.quant.intercept.entry_points` has the public functions and the overview).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from lpjax.quant.intercept import equations, jax_compat, roles as roles_lib, sites as sites_lib
from lpjax.quant.intercept.gemm_call import is_identity, quantized_conv, quantized_dot
from lpjax.quant.intercept.sites import HIGH_PRECISION, QUANTIZED, UNCHANGED, Site
from lpjax.quant.policy import QuantPolicy

SITES_FOUND: contextvars.ContextVar[list | None] = contextvars.ContextVar("lpjax_sites", default=None)
# `lpjax.quant.monitor`'s hook while it measures (None otherwise): called as
# `observer(site, block, num_blocks, count, folds, trips=, high_precision=)` around each GEMM
# that a recipe runs (trips: the iterations of the loops around it; high_precision: the policy's),
# it returns a context manager entered while that GEMM is traced (see lpjax.quant.gemm.dot_general.OBSERVER).
SITE_OBSERVER: contextvars.ContextVar = contextvars.ContextVar("lpjax_site_observer", default=None)
# parameter paths that a scan over blocks slices (stacked layers), collected while tracing
STACKED_FOUND: contextvars.ContextVar[set | None] = contextvars.ContextVar("lpjax_stacked", default=None)


@dataclasses.dataclass(frozen=True)
class Weight:
  path: str  # the parameter's path
  stacked: bool = False  # a scan slices its leading (block) axis


@dataclasses.dataclass(frozen=True)
class Scope:
  """Where the evaluation is: the block (static int, traced index, or None), extra key folds
  (iterations of scans that are not over blocks), and the named scope prefix."""

  block: Any = None
  folds: tuple = ()
  names: str = ""  # the name stack of the equations that enclose this jaxpr
  trips: int = 1  # iterations of the scans that are not over blocks, multiplied (FLOPs)

  def inside(self, eqn) -> "Scope":
    stack = jax_compat.name_stack(eqn)
    return dataclasses.replace(self, names="/".join(p for p in (self.names, stack) if p))


class Run:
  """One evaluation of a traced function: the policy, the step key and the sites it found."""

  def __init__(self, policy: QuantPolicy, key, weight_axes: dict, num_blocks: int | None,
               scope_root: str = ""):
    self.scope_root = scope_root
    if policy.num_blocks is None and num_blocks is not None:
      policy = policy.for_model(num_blocks=num_blocks)
    self.policy, self.key, self.weight_axes = policy, key, weight_axes
    self.sites: list[Site] = []
    self.calls: dict[str, int] = {}  # sites reached so far per (path, block): repeats get own keys
    self.looked_up: set[str] = set()  # parameters a gather reads rows of: embedding tables
    self.roles: dict | None = None  # id(GEMM eqn) -> what a product of two activations is

  # -- evaluation -------------------------------------------------------------------------------
  def evaluate(self, jaxpr, consts, args, weights: dict, scope: Scope):
    """Evaluates `jaxpr` on `args`; `weights` maps its invars (positions) to _Weight."""
    env, wenv, feeds = {}, {}, {}
    marks = {}  # comparisons and their float casts (one_hot(ids)): a GEMM with one is a lookup

    def read(v):
      return v.val if jax_compat.is_literal(v) else env[v]

    def weight_of(v):
      return None if jax_compat.is_literal(v) else wenv.get(v)

    if self.roles is None:  # the traced function itself: its activation products, named once
      self.roles = roles_lib.attention_roles(jaxpr, set(weights))
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
                                     if not jax_compat.is_literal(v)))
      if name in equations.GEMMS:
        wrefs = [weight_of(v) for v in eqn.invars[:2]]
        one_hot = any(w is None and not jax_compat.is_literal(v)
                      and marks.get(v) == "one_hot" for v, w in zip(eqn.invars[:2], wrefs))
        if one_hot and any(w is not None for w in wrefs):  # one_hot(ids) @ table: a lookup
          self.looked_up.update(w.path for w in wrefs if w is not None)
        out, site = self._gemm(eqn, invals, wrefs, in_feeds, scope)
        outs = [out]
        for v in eqn.outvars:
          feeds[v] = frozenset({site})
        if all(w is not None for w in wrefs):  # a product of parameters (LoRA's A @ B): a weight
          computed = equations.computed_weight(eqn, weight_of, gemm_ok=True)
          for v in eqn.outvars:
            wenv[v] = computed
      else:
        self._note_lookups(eqn, weight_of)
        for i in equations.one_hot_results(eqn, marks):
          marks[eqn.outvars[i]] = "one_hot"
        outs = self._other(eqn, invals, [weight_of(v) for v in eqn.invars], scope)
        for v in eqn.outvars:
          feeds[v] = in_feeds
        if name in equations.LAYOUT_OPS and eqn.invars and weight_of(eqn.invars[0]) is not None:
          for v in eqn.outvars:
            wenv[v] = wenv[eqn.invars[0]]
        elif name in equations.PER_OPERAND_OPS:  # n operands -> n results, each its operand
          for v_in, v_out in zip(eqn.invars, eqn.outvars):
            if weight_of(v_in) is not None:
              wenv[v_out] = wenv[v_in]
        else:
          computed = equations.computed_weight(eqn, weight_of)
          if computed is not None:
            for v in eqn.outvars:
              wenv[v] = computed
      for v, x in zip(eqn.outvars, outs):
        env[v] = x
    return [read(v) for v in jaxpr.outvars]

  def _note_lookups(self, eqn, weight_of):
    """Records the parameters that a gather looks rows up in (embedding tables), here or inside
    a nested function that has no GEMM (and so is not evaluated equation by equation)."""
    if eqn.primitive.name == "gather" and weight_of(eqn.invars[0]) is not None:
      self.looked_up.add(weight_of(eqn.invars[0]).path)
      return
    for sub in equations.inner_jaxprs(eqn):
      if len(sub.invars) != len(eqn.invars):
        continue
      for i in equations.gathered_inputs(sub):
        w = weight_of(eqn.invars[i])
        if w is not None:
          self.looked_up.add(w.path)

  def _other(self, eqn, invals, wrefs, scope: Scope):
    name = eqn.primitive.name
    if not equations.has_gemm(eqn):
      return equations.bind(eqn, invals)
    weights = {i: w for i, w in enumerate(wrefs) if w is not None}
    scope = scope.inside(eqn)
    called = jax_compat.call_body(eqn)
    if called is not None:  # jax.jit, closed_call
      return self.evaluate(called.jaxpr, called.consts, invals, weights, scope)
    remat = jax_compat.remat_params(eqn)
    if remat is not None:  # jax.checkpoint / nn.remat
      body = remat.body
      fn = lambda *a: self.evaluate(body.jaxpr, body.consts, a, weights, scope)
      return jax.checkpoint(fn, prevent_cse=remat.prevent_cse, policy=remat.policy)(*invals)
    if name == "scan":
      return self._scan(eqn, invals, weights, scope)
    if name == "cond":
      index, ops = invals[0], invals[1:]
      w = {i - 1: x for i, x in weights.items() if i > 0}
      branches = [functools.partial(self._closed, b, w, scope)
                  for b in jax_compat.cond_branches(eqn)]
      return jax.lax.switch(index, branches, *ops)
    self._list_inner(eqn, scope, f"inside {name}: its body runs as written")
    return equations.bind(eqn, invals)

  def _closed(self, closed, weights, scope, *args):
    return self.evaluate(closed.jaxpr, closed.consts, args, weights, scope)

  def _scan(self, eqn, invals, weights, scope: Scope):
    p = jax_compat.scan_params(eqn)
    nc, ncarry, length = p.num_consts, p.num_carry, p.length
    consts, carry, xs = invals[:nc], invals[nc:nc + ncarry], invals[nc + ncarry:]
    body = p.body
    inner = {i: w for i, w in weights.items() if i < nc}
    inner.update({i: Weight(w.path, stacked=True) for i, w in weights.items() if i >= nc + ncarry})
    over_blocks = any(i >= nc + ncarry for i in weights)
    stacked = STACKED_FOUND.get()
    if stacked is not None:
      stacked.update(w.path for i, w in weights.items() if i >= nc + ncarry)
    if over_blocks and self.policy.varies_by_block:  # each block its own recipe: unroll
      order = range(length - 1, -1, -1) if p.reverse else range(length)
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
           else dataclasses.replace(scope, folds=scope.folds + (i,), trips=scope.trips * length))
      out = self.evaluate(body.jaxpr, body.consts, [*consts, *c, *x], inner, s)
      return (i + 1, out[:ncarry]), out[ncarry:]

    start = jnp.asarray(length - 1 if p.reverse else 0, jnp.int32)
    if p.reverse:
      step_rev = step

      def step(c, x):  # noqa: F811  (the counter counts down)
        (_, c_out), y = step_rev(c, x)
        return (c[0] - 1, c_out), y
    (_, carry), ys = jax.lax.scan(step, (start, list(carry)), list(xs), length=length,
                                  reverse=p.reverse, unroll=p.unroll)
    return [*carry, *ys]

  # -- one GEMM ---------------------------------------------------------------------------------
  def _gemm(self, eqn, invals, wrefs, feeds, scope: Scope):
    op = eqn.primitive.name
    lhs, rhs = invals[:2]
    wl, wr = wrefs
    weight = "both" if (wl and wr) else "rhs" if wr else "lhs" if wl else "none"
    wref = wr or wl
    block = scope.block
    if wref is not None:
      path = sites_lib.module_path(wref.path)
      if not self.scope_root:  # a raw linen `m.apply`: its class name heads every name stack
        self.scope_root = sites_lib.scope_root_of(scope.inside(eqn).names, path)
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
      return equations.bind(eqn, invals)[0], path
    recipe = self.policy.recipe_for(path, block=static_block)
    why = ""
    if recipe.is_high_precision:
      why = "kept by the policy" if self.policy.kept_high_precision(path, block=static_block) else ""
    elif not self.policy.pure and wref is not None and wref.path in self.looked_up:
      recipe = self.policy.kept_recipe_for(path)
      why = ("an embedding table (a gather or a one-hot product looks it up): an embedding or "
             "tied head")
    elif not self.policy.pure:
      short = equations.short_contraction(eqn, recipe, lhs, rhs)
      if short:
        recipe, why = self.policy.kept_recipe_for(path), short
    if is_identity(recipe, lhs, rhs, jax_compat.preferred_element_type(eqn)):
      # the original op runs; a site kept out of a quantized recipe is reported as kept
      lifted = bool(why) and not self.policy.own_recipe(path).is_high_precision
      original = ("the original op (operands as given)" if recipe.compute_dtype is None
                  else f"{recipe} recipe: the original op")
      self._add(record(recipe=str(recipe), status=HIGH_PRECISION if lifted else UNCHANGED,
                       reason=f"{why}; {original}" if lifted else
                       original + (f"; {why}" if why else "")))
      return equations.bind(eqn, invals)[0], path
    hp = recipe.is_high_precision
    count = self.calls.get((path, block_label), 0)
    self.calls[(path, block_label)] = count + 1
    key = self._site_key(path, block, count, scope)
    if key is None and recipe.needs_key:
      raise ValueError(f"GEMM at {path!r} runs recipe {recipe}, which rounds stochastically: pass "
                       "one key per step, quant_key=jax.random.key(...) (for an NNX model: "
                       "nnx.Rngs(quant=...) or quant_key=; for linen: rngs={'quant': key}).")
    site = record(recipe=str(recipe), status=HIGH_PRECISION if hp else QUANTIZED, reason=why)
    self._add(site)
    observer = SITE_OBSERVER.get()
    observed = (contextlib.nullcontext() if observer is None else
                observer(site, block, self.policy.num_blocks, count, scope.folds,
                         trips=scope.trips, high_precision=self.policy.high_precision))
    with observed:
      if op == "dot_general":
        return quantized_dot(eqn, lhs, rhs, weight, recipe, key, self._axes(wref)), path
      return quantized_conv(eqn, lhs, rhs, recipe, key), path

  def _unattributable(self, eqn, lhs, rhs, weight: str) -> str:
    pet = jax_compat.preferred_element_type(eqn)
    floats = all(jnp.issubdtype(x.dtype, jnp.floating) for x in (lhs, rhs))
    if not floats or (pet is not None and not jnp.issubdtype(pet, jnp.floating)):
      return "integer or non-float operands: not a quantizable GEMM"
    if weight == "both":
      return ("both operands are parameters (e.g. LoRA's A @ B): the product is a weight, "
              "computed as written; a GEMM that uses it treats it as its weight")
    if eqn.primitive.name == "dot_general" and weight != "none":
      (_, _), (lb, rb) = jax_compat.dot_dimension_numbers(eqn)
      if (rb if weight == "rhs" else lb):
        return "a weight with batch dimensions (per-example weights)"
    if eqn.primitive.name == "conv_general_dilated":
      if jax_compat.conv_params(eqn).batch_group_count != 1:
        return "batch_group_count > 1"
      if weight == "lhs":
        return "the weight is the convolution's input"
    return ""

  def _activation_path(self, eqn, feeds, outer: Scope) -> str:
    scope = sites_lib.scope_of_name_stack(outer.inside(eqn).names, self.scope_root)
    if not scope:
      weight_feeds = [f for f in feeds if not equations.is_activation_site(f)]
      scope = sites_lib.common_path(sorted(weight_feeds))
    name = self.roles.get(id(eqn), roles_lib.ACT_PRODUCT)  # attention's products, or neither
    return f"{scope}/{name}" if scope else name

  def _site_key(self, path, block, count: int, scope: Scope):
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
    collected = SITES_FOUND.get()
    if collected is not None:
      collected.append(site)

  def _list_inner(self, eqn, scope: Scope, reason: str):
    """Lists the GEMMs inside a primitive that runs unchanged."""
    for sub in equations.inner_jaxprs(eqn):
      for inner in sub.eqns:
        if inner.primitive.name in equations.GEMMS:
          lhs, rhs = (v.aval for v in inner.invars[:2])
          path = sites_lib.scope_of_name_stack(scope.inside(inner).names,
                                               self.scope_root) or eqn.primitive.name
          self._add(Site(path=path, op=inner.primitive.name, lhs_shape=tuple(lhs.shape),
                         rhs_shape=tuple(rhs.shape), weight="?", weight_path=None, block="",
                         recipe="", status=UNCHANGED, reason=reason))
        elif equations.has_gemm(inner):
          self._list_inner(inner, scope.inside(inner), reason)
