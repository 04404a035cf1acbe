"""LLaMA written with Flax's own layers only (nnx.Linear, nnx.Embed, jnp.einsum): the model a
user brings, for the interception tests. Its attribute names follow lpjax's LLaMA, so that the
two models share one parameter tree and lpjax's weights load into it unchanged; the non-GEMM
pieces (RMSNorm, RoPE, softmax, SwiGLU) are lpjax's own functions, so the two models differ
only in how their GEMMs are quantized: lpjax's layers, or the interception."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from lpjax.models import llama
from lpjax.models.llama import LlamaConfig


def _linear(n_in, n_out, rngs):
  return nnx.Linear(n_in, n_out, use_bias=False, dtype=jnp.float32, rngs=rngs)


class Attention(nnx.Module):
  def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs):
    d = cfg.hidden
    self.heads, self.head_dim, self.theta = cfg.heads, d // cfg.heads, cfg.rope_theta
    self.q_proj, self.k_proj = _linear(d, d, rngs), _linear(d, d, rngs)
    self.v_proj, self.o_proj = _linear(d, d, rngs), _linear(d, d, rngs)

  def __call__(self, x):
    b, length, d = x.shape
    split = lambda t: t.reshape(b, length, self.heads, self.head_dim)
    q = llama.rope(split(self.q_proj(x)), self.theta)
    k = llama.rope(split(self.k_proj(x)), self.theta)
    v = split(self.v_proj(x))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    probs = llama._causal_softmax(scores, math.sqrt(self.head_dim)).astype(x.dtype)
    return self.o_proj(jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, length, d))


class MLP(nnx.Module):
  def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs):
    self.gate_proj = _linear(cfg.hidden, cfg.intermediate, rngs)
    self.up_proj = _linear(cfg.hidden, cfg.intermediate, rngs)
    self.down_proj = _linear(cfg.intermediate, cfg.hidden, rngs)

  def __call__(self, x):
    return self.down_proj(llama._swiglu(self.gate_proj(x), self.up_proj(x)))


class RMSNorm(nnx.Module):
  def __init__(self, dim: int, eps: float):
    self.scale = nnx.Param(jnp.ones((dim,)))
    self.eps = eps

  def __call__(self, x):
    return llama._rms_norm(x, self.scale[...], self.eps)


class Block(nnx.Module):
  def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs):
    self.attn_norm, self.attn = RMSNorm(cfg.hidden, cfg.norm_eps), Attention(cfg, rngs)
    self.mlp_norm, self.mlp = RMSNorm(cfg.hidden, cfg.norm_eps), MLP(cfg, rngs)

  def __call__(self, x):
    x = x + self.attn(self.attn_norm(x))
    return x + self.mlp(self.mlp_norm(x))


class PlainLlama(nnx.Module):
  """`scan`: blocks stacked and run with nnx.scan (as lpjax's LLaMA by default); else a list."""

  def __init__(self, cfg: LlamaConfig, *, scan: bool = True, remat: bool = False,
               rngs: nnx.Rngs):
    self.scan, self.remat = scan, remat
    self.embed = nnx.Embed(cfg.vocab_size, cfg.hidden, rngs=rngs)
    if scan:
      @nnx.split_rngs(splits=cfg.layers)
      @nnx.vmap(in_axes=(0,), out_axes=0)
      def make_blocks(rngs):
        return Block(cfg, rngs)
      self.layers = make_blocks(rngs)
    else:
      self.layers = nnx.List([Block(cfg, rngs) for _ in range(cfg.layers)])
    self.norm = RMSNorm(cfg.hidden, cfg.norm_eps)
    self.lm_head = _linear(cfg.hidden, cfg.vocab_size, rngs)

  def __call__(self, tokens):
    x = jnp.take(self.embed.embedding[...], tokens, axis=0)
    run = lambda blk, h: blk(h)
    if self.remat:
      run = nnx.remat(run)
    if self.scan:
      x = nnx.scan(run, in_axes=(0, nnx.Carry), out_axes=nnx.Carry)(self.layers, x)
    else:
      for block in self.layers:
        x = run(block, x)
    return self.lm_head(self.norm(x))
