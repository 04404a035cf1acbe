"""benchmarks/common/hlo_fingerprint.py: only what changes the program changes the fingerprint."""

import os
import sys

import jax
import jax.numpy as jnp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path[:0] = [os.path.join(os.path.join(ROOT, "benchmarks"), d)
                for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/

from hlo_fingerprint import fingerprint, program_text  # noqa: E402


def _compiled(fn):
  return jax.jit(fn).lower(jnp.ones((8, 8))).compile().as_text()


def test_the_same_program_from_other_source_lines_has_one_fingerprint():
  def f(x):
    return jnp.tanh(x @ x) * 2.0

  def g(x):  # the same computation, written elsewhere (another source line and function name)
    y = x @ x
    return jnp.tanh(y) * 2.0

  hf, hg = _compiled(f), _compiled(g)
  assert "metadata=" in hf and program_text(hf) == program_text(hg)
  assert fingerprint(hf) == fingerprint(hg)


def test_another_program_has_another_fingerprint():
  assert fingerprint(_compiled(lambda x: jnp.tanh(x @ x) * 2.0)) != fingerprint(
      _compiled(lambda x: jnp.tanh(x @ x) * 3.0))


def test_docstring_example():
  import doctest
  import hlo_fingerprint
  assert doctest.testmod(hlo_fingerprint).failed == 0
