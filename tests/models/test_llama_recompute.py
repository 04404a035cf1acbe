"""LLaMA's nonlinear pieces keep only their inputs for the backward pass, with unchanged values."""

import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals

from lpjax.models import llama


def _saved(f, *args):
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    print_saved_residuals(f, *args)
  return [line for line in out.getvalue().splitlines() if line.strip()]


def _bytes(saved_lines):
  total = 0
  for line in saved_lines:
    dtype, dims = line.split()[0].rstrip("]").split("[")
    size = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
    total += size * {"bf16": 2, "f16": 2, "f32": 4, "bool": 1, "pred": 1}[dtype]
  return total


def _ref_softmax(scores, temperature):
  length = scores.shape[-1]
  logits = scores.astype(jnp.float32) / temperature
  causal = jnp.tril(jnp.ones((length, length), bool))
  return jax.nn.softmax(jnp.where(causal, logits, jnp.finfo(jnp.float32).min), axis=-1)


def _ref_rms_norm(x, scale, eps):
  xf = x.astype(jnp.float32)
  y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  return (y * scale).astype(x.dtype)


CASES = {
    "swiglu": (llama._swiglu, lambda g, u: jax.nn.silu(g) * u, ((6, 40), (6, 40))),
    "softmax": (lambda s: llama._causal_softmax(s, 4.0), lambda s: _ref_softmax(s, 4.0),
                ((2, 3, 16, 16),)),
    "rms_norm": (lambda x, s: llama._rms_norm(x, s, 1e-6), lambda x, s: _ref_rms_norm(x, s, 1e-6),
                 ((6, 40), (40,))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_only_the_inputs_are_saved(name):
  f, ref, shapes = CASES[name]
  args = [jnp.ones(s, jnp.bfloat16 if i == 0 or name == "swiglu" else jnp.float32)
          for i, s in enumerate(shapes)]
  saved = _saved(f, *args)
  assert saved and all("from the argument" in line for line in saved), saved
  assert len(saved) == len(args)
  assert _bytes(saved) < _bytes(_saved(ref, *args))  # plain autodiff keeps more (or float32)


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_match_plain_autodiff(name):
  f, ref, shapes = CASES[name]
  keys = jax.random.split(jax.random.key(0), len(shapes) + 1)
  args = [jax.random.normal(k, s, jnp.float32) for k, s in zip(keys, shapes)]
  cot = jax.random.normal(keys[-1], jax.eval_shape(ref, *args).shape, jnp.float32)
  loss = lambda g: lambda *a: jnp.sum(g(*a).astype(jnp.float32) * cot)
  np.testing.assert_allclose(f(*args), ref(*args), rtol=1e-6, atol=1e-7)
  for got, want in zip(jax.grad(loss(f), argnums=tuple(range(len(args))))(*args),
                       jax.grad(loss(ref), argnums=tuple(range(len(args))))(*args)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
