"""Kept sites never run below the model's own dtype (issue 48, item 1): QuantPolicy's default
`high_precision="auto"` runs a kept GEMM on its operands as given, i.e. the original program's
GEMM, under every recipe; `high_precision="bf16"` keeps casting to bf16."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from lpjax import quant

V, D, T = 23, 32, 8
TOKENS = jax.random.randint(jax.random.key(5), (2, T), 0, V)
KEY = jax.random.key(7)


class KeptAndQuantized(nn.Module):
  """Attention on the embeddings (no projections), a tied head (`attend`, auto-named Embed_0) and
  a named head on its output: every input of a kept GEMM comes from no quantized GEMM, so the
  kept sites' outputs can be compared with the unwrapped model's, bit for bit. `mlp` is the one
  quantized site."""

  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(V, D, dtype=self.dtype)
    x = embed(tokens)
    with jax.named_scope("attn"):
      s = jnp.einsum("bqd,bkd->bqk", x, x) / jnp.sqrt(jnp.asarray(D, self.dtype))
      a = jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, axis=-1), x)
    kept = (a, embed.attend(a), nn.Dense(V, name="head", dtype=self.dtype)(a))
    return kept, nn.Dense(D, name="mlp", dtype=self.dtype)(a)


def _outputs(policy, dtype=jnp.float32):
  model = KeptAndQuantized(dtype=dtype)
  variables = model.init(jax.random.key(0), TOKENS)
  q = quant.quantize_model(model, policy)
  def loss(v, apply):  # through the kept outputs only (mlp's gradient is zero on both sides)
    kept, _ = apply(v)
    return sum(jnp.sum(jnp.sin(k.astype(jnp.float32))) for k in kept)
  plain_apply = lambda v: model.apply(v, TOKENS)
  q_apply = lambda v: q.apply(v, TOKENS, quant_key=KEY)
  ref = jax.jit(plain_apply)(variables), jax.jit(jax.grad(lambda v: loss(v, plain_apply)))(variables)
  got = jax.jit(q_apply)(variables), jax.jit(jax.grad(lambda v: loss(v, q_apply)))(variables)
  rep = quant.report(q, variables, TOKENS, quant_key=KEY)
  return ref, got, rep


def _equal(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(la, lb))


# XLA's numerics differ between releases (docs/numerics.md §13, "Across JAX releases"): from
# jax 0.11, XLA may sum the embedding gradient's contributions (the gather's scatter-add, the
# tied head, attention) in another order in the intercepted program than in the plain one. That
# moves a few elements by up to one ulp, in the model's compute dtype, of the leaf's largest
# element (seen on jax 0.12.1: 4 of 736 by 0.5 ulp in float32, 16 of 736 by 0.23 ulp in
# bfloat16). Forward outputs stay bit for bit; on the pinned jax 0.10 gradients are too.
GRAD_ULPS = 0 if tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 11) else 1


def _grads_equal(a, b, dtype=jnp.float32):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  if len(la) != len(lb) or any(x.dtype != y.dtype for x, y in zip(la, lb)):
    return False
  for x, y in zip(la, lb):
    eps = float(jnp.finfo(dtype).eps)
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    ulp = eps * np.abs(y).max()
    if np.abs(x - y).max() > GRAD_ULPS * ulp:
      return False
  return True


@pytest.mark.parametrize("recipe", ["mxfp4", "nvfp4"])
def test_fp32_model_kept_sites_are_the_original_gemms_bit_for_bit(recipe):
  ((kept_ref, mlp_ref), grad_ref), ((kept, mlp), grad), rep = _outputs(quant.QuantPolicy(recipe=recipe))
  st = {s.path: (s.recipe, s.status) for s in rep.sites}
  assert st["mlp"] == (recipe, "quantized")
  for path in ("attn/attn_scores", "attn/attn_values", "Embed_0", "head"):
    assert st[path] == ("auto", "high precision"), (path, st)
  assert _equal(kept, kept_ref) and _grads_equal(grad, grad_ref)  # attention, tied, named head
  assert not np.array_equal(mlp, mlp_ref)  # the quantized site is quantized
  assert all(k.dtype == jnp.float32 for k in kept)


def test_explicit_bf16_high_precision_still_casts_kept_sites():
  ((kept_ref, _), _), ((kept, _), _), rep = _outputs(
      quant.QuantPolicy(recipe="mxfp4", high_precision="bf16"))
  assert {s.recipe for s in rep.sites if s.status == "high precision"} == {"bf16"}
  for k, r in zip(kept, kept_ref):  # bf16 operands: near, not equal
    assert not np.array_equal(k, r)
    assert float(jnp.linalg.norm(k - r) / jnp.linalg.norm(r)) < 2e-2


def test_bf16_model_kept_sites_stay_bf16_and_exact():
  ((kept_ref, _), grad_ref), ((kept, _), grad), _ = _outputs(
      quant.QuantPolicy(recipe="mxfp4"), dtype=jnp.bfloat16)
  assert all(k.dtype == jnp.bfloat16 for k in kept)
  assert _equal(kept, kept_ref) and _grads_equal(grad, grad_ref, jnp.bfloat16)
