"""Models lpjax did not write, for the rule case table (test_rule_cases.py): linen and NNX MLPs,
an einsum MoE, linen attention, a Gram product, a scanned linen stack and a `model.factory` LM."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

D = 32
X = jax.random.normal(jax.random.key(0), (16, D))


class LinenMLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(D, name="b")(jnp.tanh(nn.Dense(64, name="a")(x)))


class NNXMLP(nnx.Module):
  def __init__(self, rngs):
    self.a, self.b = nnx.Linear(D, 64, rngs=rngs), nnx.Linear(64, D, rngs=rngs)

  def __call__(self, x):
    return self.b(jnp.tanh(self.a(x)))


class EinsumMoE(nn.Module):
  """Top-1 routing written with einsums: dispatch, expert, combine, and a gathered expert."""

  experts: int = 4

  @nn.compact
  def __call__(self, x):
    probs = jax.nn.softmax(nn.Dense(self.experts, name="router")(x), axis=-1)
    top = jnp.argmax(probs, -1)
    dispatch = jax.nn.one_hot(top, self.experts, dtype=x.dtype)
    w_in = self.param("w_in", nn.initializers.lecun_normal(), (self.experts, D, D))
    xe = jnp.einsum("te,td->etd", dispatch, x)  # dispatch
    ye = jnp.einsum("etd,edf->etf", xe, w_in)  # the experts (a stacked weight)
    y = jnp.einsum("te,etf->tf", dispatch * probs, ye)  # combine
    h = jnp.einsum("td,tdf->tf", x, w_in[top])  # a gathered expert
    return nn.Dense(D, name="out")(y + h)


class LinenAttention(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.MultiHeadDotProductAttention(num_heads=2, name="mha")(x, x)


class Gram(nn.Module):
  """h h^T h: two products of activations, no softmax between them (not attention)."""

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(D, name="proj")(x)
    return (h @ h.T) @ h


class ScannedLinen(nn.Module):
  """Three blocks under nn.scan (one path for all blocks), each a Dense "up"."""

  @nn.compact
  def __call__(self, x):
    class Block(nn.Module):
      @nn.compact
      def __call__(self, h, _):
        return jnp.tanh(nn.Dense(D, name="up")(h)), None

    blocks = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=3)
    return blocks(name="layers")(x, None)[0]


def linen_lm(vocab_size):
  """A `model.factory` LM (linen): embedding, one Dense "mix", the head."""

  class LM(nn.Module):
    @nn.compact
    def __call__(self, tokens):
      h = nn.Embed(vocab_size, D, name="embed")(tokens)
      return nn.Dense(vocab_size, name="head")(jnp.tanh(nn.Dense(D, name="mix")(h)))

  return LM()
