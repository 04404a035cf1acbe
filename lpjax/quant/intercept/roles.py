"""What a product of two activations is: attention's score or value product, or neither.

The interception names a GEMM whose operands are both activations after its scope, by what it
is (`lpjax.quant.intercept.sites`): the policy keeps attention's products in high precision by
name, so a label must not call anything attention that is not. Attention is the pattern
Q K^T -> softmax -> P V: one product of two activations whose result reaches an operand of
another product of two activations through an `exp` (the softmax's). The first is the score
product ("attn_scores"), the second the value product ("attn_values"); any other product of two
activations (an MoE's dispatch, combine or gathered-expert products, a Gram matrix, a bilinear
form) is an "act_product".

`attention_roles` reads this from the data flow of the traced function once, before it runs
(the score product must be named before its consumer is reached): through nested jits,
`jax.checkpoint`, custom_jvp / custom_vjp functions (`jax.nn.softmax` is one), scans (carries
to a fixed point), conds and while loops. An operand is an activation unless it is computed from
the weights argument alone (by ops that are not GEMMs, or by a product of weights).

Examples:
  >>> import jax, jax.numpy as jnp
  >>> def attention(params, x):
  ...   q, k, v = (x @ params[n] for n in ("q", "k", "v"))
  ...   return jax.nn.softmax(q @ k.T) @ v
  >>> def gram(params, x):
  ...   h = x @ params["w"]
  ...   return (h @ h.T) @ h
  >>> def roles(fn, params, x):
  ...   closed = jax.make_jaxpr(fn)(params, x)
  ...   found = attention_roles(closed.jaxpr, set(range(len(jax.tree.leaves(params)))))
  ...   return [found.get(id(e), "-") for e in closed.jaxpr.eqns if e.primitive.name == "dot_general"]
  >>> w, x = jnp.ones((8, 8)), jnp.ones((4, 8))
  >>> roles(attention, {"q": w, "k": w, "v": w}, x)
  ['-', '-', '-', 'attn_scores', 'attn_values']
  >>> roles(gram, {"w": w}, x)
  ['-', 'act_product', 'act_product']
"""

from __future__ import annotations


from lpjax.quant.intercept import equations, jax_compat

SCORES, VALUES, ACT_PRODUCT = "attn_scores", "attn_values", "act_product"
ACTIVATION_SITE_NAMES = (SCORES, VALUES, ACT_PRODUCT)  # the last path part of such a product
_EXP = ("exp", "exp2")  # a softmax's exponential
_NONE = (False, frozenset())  # (an activation?, {(GEMM id, through an exp since?)})


def attention_roles(jaxpr, weight_positions) -> dict[int, str]:
  """{id(eqn): "attn_scores" | "attn_values" | "act_product"} of every GEMM equation (at any
  depth of `jaxpr`) whose two operands are activations; `weight_positions`: the positions of
  `jaxpr`'s inputs that are weights."""
  flow = _Flow()
  ins = [(i not in weight_positions, frozenset()) for i in range(len(jaxpr.invars))]
  consts = [(True, frozenset())] * len(jaxpr.constvars)  # closed-over arrays: activations
  flow.walk(jaxpr, ins, consts)
  roles = {}
  for g, operands in flow.operands.items():
    if not all(operands):
      continue
    fed = any(flow.is_act_product(s) for s, d in flow.edges if d == g)
    feeds = any(flow.is_act_product(d) for s, d in flow.edges if s == g)
    roles[g] = VALUES if fed else SCORES if feeds else ACT_PRODUCT
  return roles


def _merge(a, b):
  return (a[0] or b[0], a[1] | b[1])


class _Flow:
  """The data flow of one traced function: GEMMs' operand kinds and softmax edges."""

  def __init__(self):
    self.operands: dict[int, tuple[bool, bool]] = {}  # id(GEMM eqn) -> (lhs act?, rhs act?)
    self.edges: set[tuple[int, int]] = set()  # (GEMM, GEMM it reaches through an exp)

  def is_act_product(self, g: int) -> bool:
    return all(self.operands.get(g, (False, False)))

  def walk(self, jaxpr, ins, consts=()):
    """The states of `jaxpr`'s outputs for the states `ins` of its inputs."""
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, ins))
    read = lambda v: _NONE if jax_compat.is_literal(v) else env.get(v, _NONE)
    for eqn in jaxpr.eqns:
      outs = self._eqn(eqn, [read(v) for v in eqn.invars])
      env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]

  def _eqn(self, eqn, ins):
    name = eqn.primitive.name
    n_out = len(eqn.outvars)
    if name in equations.GEMMS:
      (a0, s0), (a1, s1) = ins[0], ins[1]
      old = self.operands.get(id(eqn), (False, False))
      self.operands[id(eqn)] = (old[0] or a0, old[1] or a1)
      self.edges.update((g, id(eqn)) for g, through_exp in s0 | s1 if through_exp)
      return [(a0 or a1, frozenset({(id(eqn), False)}))] * n_out
    if name in _EXP:
      act, srcs = ins[0]
      return [(act, frozenset((g, True) for g, _ in srcs))] * n_out
    if name == "scan":
      p = jax_compat.scan_params(eqn)
      return self._loop(p.body, ins, p.num_consts, p.num_carry)
    if name == "while":
      p = jax_compat.while_params(eqn)
      cn, bn = p.cond_nconsts, p.body_nconsts
      return self._loop(p.body, ins[cn:], bn, len(ins) - cn - bn)[:n_out]
    if name == "cond":
      outs = [_NONE] * n_out
      for branch in jax_compat.cond_branches(eqn):
        outs = [_merge(o, b) for o, b in zip(outs, self._call(branch, ins[1:]))]
      return outs
    for sub in equations.inner_jaxprs(eqn):  # jit, checkpoint, custom_jvp / custom_vjp
      if len(sub.invars) == len(ins) and len(sub.outvars) == n_out:
        return self.walk(sub, ins)
    merged = _NONE
    for s in ins:
      merged = _merge(merged, s)
    if any(_has_exp(sub) for sub in equations.inner_jaxprs(eqn)):
      merged = (merged[0], frozenset((g, True) for g, _ in merged[1]))
    return [merged] * n_out

  def _call(self, closed, ins):
    jaxpr = getattr(closed, "jaxpr", closed)
    consts = [(True, frozenset())] * len(jaxpr.constvars)
    return self.walk(jaxpr, ins, consts)

  def _loop(self, body, ins, n_consts: int, n_carry: int):
    """A scan's or while loop's body, its carries run to a fixed point (each state only grows)."""
    ins = list(ins)
    for _ in range(4):
      outs = self._call(body, ins)
      carry = [_merge(c, o) for c, o in zip(ins[n_consts:n_consts + n_carry], outs[:n_carry])]
      if carry == ins[n_consts:n_consts + n_carry]:
        break
      ins[n_consts:n_consts + n_carry] = carry
    return outs


def _has_exp(jaxpr) -> bool:
  return any(e.primitive.name in _EXP or any(_has_exp(s) for s in equations.inner_jaxprs(e))
             for e in jaxpr.eqns)
