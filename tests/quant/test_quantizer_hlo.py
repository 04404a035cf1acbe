"""The structure of the compiled quantizer, a speed property checked without timing: fake_quant of
an FP4 format reads its operand twice (the block amax, then the element pass), writes one output,
and in between runs a fixed, small number of kernels over per-group arrays (the scale byte and one
gather of its factors: lpjax.quant.codec.factor_tables), with no Threefry in stochastic rounding;
its element pass converts no float to an integer, and the SR bits cost one multiply-xorshift
finalizer per element.

Before the per-group factors were looked up by scale byte, mxfp4 compiled to 10 such kernels and
nvfp4 to 16 (each factor, mask and scale its own pass over the groups, plus a conditional and a
second max over the block amaxes for NVFP4's tensor amax).
"""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax import quant

SHAPE = (512, 2048)  # enough groups that the 256-row factor tables are not counted as per-group
_FUSION = re.compile(r"\s*(?:ROOT )?%\S+ = \w+\[([\d,]*)\]\{[^}]*\} fusion\(")


def _compiled_text(fmt, rounding):
  x = jax.ShapeDtypeStruct(SHAPE, jnp.float32)
  fn = jax.jit(lambda x, k: quant.fake_quant(x, fmt, rounding=rounding, key=k))
  return fn.lower(x, jax.random.key(0)).compile().as_text()


def _kernels_at_least(text, size):
  """Fusions anywhere in the module (conditional branches included) whose output has >= size
  elements."""
  count = 0
  for line in text.splitlines():
    m = _FUSION.match(line)
    if m:
      elements = 1
      for d in filter(None, m.group(1).split(",")):
        elements *= int(d)
      count += elements >= size
  return count


def _operand_reads(text):
  """Instructions of the entry computation that read parameter 0 (x)."""
  entry = text[text.index("\nENTRY"):]
  name = re.search(r"%(\S+) = f32\[[\d,]+\]\{[^}]*\} parameter\(0\)", entry).group(1)
  uses = re.compile(r"= .*\(.*%" + re.escape(name) + r"[,)]")
  return sum(1 for line in entry.splitlines() if uses.search(line) and "parameter(" not in line
             and " bitcast(" not in line and " tuple(" not in line)


# (format, elements per scaling group, most per-group-or-larger kernels): mxfp4 = amax reduction,
# factor gather, element pass; NVFP4 adds the scale-byte kernel in each branch of the tail's
# conditional (float / exact; one runs) and a copy of the block amaxes for the tensor amax; nvfp4's
# two-step amax (group_codec.group_amax) is a fusion XLA fuses no consumer into, so the amaxes'
# `materialize` (a divide by 1 that LLVM folds) is one more kernel: a copy of 1/16 of x's bytes.
CASES = [("mxfp4", 32, 3), ("nvfp4", 16, 7), ("nvfp4_16x16", 256, 6)]


@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
@pytest.mark.parametrize("fmt,group,most", CASES)
def test_fake_quant_passes_over_the_operand_and_the_groups(fmt, group, most, rounding):
  text = _compiled_text(fmt, rounding)
  groups = SHAPE[0] * SHAPE[1] // group
  assert _operand_reads(text) <= 2, "x is read more than twice (amax pass, element pass)"
  kernels = _kernels_at_least(text, groups)
  assert kernels <= most, f"{kernels} kernels over per-group or larger arrays, at most {most}"
  assert "threefry" not in text.lower()  # SR bits: the counter hash of lpjax.quant.numerics.rng


_INSTR = re.compile(r"\s*(?:ROOT )?%(\S+) = \w+\[([\d,]*)\]\S* (\S+?)\((.*)")


def _full_size_reductions(text, size):
  """(operand shape, reduced dimensions) of every reduce in the module whose operand has at
  least `size` elements."""
  shapes, found = {}, []
  for line in text.splitlines():
    m = _INSTR.match(line)
    if not m:
      continue
    name, dims, op, rest = m.groups()
    shapes[name] = tuple(int(d) for d in dims.split(",") if d)
    if op == "reduce":
      operand = shapes.get(rest.split(",")[0].strip().lstrip("%"), ())
      reduced = re.search(r"dimensions=\{([\d,]*)\}", rest).group(1)
      if operand and math.prod(operand) >= size:
        found.append((operand, {int(d) for d in reduced.split(",") if d}))
  return found


