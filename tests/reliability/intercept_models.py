"""Tiny user models for the interception's case table (issue 48, items 1-8 and the fresh pass):
linen, NNX and plain JAX, with attention, heads, tied embeddings, LoRA, MoE, gated MLPs, convs.

Each builder returns `(fn, params, args)`: `fn(params, *args)` is the unquantized model, so that
`quant.quantized(fn, policy)(params, *args)` is the intercepted one (linen and NNX models are
wrapped with `quantize_model` by the helpers in the table).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

V, D, T = 23, 32, 8  # vocabulary, width, tokens
TOKENS = jax.random.randint(jax.random.key(5), (2, T), 0, V)
X = jax.random.normal(jax.random.key(6), (2, T, D))


def _attend(q, k, v):
  s = jnp.einsum("bqd,bkd->bqk", q, k) / jnp.sqrt(q.shape[-1])
  return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, axis=-1), v)


class LinenLM(nn.Module):
  """Auto-named Embed_0 tied to the output through `attend`, hand-written attention, a gated
  MLP (Dense_0..); `dtype` is the activation dtype."""

  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(V, D, dtype=self.dtype)
    x = embed(tokens)
    q, k, v = (nn.Dense(D, dtype=self.dtype)(x) for _ in range(3))
    x = x + nn.Dense(D, dtype=self.dtype)(_attend(q, k, v))
    h = nn.silu(nn.Dense(2 * D, dtype=self.dtype)(x)) * nn.Dense(2 * D, dtype=self.dtype)(x)
    x = x + nn.Dense(D, dtype=self.dtype)(h)
    return embed.attend(nn.LayerNorm(dtype=self.dtype)(x))


class LinenFlaxAttention(nn.Module):
  """Flax's own attention layer and an untied head named LM_Head (case)."""

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(V, D, name="token_embed")(tokens)
    x = x + nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=D)(x)
    return nn.Dense(V, name="LM_Head")(x)


class NNXLM(nnx.Module):
  """NNX: an embedding, attention, an untied head named "head"."""

  def __init__(self, rngs, dtype=jnp.float32):
    self.embed = nnx.Embed(V, D, dtype=dtype, rngs=rngs)
    self.q, self.k, self.v = (nnx.Linear(D, D, dtype=dtype, rngs=rngs) for _ in range(3))
    self.up = nnx.Linear(D, 2 * D, dtype=dtype, rngs=rngs)
    self.down = nnx.Linear(2 * D, D, dtype=dtype, rngs=rngs)
    self.head = nnx.Linear(D, V, dtype=dtype, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens)
    x = x + _attend(self.q(x), self.k(x), self.v(x))
    x = x + self.down(jax.nn.gelu(self.up(x)))
    return self.head(x)


class NNXTied(nnx.Module):
  """NNX with a tied head through `attend` and an encoder reusing one layer twice."""

  def __init__(self, rngs):
    self.tok = nnx.Embed(V, D, rngs=rngs)
    self.mix = nnx.Linear(D, D, rngs=rngs)

  def __call__(self, tokens):
    x = self.tok(tokens)
    x = self.mix(jax.nn.relu(self.mix(x)))  # one layer applied twice
    return self.tok.attend(x)


def plain_params(key=0, dtype=jnp.float32):
  ks = jax.random.split(jax.random.key(key), 8)
  n = lambda k, s: (jax.random.normal(k, s) / jnp.sqrt(s[0])).astype(dtype)
  return {"wte": {"embedding": n(ks[0], (V, D))},
          "attn": {"wq": n(ks[1], (D, D)), "wk": n(ks[2], (D, D)), "wv": n(ks[3], (D, D))},
          "mlp": {"up": {"w": n(ks[4], (D, 2 * D))}, "down": {"weight": n(ks[5], (2 * D, D))}},
          "lm_head": {"kernel": n(ks[6], (D, V))}}


def plain_lm(p, tokens):
  """A plain-JAX LM: take() embedding, attention, MLP with w / weight leaf names, a head."""
  x = jnp.take(p["wte"]["embedding"], tokens, axis=0)
  a = p["attn"]
  x = x + _attend(x @ a["wq"], x @ a["wk"], x @ a["wv"])
  x = x + jax.nn.gelu(x @ p["mlp"]["up"]["w"]) @ p["mlp"]["down"]["weight"]
  return x @ p["lm_head"]["kernel"]


def plain_tied_lm(p, tokens):
  """A plain-JAX LM whose output layer is the embedding table (tied), named only "table"."""
  x = jnp.take(p["table"], tokens, axis=0)
  x = jnp.tanh(x @ p["mix"])
  return x @ p["table"].T


def tied_params(key=0):
  k1, k2 = jax.random.split(jax.random.key(key))
  return {"table": jax.random.normal(k1, (V, D)), "mix": jax.random.normal(k2, (D, D)) / D ** .5}


def linen_fn(model: nn.Module, *args):
  """(apply, variables) of a linen model initialised on `args`."""
  return model.apply, model.init(jax.random.key(0), *args)


def nnx_fn(model: nnx.Module):
  """(fn(state, *args), state) of an NNX model: the split / merge pair a training step uses."""
  graphdef, state = nnx.split(model)
  return (lambda s, *a: nnx.merge(graphdef, s)(*a)), state


# --- models of the fresh adversarial pass (test_bad_inputs_intercept_fresh.py) ----------------


class MoE(nn.Module):
  """A top-1 router (kept: a gate with few outputs still quantizes; routing reads its argmax) and
  two experts as one stacked einsum weight."""

  @nn.compact
  def __call__(self, x):
    logits = nn.Dense(2, name="router")(x)
    experts = self.param("experts", nn.initializers.normal(0.1), (2, D, D))
    y = jnp.einsum("btd,edf->btef", x, experts)
    gate = jax.nn.one_hot(jnp.argmax(logits, -1), 2) * jax.nn.softmax(logits, -1)
    return jnp.einsum("btef,bte->btf", y, gate)


class Gated(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(D, name="down")(nn.silu(nn.Dense(64, name="gate")(x)) * nn.Dense(64, name="up")(x))


class Convs(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Conv(32, (3, 3), name="stem")(x)
    x = nn.Conv(32, (3, 3), feature_group_count=4, name="grouped")(x)
    x = nn.Conv(32, (3, 3), kernel_dilation=2, name="dilated")(x)
    x = nn.Conv(32, (3, 3), feature_group_count=32, name="depthwise")(x)
    return nn.Dense(10, name="head")(x.mean((1, 2)))


IMG = jax.random.normal(jax.random.key(8), (2, 8, 8, 3))


class MixedDenseEinsum(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Dense(D, name="dense")(x)
    x = nn.Einsum((D, 2, 16), "btd,dhk->bthk", name="einsum")(x)
    return nn.DenseGeneral(D, axis=(-2, -1), name="out")(x)


class TiedEncoderDecoder(nn.Module):
  """An autoencoder whose decoder is the encoder's kernel transposed (tied weights)."""

  @nn.compact
  def __call__(self, x):
    w = self.param("tied", nn.initializers.normal(0.1), (D, 16))
    return jnp.tanh(x @ w) @ w.T


class ScannedLM(nn.Module):
  """nn.scan over two remat'd blocks, auto-named Embed_0 and Dense head."""

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(V, D)(tokens)
    block = nn.remat(Gated)
    Scanned = nn.scan(lambda m, c, _: (c + m(c), None), variable_axes={"params": 0},
                      split_rngs={"params": True}, length=2)
    x, _ = Scanned(block(name="layers"), x, None)
    return nn.Dense(V, name="head")(x)
