"""QuEST (the `quartet` preset's forward quantizer) against numpy, and the preset's backward.

Every GEMM of `quartet` (trust mask and inverse transform included) is also re-derived in numpy
by tests/quant/test_gemm.py::test_every_gemm_uses_the_recipe_operands.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import nvfp4_scheme_oracle as S  # noqa: E402

from lpjax.quant import recipes  # noqa: E402
from lpjax.quant.gemm.dot_general import dot_general  # noqa: E402
from lpjax.quant.recipes.gemm_recipe import GemmQuant, GemmRecipe, OperandQuant  # noqa: E402
from lpjax.quant.schemes.quest import quest  # noqa: E402

F32 = np.float32


def sample(seed):
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal((16, 128)) * np.exp2(rng.integers(-8, 8, (16, 1)))).astype(F32)
  x[0, 5] = 40.0  # an outlier: clipped, outside the trust mask
  x[1, :32] = 0.0  # an all-zero block
  x[2, :32] = 0.75  # a constant block: std 0 (or a rounding residue clamped at 0)
  x[3, :32] = np.tile([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25], 4)  # grid ties at e = 1 ...
  x[3, 31] = 3.0  # ... with std ~1.9: e = 2^floor(log2(0.487 * 1.9)) = 0.5 -> ties of t at 2x
  return x


def test_quest_matches_numpy():
  for seed in range(3):
    x = sample(seed)
    values, mask = jax.jit(quest, static_argnums=1)(x, 32)
    want_values, want_mask = S.quest(x, 32)
    np.testing.assert_array_equal(np.asarray(values), want_values)
    np.testing.assert_array_equal(np.asarray(mask), want_mask)
  assert not bool(mask[0, 5]) and float(values[1, :32].sum()) == 0


def test_trust_mask_clips_and_values_stay_on_the_scaled_grid():
  x = jnp.asarray(sample(4))
  values, mask = quest(x, 32)
  # Outside the mask the value is +-6 e (clipped); inside it is within half a grid step of x.
  g = np.asarray(x).reshape(16, 4, 32)
  e = np.asarray(values).reshape(16, 4, 32)
  m = np.asarray(mask).reshape(16, 4, 32)
  scale = np.max(np.where(m, 0, np.abs(e)), axis=-1, keepdims=True) / 6
  clipped = ~m
  assert clipped.any() and np.all(np.abs(g[clipped]) >= np.abs(e[clipped]))
  assert np.all(np.abs(e[clipped]) == np.broadcast_to(scale * 6, e.shape)[clipped])


def test_quartet_preset_and_its_checks():
  r = recipes.get("quartet")
  assert r.trust_masked and r.fwd.hadamard_block == 32 and r.needs_key
  assert r.dgrad.rhs.from_fwd and r.wgrad.lhs.from_fwd
  quest_op = OperandQuant("mxfp4", scheme="quest", hadamard_block=32)
  with pytest.raises(ValueError, match="both forward operands"):
    GemmRecipe(fwd=GemmQuant(lhs=quest_op, rhs=None))
  with pytest.raises(ValueError, match="both forward operands"):
    GemmRecipe(fwd=(quest_op, quest_op), dgrad=(quest_op, None))
  with pytest.raises(ValueError, match="residuals='quantized'"):
    dataclasses.replace(r, residuals="quantized")
  with pytest.raises(ValueError, match="MXFP4"):
    OperandQuant("nvfp4", scheme="quest", hadamard_block=32)
  with pytest.raises(ValueError, match="own scale"):
    OperandQuant("mxfp4", scheme="quest", hadamard_block=32, rounding="stochastic")
  with pytest.raises(ValueError, match="hadamard_block"):
    OperandQuant("mxfp4", scheme="quest")


def test_quartet_gradient_vanishes_outside_the_trust_mask_in_the_rotated_domain():
  """dX = H^T (mask * G): rotated back by H, dX is zero wherever the forward clipped X."""
  x = np.asarray(jax.random.normal(jax.random.key(0), (64, 64)))  # ~7% of QuEST's values clip
  w = jax.random.normal(jax.random.key(1), (64, 16)) * 0.05
  dims = (((1,), (0,)), ((), ()))
  dx = jax.jit(jax.grad(lambda x, k: jnp.sum(dot_general(x, w, dims, "quartet", key=k) ** 2)))(
      jnp.asarray(x), jax.random.key(2))
  from lpjax.quant.schemes.hadamard import hadamard
  rotated = hadamard(jnp.asarray(x), 32)
  mask = np.asarray(quest(rotated, 32)[1])
  g = np.asarray(hadamard(dx, 32))
  assert (~mask).sum() > 64 and mask.sum() > 64 * 32
  scale = np.abs(g[mask]).max()
  assert np.abs(g[~mask]).max() < 1e-5 * scale
