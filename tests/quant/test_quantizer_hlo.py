"""The structure of the compiled quantizer, a speed property checked without timing: fake_quant of
an FP4 format reads its operand twice (the block amax, then the element pass), writes one output,
and in between runs a fixed, small number of kernels over per-group arrays (the scale byte and one
gather of its factors: lpjax.quant.codec.factor_tables), with no Threefry in stochastic rounding.

Before the per-group factors were looked up by scale byte, mxfp4 compiled to 10 such kernels and
nvfp4 to 16 (each factor, mask and scale its own pass over the groups, plus a conditional and a
second max over the block amaxes for NVFP4's tensor amax).
"""

import re

import jax
import jax.numpy as jnp
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
# conditional (float / exact; one runs) and a copy of the block amaxes for the tensor amax.
CASES = [("mxfp4", 32, 3), ("nvfp4", 16, 6), ("nvfp4_16x16", 256, 6)]


@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
@pytest.mark.parametrize("fmt,group,most", CASES)
def test_fake_quant_passes_over_the_operand_and_the_groups(fmt, group, most, rounding):
  text = _compiled_text(fmt, rounding)
  groups = SHAPE[0] * SHAPE[1] // group
  assert _operand_reads(text) <= 2, "x is read more than twice (amax pass, element pass)"
  kernels = _kernels_at_least(text, groups)
  assert kernels <= most, f"{kernels} kernels over per-group or larger arrays, at most {most}"
  assert "threefry" not in text.lower()  # SR bits: the counter hash of lpjax.quant.numerics.rng