@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_block_amax_reduces_no_minor_axis_wider_than_a_vector(fmt, rounding):
  """XLA:CPU vectorizes a reduction across its outputs: over a minor axis of 32 (mxfp4) or 16
  (nvfp4) it loaded x one word at a time, eight groups to a vector (~11 instructions per 8
  elements, most of them shuffles). group_codec.group_amax first takes whole-vector maxima of each
  group's 8-word runs (a reduction over a non-minor axis), then the 8 lanes (~5 per 8 elements)."""
  reductions = _full_size_reductions(_compiled_text(fmt, rounding), SHAPE[0] * SHAPE[1])
  assert reductions, "no reduction over x found"
  for shape, dims in reductions:
    assert len(shape) - 1 not in dims or shape[-1] <= 8, (shape, dims)


def _element_pass(text):
  """The fused computation of the entry's root fusion (the element pass), as text."""
  entry = text[text.index("\nENTRY"):]
  root = re.search(r"ROOT %\S+ = \S+ fusion\(.*calls=%([\w.\-]+)", entry).group(1)
  body = text[text.index("\n%" + root + " ") + 1:]
  return body[:body.index("\n}")]


def _float_to_int_converts(body):
  """convert instructions from f32 to s32 / u32 in a computation's text."""
  types, count = {}, 0
  for line in body.splitlines():
    m = re.match(r"\s*(?:ROOT )?%(\S+) = (\w+)\[[^\]]*\](?:\{[^}]*\})? ([\w\-]+)\(([^)]*)\)", line)
    if m:
      types[m.group(1)] = m.group(2)
      if m.group(3) == "convert" and m.group(2) in ("s32", "u32"):
        count += types.get(m.group(4).strip().lstrip("%")) == "f32"
  return count


@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "nvfp4_16x16"])
def test_fp4_element_pass_converts_no_float_to_an_integer(fmt, rounding):
  """XLA clamps every float -> int conversion and tests it for NaN (five or six instructions per
  vector on x86): the element pass takes SR's fraction F and a subnormal decode's integer from
  float bits instead (fast_elements.fraction_bits, apply_multiplier). It had one in RTN (the
  subnormal decode) and two in SR (and F)."""
  body = _element_pass(_compiled_text(fmt, rounding))
  assert _float_to_int_converts(body) == 0, body


def _elementwise_ops(fn, n):
  """Primitive counts of the jaxpr of fn(), over equations with an output of shape (n,)."""
  counts = {}

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      sub = eqn.params.get("jaxpr")
      if sub is not None:
        walk(getattr(sub, "jaxpr", sub))
      elif any(getattr(v.aval, "shape", ()) == (n,) for v in eqn.outvars):
        counts[eqn.primitive.name] = counts.get(eqn.primitive.name, 0) + 1
  walk(jax.make_jaxpr(fn)().jaxpr)
  return counts


def test_sr_bits_cost_one_multiply_xorshift_finalizer_per_element():
  """random_bits per element: the Weyl step i * m + a and lowbias32 (docs/numerics.md §6), i.e.
  3 multiplies (+ 1 of the flat index's stride), 3 xorshifts; the two fmix32 rounds before were 6
  multiplies and 22 integer operations."""
  n = 4096
  ops = _elementwise_ops(lambda: quant.random_bits(jax.random.key(0), (n,)), n)
  arith = sum(ops.get(p, 0) for p in ("mul", "add", "xor", "shift_right_logical", "or", "and"))
  assert ops.get("mul", 0) <= 4 and arith <= 12, ops


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4_16x16"])
def test_a_tensor_scale_builds_one_factor_table_per_operand(fmt, monkeypatch):
  """With a tensor scale the 256-row table is built once, by the exact tail (the float tail gave
  the same bits where it was exact, but both were traced and compiled at every operand: half of
  an E4M3-scaled U-Net step's extra instructions). Here: no float tail is traced, the exact tail
  once per fake_quant; the values are checked bit for bit by the conformance and oracle tests."""
  from lpjax.quant.codec import scales_fast
  calls = {"float": 0, "exact": 0}
  float_tail, exact_tail = scales_fast._float_tail, scales_fast._tail_tables

  def counted(name, fn):
    def wrapper(*args, **kwargs):
      calls[name] += 1
      return fn(*args, **kwargs)
    return wrapper

  jax.clear_caches()  # an earlier test's fake_quant trace would otherwise be reused, counting 0
  monkeypatch.setattr(scales_fast, "_float_tail", counted("float", float_tail))
  monkeypatch.setattr(scales_fast, "_tail_tables", counted("exact", exact_tail))
  jax.jit(lambda x: quant.fake_quant(x, fmt)).lower(jax.ShapeDtypeStruct((64, 64), jnp.float32))
  assert calls == {"float": 0, "exact": 1}, calls


