"""lpjax/quant/intercept/jax_compat.py on whichever jax is installed (CI runs it on both stacks;
it passes on jax 0.10.2, 0.11.2 and 0.12.1).

Each accessor reads a real jaxpr of its primitive, and is checked against JAX itself: the loop,
branch or call that the accessor's numbers describe, run by hand from the nested jaxpr, gives what
JAX's own evaluation of the equation gives (bit for bit, same ops on the same CPU).
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jcore
from jax.sharding import PartitionSpec as P

from lpjax.quant.intercept import jax_compat


def _eqns(fn, *args, name):
  """The top-level equations named `name` of `fn`'s jaxpr, and the jaxpr."""
  closed = jax.make_jaxpr(fn)(*args)
  found = [e for e in closed.jaxpr.eqns if e.primitive.name == name]
  assert found, f"no {name} in {closed}"
  return found, closed


def _run(body: jax_compat.Body, *args):
  return jcore.jaxpr_as_fun(jcore.ClosedJaxpr(body.jaxpr, list(body.consts)))(*args)


def _each_equation(closed, check):
  """Evaluates `closed` equation by equation (JAX binds each), calling `check(eqn, invals,
  outs)` on every one; returns the outputs."""
  env = dict(zip(closed.jaxpr.constvars, closed.consts))

  def read(v):
    return v.val if jax_compat.is_literal(v) else env[v]

  def evaluate(jaxpr, args):
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
      invals = [read(v) for v in eqn.invars]
      outs = jax_compat.bind(eqn, invals)
      check(eqn, invals, outs)
      env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]

  return evaluate


def _assert_same(got, want, rtol=0.0):
  assert len(got) == len(want)
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=0)


def _scan_by_hand(eqn, invals):
  """The scan that `scan_params` describes, iteration by iteration."""
  s = jax_compat.scan_params(eqn)
  nc, ncarry = s.num_consts, s.num_carry
  consts, carry, xs = invals[:nc], list(invals[nc:nc + ncarry]), invals[nc + ncarry:]
  ys = [None] * s.length
  for i in (range(s.length - 1, -1, -1) if s.reverse else range(s.length)):
    out = _run(s.body, *consts, *carry, *[x[i] for x in xs])
    carry, ys[i] = out[:ncarry], out[ncarry:]
  n_ys = len(eqn.outvars) - ncarry
  return [*carry, *[jnp.stack([y[j] for y in ys]) for j in range(n_ys)]]


W = jnp.arange(16.0).reshape(4, 4) / 16
C0 = jnp.ones((4, 4))
XS = jnp.arange(48.0).reshape(3, 4, 4) / 48


def _scanned(w, c, xs):
  def body(carry, x):
    c, n = carry
    return (jnp.tanh(c @ w + x), n + 1.0), (c.sum(), x * 2.0)
  return jax.lax.scan(body, (c, jnp.float32(0)), xs, reverse=True, unroll=2)


def test_scan_params_read_consts_carry_xs_length_reverse_and_body():
  [eqn], _ = _eqns(_scanned, W, C0, XS, name="scan")
  s = jax_compat.scan_params(eqn)
  # operands: w (closed over by the body), the two carries, the xs
  assert (s.num_consts, s.num_carry, s.length, s.reverse, s.unroll) == (1, 2, 3, True, 2)
  assert len(s.body.jaxpr.invars) == len(eqn.invars) == 4
  assert len(s.body.jaxpr.outvars) == len(eqn.outvars)
  invals = [W, C0, jnp.float32(0), XS]
  _assert_same(_scan_by_hand(eqn, invals), jax_compat.bind(eqn, invals))


def test_scan_params_read_every_scan_of_a_gradient():
  """The scans of grad (the forward scan that saves residuals, the transposed one): jax 0.12
  nests their operand groups (a flat tree of trees), which `scan_params` must count in full."""
  loss = lambda w: _scanned(w, C0, XS)[0][0].sum()
  closed = jax.make_jaxpr(jax.grad(loss))(W)
  seen = []

  def check(eqn, invals, outs):
    if eqn.primitive.name == "scan":
      seen.append(jax_compat.scan_params(eqn))
      # XLA compiles the scan's body as one computation and fuses tanh's derivative; the loop by
      # hand runs op by op: float32 results may differ in the last bit (1 ulp, seen on jax 0.10)
      _assert_same(_scan_by_hand(eqn, invals), outs, rtol=1e-6)

  got = _each_equation(closed, check)(closed.jaxpr, [W])
  assert len(seen) == 2 and {s.reverse for s in seen} == {True, False}
  np.testing.assert_allclose(np.asarray(got[0]), np.asarray(jax.grad(loss)(W)), rtol=1e-6)


def _checked(fn, args, name, check):
  """Evaluates `fn`'s jaxpr equation by equation, `check(eqn, invals, outs)` on each equation
  named `name`; returns how many there were and the outputs."""
  closed = jax.make_jaxpr(fn)(*args)
  seen = []

  def on(eqn, invals, outs):
    if eqn.primitive.name == name:
      seen.append(eqn)
      check(eqn, invals, outs)

  outs = _each_equation(closed, on)(closed.jaxpr, list(args))
  return len(seen), outs


def test_cond_branches_are_the_branches_in_index_order():
  k = jnp.float32(3)  # closed over: an operand of every branch
  branches = [lambda x: x @ x, lambda x: x * k, lambda x: -x]
  fn = lambda i, x: jax.lax.switch(i, branches, x)

  def check(eqn, invals, outs):
    found = jax_compat.cond_branches(eqn)
    assert len(found) == 3
    _assert_same(_run(found[int(invals[0])], *invals[1:]), outs)

  for i in range(3):
    n, outs = _checked(fn, (jnp.int32(i), W), "cond", check)
    assert n == 1
    _assert_same(outs, [branches[i](W)])


def test_while_params_read_both_consts_and_jaxprs():
  limit, step = jnp.float32(5), jnp.float32(0.5)  # a const of the cond, a const of the body
  fn = lambda x: jax.lax.while_loop(lambda c: c[0] < limit, lambda c: (c[0] + 1, c[1] * step),
                                    (jnp.float32(0), x))

  def check(eqn, invals, outs):
    p = jax_compat.while_params(eqn)
    assert (p.cond_nconsts, p.body_nconsts) == (1, 1)
    cconsts = invals[:p.cond_nconsts]
    bconsts = invals[p.cond_nconsts:p.cond_nconsts + p.body_nconsts]
    carry = invals[p.cond_nconsts + p.body_nconsts:]
    while bool(_run(p.cond, *cconsts, *carry)[0]):
      carry = _run(p.body, *bconsts, *carry)
    _assert_same(carry, outs)

  n, outs = _checked(fn, (W,), "while", check)
  assert n == 1
  _assert_same(outs, jax.tree.leaves(fn(W)))


def test_call_body_of_jit_and_closed_call():
  inner = jax.jit(lambda x: jnp.sin(x @ x))
  [eqn], _ = _eqns(lambda x: inner(x) + 1, W, name=jcore.primitives.jit_p.name)
  _assert_same(_run(jax_compat.call_body(eqn), W), [jnp.sin(W @ W)])
  # closed_call (a ClosedJaxpr; "eval_jaxpr" of an open Jaxpr from jax 0.11), bound as JAX does
  prim = jcore.primitives.closed_call_p
  called = jax.make_jaxpr(lambda x: x @ x)(W)
  params = {"call_jaxpr": called if prim.name == "closed_call" else called.jaxpr}

  def via_closed_call(x):
    bind_params = prim.get_bind_params(params)
    subfuns, bind_params = bind_params if isinstance(bind_params, tuple) else ([], bind_params)
    return prim.bind(*subfuns, x, **bind_params)

  [eqn], _ = _eqns(via_closed_call, W, name=prim.name)
  assert prim.name in jax_compat.CALL_PRIMITIVES
  _assert_same(_run(jax_compat.call_body(eqn), W), [W @ W])
  assert jax_compat.call_body(_eqns(jnp.sin, W, name="sin")[0][0]) is None