_FREE_OPS = {"parameter", "constant", "broadcast", "bitcast", "reshape", "slice", "tuple",
             "get-tuple-element"}


def _element_ops(body):
  """Operations of a fused computation that compute (not parameters, constants, broadcasts or
  reshapes)."""
  ops = re.findall(r"^\s*(?:ROOT )?%\S+ = \S+ ([\w\-]+)\(", body, re.M)
  return sum(op not in _FREE_OPS for op in ops)


# The element pass's computing operations, at most: the subnormal-decode test compares the
# normal-result bits with a constant (fast_elements.apply_multiplier) where it built a per-group
# bound from the shift word (an AND and an ADD; on x86 five scalar instructions per vector of
# elements to form and broadcast it), and v is clipped at max_value before rounding, where it was
# clipped at 2**(sat_exp + 1) before and the value at max_value after (round_magnitude).
# Before: 49, 76, 52, 79, 52, 79.
ELEMENT_OPS = {("mxfp4", "nearest_even"): 46, ("mxfp4", "stochastic"): 73,
               ("nvfp4", "nearest_even"): 49, ("nvfp4", "stochastic"): 76,
               ("nvfp4_16x16", "nearest_even"): 49, ("nvfp4_16x16", "stochastic"): 76}


@pytest.mark.parametrize("fmt,rounding", sorted(ELEMENT_OPS))
def test_fp4_element_pass_operation_count(fmt, rounding):
  ops = _element_ops(_element_pass(_compiled_text(fmt, rounding)))
  assert ops <= ELEMENT_OPS[fmt, rounding], ops


def test_factor_tables_are_built_by_one_program_with_the_eager_bits():
  """The constant factor tables (e8m0; ue4m3 without a tensor scale) are each built by one XLA
  program per process (the old code evaluated ~26 operations eagerly, each lowered and compiled
  on its own: about 2 s of the first quantizer trace of every process), with the same bits as
  that op-by-op evaluation (the reference below: the old code's formulas, evaluated eagerly)."""
  from jax import monitoring

  from lpjax.quant.codec import factor_tables as ft
  from lpjax.quant.codec import fast_elements as fast
  from lpjax.quant.codec import scales_exact as sc
  from lpjax.quant.codec import scales_fast
  from lpjax.quant.numerics import fp32_bits as fb

  lowered = []

  def listener(event, duration, **_):
    if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
      lowered.append(duration)

  jax.clear_caches()  # eager operations of earlier tests would otherwise not be lowered again
  ft._e8m0_table.cache_clear()
  ft._ue4m3_unit_table.cache_clear()
  monitoring.register_event_duration_secs_listener(listener)
  try:
    e8m0, ue4m3 = ft._e8m0_table(), ft._ue4m3_unit_table()
  finally:
    monitoring.unregister_event_duration_listener(listener)
  assert len(lowered) <= 2, len(lowered)

  byte = jnp.arange(256, dtype=jnp.int32)
  k = jnp.minimum(byte, 254) - 127
  ref_e8m0 = ft._rows(fast.pow2_bits(-k), fast.pow2_bits(k), byte == sc.E8M0_NAN)
  ubyte = jnp.arange(256, dtype=jnp.uint32)
  s_b_val = fb.from_bits(sc.decode_bits(ubyte & jnp.uint32(0x7F), "e4m3"))
  one = jnp.uint32(sc.f32_const_bits(1.0))
  ref_ue4m3 = ft._rows(*scales_fast._float_tail(s_b_val, one, jnp.uint32(0), False),
                       ubyte == sc.UE4M3_NAN)
  assert (e8m0 == np.asarray(ref_e8m0)).all() and (ue4m3 == np.asarray(ref_ue4m3)).all()