def test_remat_params_read_body_prevent_cse_and_policy():
  policy = jax.checkpoint_policies.dots_saveable
  fn = jax.checkpoint(lambda x: jnp.sin(x @ x), prevent_cse=False, policy=policy)
  [eqn], _ = _eqns(fn, W, name=jcore.primitives.remat_p.name)
  r = jax_compat.remat_params(eqn)
  assert r.prevent_cse is False and r.policy is policy
  _assert_same(_run(r.body, W), [jnp.sin(W @ W)])
  assert jax_compat.remat_params(_eqns(jnp.sin, W, name="sin")[0][0]) is None


def test_custom_call_body_is_the_primal_function():
  @jax.custom_vjp
  def f_vjp(x):
    return x @ x
  f_vjp.defvjp(lambda x: (x @ x, x), lambda x, g: (g @ x.T + x.T @ g,))

  @jax.custom_jvp
  def f_jvp(x):
    return jnp.tanh(x)
  f_jvp.defjvp(lambda p, t: (jnp.tanh(p[0]), t[0]))

  def check(eqn, invals, outs):
    body, num_consts = jax_compat.custom_call_body(eqn)
    assert 0 <= num_consts < len(invals)
    _assert_same(_run(body, *invals), outs)

  for f, name, want in ((f_vjp, "custom_vjp_call", W @ W), (f_jvp, "custom_jvp_call", jnp.tanh(W))):
    n, outs = _checked(lambda x: f(x * W), (W,), name, check)  # W closed over: a const
    assert n == 1
    _assert_same(outs, [f(W * W)])


def test_shard_map_body_is_the_per_shard_function():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("x",))
  # check_vma=False: no pvary in the body (it runs here outside shard_map)
  fn = jax.shard_map(lambda y: y @ W, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                     check_vma=False)
  x = jnp.arange(32.0).reshape(8, 4)
  [eqn], _ = _eqns(fn, x, name="shard_map")
  body = jax_compat.shard_map_body(eqn)
  operands = [W, x[:1]] if len(eqn.invars) == 2 else [x[:1]]  # one shard's rows
  _assert_same(_run(body, *operands), [x[:1] @ W])


def test_gemm_parameters():
  a = jnp.ones((2, 3, 5), jnp.bfloat16)
  b = jnp.ones((2, 5, 7), jnp.bfloat16)
  dn = (((2,), (1,)), ((0,), (0,)))
  [eqn], _ = _eqns(lambda a, b: jax.lax.dot_general(a, b, dn, preferred_element_type=jnp.float32),
                   a, b, name="dot_general")
  assert jax_compat.dot_dimension_numbers(eqn) == dn
  assert jax_compat.preferred_element_type(eqn) == jnp.float32
  x = jnp.arange(2 * 4 * 9 * 9, dtype=jnp.float32).reshape(2, 4, 9, 9) / 100
  k = jnp.arange(6 * 2 * 3 * 3, dtype=jnp.float32).reshape(6, 2, 3, 3) / 50
  conv = lambda x, k: jax.lax.conv_general_dilated(
      x, k, (2, 1), ((1, 0), (2, 1)), lhs_dilation=(1, 2), rhs_dilation=(2, 1),
      dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=2)
  [eqn], _ = _eqns(conv, x, k, name="conv_general_dilated")
  c = jax_compat.conv_params(eqn)
  assert (c.window_strides, c.lhs_dilation, c.rhs_dilation, c.feature_group_count,
          c.batch_group_count) == ((2, 1), (1, 2), (2, 1), 2, 1)
  again = jax.lax.conv_general_dilated(x, k, c.window_strides, c.padding, c.lhs_dilation,
                                       c.rhs_dilation, c.dimension_numbers, c.feature_group_count)
  _assert_same([again], [conv(x, k)])


def test_literals_name_stacks_and_inner_jaxprs():
  def fn(x):
    with jax.named_scope("outer"):
      return jax.lax.cond(x.sum() > 0, lambda y: y * 2.0, lambda y: y, x)
  closed = jax.make_jaxpr(fn)(W)
  [cond] = [e for e in closed.jaxpr.eqns if e.primitive.name == "cond"]
  assert jax_compat.name_stack(cond) == "outer"
  inner = jax_compat.inner_jaxprs(cond)
  assert len(inner) == 2 and all(isinstance(j, jcore.Jaxpr) for j in inner)
  [mul] = [e for j in inner for e in j.eqns if e.primitive.name == "mul"]
  literal = [v for v in mul.invars if jax_compat.is_literal(v)]
  assert [float(v.val) for v in literal] == [2.0]


@pytest.mark.parametrize("spec", [P("x"), P(None, "y"), P(("x", "y")), P("y", "x")])
def test_spec_of_hlo_sharding_reads_back_the_spec_of_a_tiling(spec):
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
  named = jax.sharding.NamedSharding(mesh, spec)
  tiled = types.SimpleNamespace(_hlo_sharding=named._to_xla_hlo_sharding(2))  # a GSPMDSharding's
  got = tuple(jax_compat.spec_of_hlo_sharding(tiled, mesh))
  assert got + (None,) * (2 - len(got)) == tuple(spec) + (None,) * (2 - len(spec))
  assert jax_compat.spec_of_hlo_sharding(named, mesh) is named.spec
  assert jax_compat.spec_of_hlo_sharding(types.SimpleNamespace(), mesh) is None


def _tiling(order):
  """A GSPMD-style holder of the HLO tiling of axis 0 of a 2-D array over 8 devices in `order`
  (jax's own OpSharding proto: the tilings XLA's propagation hands a custom partitioner)."""
  from jax._src.lib import xla_client as xc  # no public constructor for an arbitrary tiling
  op = xc.OpSharding()
  op.type = xc.OpSharding.Type.OTHER
  op.tile_assignment_dimensions = [8, 1]
  op.tile_assignment_devices = order
  return types.SimpleNamespace(_hlo_sharding=xc.HloSharding.from_proto(op))


@pytest.mark.parametrize("order", [[0, 2, 4, 6, 1, 3, 5, 7], [1, 0, 2, 3, 4, 5, 6, 7]])
def test_spec_of_hlo_sharding_is_none_for_a_device_order_no_mesh_axes_spell(order):
  """A tiling over the mesh's devices in an order that no PartitionSpec of the mesh spells (jax's
  parser fails an assertion on the first and raises NotImplementedError on the second): None, so
  the sharded Pallas GEMM gathers that operand instead of failing to partition."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
  assert jax_compat.spec_of_hlo_sharding(_tiling(order), mesh) is None
  # orders that the mesh's axes spell: y-major is ("y", "x"), the mesh's own order ("x", "y")
  assert tuple(jax_compat.spec_of_hlo_sharding(_tiling([0, 4, 1, 5, 2, 6, 3, 7]), mesh)) == (
      ("y", "x"),)
  assert tuple(jax_compat.spec_of_hlo_sharding(_tiling(list(range(8))), mesh))[:1] == (
      ("x", "y"),)


def test_an_unknown_layout_is_refused_with_what_was_found():
  eqn = types.SimpleNamespace(primitive=types.SimpleNamespace(name="scan"), invars=[],
                              params={"length": 3, "jaxpr": None, "carry_spec": ()})
  with pytest.raises(jax_compat.UnsupportedJaxprError,
                     match=rf"scan.*jax {jax.__version__}.*carry_spec.*supports jax"):
    jax_compat.scan_params(eqn)


def test_the_installed_jax_is_a_supported_version():
  """A jax outside the versions jax_compat is tested on: add it to SUPPORTED_JAX (and a stack
  to CI) once this file passes on it."""
  assert jax_compat.JAX_VERSION[:2] in jax_compat.SUPPORTED_JAX, jax.__version__


def test_a_deprecation_that_lpjax_code_triggers_fails_on_the_current_stack():
  """tests/conftest.py: on a jax newer than the pinned one, lpjax's own deprecated calls are
  errors (a warning is attributed to the module that calls the deprecated API)."""
  code = compile("import warnings\nwarnings.warn('old API', DeprecationWarning)", "m.py", "exec")
  current = jax_compat.JAX_VERSION[:2] > (0, 10)
  with (pytest.raises(DeprecationWarning) if current else pytest.warns(DeprecationWarning)):
    exec(code, {"__name__": "lpjax.some_module"})
  with pytest.warns(DeprecationWarning):  # another package's code: a warning, as before
    exec(code, {"__name__": "some_package"})
