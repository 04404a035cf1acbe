"""LLaMA (RMSNorm, RoPE, SwiGLU, no biases) in Flax NNX, every matmul through lpjax.nn.

The projections (q, k, v, o, gate, up, down) and the LM head are `QDense` layers and the two
attention products are `QEinsum`s, all governed by a `QuantPolicy` (by default the embeddings,
LM head, norms and attention products stay in high precision; NUMERICS.md §7). Sizes follow
NUMERICS.md §10 (`lpjax.train.config.LLAMA_SIZES`).

Examples:
  >>> import jax, jax.numpy as jnp
  >>> cfg = LlamaConfig(vocab_size=257, hidden=64, intermediate=160, heads=4, layers=2, max_seq_len=32)
  >>> graphdef, params = abstract_model(cfg)
  >>> params = init_params(cfg, jax.random.key(0))
  >>> logits = apply(graphdef, cfg, params, jnp.zeros((2, 16), jnp.int32), None, jax.random.key(1))
  >>> logits.shape
  (2, 16, 257)
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from lpjax.nn import QDense, QEinsum, apply_policy
from lpjax.nn.sharding_hints import constrain
from lpjax.quant import recipes
from lpjax.quant.policy import QuantPolicy, recipe_override

# Logical axes of the parameters, by path (lpjax.train.sharding maps them onto the mesh).
PARTITION_RULES = (
    (r"embed/embedding", ("vocab", "embed")),
    (r"(q_proj|k_proj|v_proj)/kernel", ("embed", "heads")),
    (r"o_proj/kernel", ("heads", "embed")),
    (r"(gate_proj|up_proj)/kernel", ("embed", "mlp")),
    (r"down_proj/kernel", ("mlp", "embed")),
    (r"lm_head/kernel", ("embed", "vocab")),
    (r"norm", ("norm",)),
)

# Logical axes of the activations (hints that the trainer maps onto its mesh; no-ops elsewhere).
_EMBED = ("batch", "length", "act_embed")
_HEADS = ("batch", "length", "act_heads", None)
_MLP = ("batch", "length", "act_mlp")
_VOCAB = ("batch", "length", "act_vocab")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LlamaConfig:
  vocab_size: int  # tokens
  hidden: int  # model width
  intermediate: int  # SwiGLU width
  heads: int  # attention heads
  layers: int  # transformer blocks
  max_seq_len: int  # RoPE table length
  rope_theta: float = 10000.0  # RoPE base
  norm_eps: float = 1e-6  # RMSNorm epsilon
  recipe: str = "bf16"  # GEMM recipe of the quantized layers (lpjax.quant.recipes)
  high_precision: str = "bf16"  # recipe of the layers the policy keeps in high precision
  pure: bool = False  # quantize embeddings and LM head too
  keep_first: int = 0  # first N blocks in high precision
  keep_last: int = 0  # last N blocks in high precision
  residuals: str = ""  # "" = the recipe's; "quantized": save packed low-precision GEMM operands
  remat: bool = False  # recompute block activations in the backward pass
  scan_layers: bool = True  # one scanned block (compiles once) instead of `layers` unrolled copies
  compute_dtype: str = "float32"  # activation dtype
  param_dtype: str = "float32"  # master weight dtype

  @classmethod
  def from_config(cls, config, vocab_size: int) -> "LlamaConfig":
    from lpjax.train.config import LLAMA_SIZES

    size = LLAMA_SIZES[config.model.size]
    return cls(vocab_size=config.model.vocab_size or vocab_size, hidden=size.hidden,
               intermediate=size.intermediate, heads=size.heads, layers=size.layers,
               max_seq_len=config.model.max_seq_len or config.seq_len, recipe=config.quant.recipe,
               high_precision=config.quant.high_precision_recipe,
               pure=config.quant.policy == "pure", keep_first=config.quant.keep_first,
               keep_last=config.quant.keep_last, residuals=config.quant.residuals,
               remat=config.model.remat, scan_layers=config.model.scan_layers,
               compute_dtype=config.model.compute_dtype, param_dtype=config.model.param_dtype)

  def policy(self) -> QuantPolicy:
    recipe = recipes.get(self.recipe)
    if self.residuals and not recipe.is_high_precision:
      recipe = dataclasses.replace(recipe, residuals=self.residuals)
    return QuantPolicy(recipe=recipe, high_precision=self.high_precision, pure=self.pure,
                       keep_first_blocks=self.keep_first, keep_last_blocks=self.keep_last,
                       num_blocks=self.layers)

  @property
  def scanned(self) -> bool:
    """Scan over blocks unless per-block recipes differ (keep_first / keep_last blocks)."""
    return self.scan_layers and not (self.keep_first or self.keep_last)

  @property
  def num_params_estimate(self) -> int:
    per_block = 4 * self.hidden**2 + 3 * self.hidden * self.intermediate + 2 * self.hidden
    return self.layers * per_block + 2 * self.vocab_size * self.hidden + self.hidden


class RMSNorm(nnx.Module):
  def __init__(self, dim: int, eps: float, param_dtype):
    self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
    self.eps = eps

  def __call__(self, x):
    return _rms_norm(x, self.scale[...], self.eps)


# The nonlinear pieces are recomputed in the backward pass from their inputs (jax.checkpoint),
# so a step without remat keeps only those inputs, in the compute dtype, instead of every float32
# intermediate (selective recomputation, as Megatron's). The formulas are unchanged, but XLA fuses
# the checkpointed program differently, so results can differ from plain autodiff in the last
# float32 bits (tiny LLaMA's first loss moved by 1e-5; after 300 steps eval loss 2.322 -> 2.332,
# bf16 + AdamW, within seed-to-seed noise).
@functools.partial(jax.checkpoint, static_argnums=(2,))
def _rms_norm(x, scale, eps: float):
  xf = x.astype(jnp.float32)
  y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  return (y * scale.astype(jnp.float32)).astype(x.dtype)


@functools.partial(jax.checkpoint, static_argnums=(1,))
def _causal_softmax(scores, temperature: float):
  """softmax(scores / temperature) over the last axis, causally masked, in float32."""
  length = scores.shape[-1]
  logits = scores.astype(jnp.float32) / temperature
  causal = jnp.tril(jnp.ones((length, length), bool))
  logits = jnp.where(causal[None, None], logits, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(logits, axis=-1)


@jax.checkpoint
def _swiglu(gate, up):
  return jax.nn.silu(gate) * up


def rope(x, theta: float):
  """Rotary position embedding of x (B, L, H, D), positions 0..L-1 (half-split convention)."""
  _, length, _, dim = x.shape
  freqs = 1.0 / (theta ** (jnp.arange(0, dim // 2, dtype=jnp.float32) * 2.0 / dim))
  angles = jnp.arange(length, dtype=jnp.float32)[:, None] * freqs[None, :]
  cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def _dense(cfg, n_in, n_out, rngs, std):
  return QDense(n_in, n_out, use_bias=False, dtype=jnp.dtype(cfg.compute_dtype),
                param_dtype=jnp.dtype(cfg.param_dtype),
                kernel_init=nnx.initializers.normal(std), recipe=cfg.recipe, rngs=rngs)


class Attention(nnx.Module):
  def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs):
    d, std = cfg.hidden, 0.02
    out_std = std / math.sqrt(2 * cfg.layers)
    self.heads, self.head_dim, self.theta = cfg.heads, d // cfg.heads, cfg.rope_theta
    self.q_proj = _dense(cfg, d, d, rngs, std)
    self.k_proj = _dense(cfg, d, d, rngs, std)
    self.v_proj = _dense(cfg, d, d, rngs, std)
    self.o_proj = _dense(cfg, d, d, rngs, out_std)
    self.attn_scores = QEinsum("bqhd,bkhd->bhqk", recipe=cfg.recipe, rngs=rngs)
    self.attn_values = QEinsum("bhqk,bkhd->bqhd", recipe=cfg.recipe, rngs=rngs)

  def __call__(self, x, key):
    b, length, d = x.shape
    keys = jax.random.split(key, 6)
    split = lambda t: constrain(t.reshape(b, length, self.heads, self.head_dim), _HEADS)
    q = rope(split(self.q_proj(x, key=keys[0])), self.theta)
    k = rope(split(self.k_proj(x, key=keys[1])), self.theta)
    v = split(self.v_proj(x, key=keys[2]))
    scores = self.attn_scores(q, k, key=keys[3])
    probs = _causal_softmax(scores, math.sqrt(self.head_dim)).astype(x.dtype)
    out = self.attn_values(probs, v, key=keys[4]).reshape(b, length, d)
    return self.o_proj(out, key=keys[5])


class MLP(nnx.Module):
  def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs):
    std, out_std = 0.02, 0.02 / math.sqrt(2 * cfg.layers)
    self.gate_proj = _dense(cfg, cfg.hidden, cfg.intermediate, rngs, std)
    self.up_proj = _dense(cfg, cfg.hidden, cfg.intermediate, rngs, std)
    self.down_proj = _dense(cfg, cfg.intermediate, cfg.hidden, rngs, out_std)

  def __call__(self, x, key):
    k = jax.random.split(key, 3)
    h = _swiglu(self.gate_proj(x, key=k[0]), self.up_proj(x, key=k[1]))
    return self.down_proj(constrain(h, _MLP), key=k[2])


class Block(nnx.Module):
  def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs):
    pd = jnp.dtype(cfg.param_dtype)
    self.attn_norm = RMSNorm(cfg.hidden, cfg.norm_eps, pd)
    self.attn = Attention(cfg, rngs)
    self.mlp_norm = RMSNorm(cfg.hidden, cfg.norm_eps, pd)
    self.mlp = MLP(cfg, rngs)

  def __call__(self, x, key):
    k1, k2 = jax.random.split(key)
    x = constrain(x + self.attn(self.attn_norm(x), k1), _EMBED)
    return constrain(x + self.mlp(self.mlp_norm(x), k2), _EMBED)


class Llama(nnx.Module):
  def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    pd = jnp.dtype(cfg.param_dtype)
    self.embed = nnx.Embed(cfg.vocab_size, cfg.hidden, param_dtype=pd,
                           embedding_init=nnx.initializers.normal(0.02), rngs=rngs)
    if cfg.scanned:  # parameters stacked on a leading "layers" axis
      @nnx.split_rngs(splits=cfg.layers)
      @nnx.vmap(in_axes=(0,), out_axes=0)
      def make_blocks(rngs):
        return Block(cfg, rngs)
      self.layers = make_blocks(rngs)
    else:
      self.layers = nnx.List([Block(cfg, rngs) for _ in range(cfg.layers)])
    self.norm = RMSNorm(cfg.hidden, cfg.norm_eps, pd)
    self.lm_head = _dense(cfg, cfg.hidden, cfg.vocab_size, rngs, 0.02)
    apply_policy(self, cfg.policy())

  def __call__(self, tokens, *, key):
    cfg = self.cfg
    if tokens.shape[-1] > cfg.max_seq_len:
      raise ValueError(f"Sequence length {tokens.shape[-1]} exceeds the model's max_seq_len "
                       f"{cfg.max_seq_len}.")
    table = self.embed.embedding[...]
    if cfg.pure:  # "pure" low precision: the embedding table is fake-quantized too
      table = _fake_quant_table(table, self.lm_head.active_recipe(), key)
    x = constrain(jnp.take(table, tokens, axis=0).astype(jnp.dtype(cfg.compute_dtype)), _EMBED)
    keys = jax.random.split(key, cfg.layers + 1)
    run_block = lambda blk, h, k: blk(h, k)
    if cfg.remat:
      run_block = nnx.remat(run_block)
    if cfg.scanned:
      x = nnx.scan(run_block, in_axes=(0, nnx.Carry, 0), out_axes=nnx.Carry)(
          self.layers, x, keys[:-1])
    else:
      for i, block in enumerate(self.layers):
        x = run_block(block, x, keys[i])
    return constrain(self.lm_head(self.norm(x), key=keys[-1]), _VOCAB)


def _fake_quant_table(table, recipe, key):
  """The forward weight quantizer of `recipe` applied to the embedding rows (pure mode)."""
  from lpjax.quant import operand

  op = recipe.fwd.rhs if recipe.fwd is not None else None
  if op is None or op == "reuse_fwd":
    return table
  return operand.fake(table, op, axis=-1, key=key)


def abstract_model(cfg: LlamaConfig):
  """(graphdef, abstract params) without allocating anything."""
  model = nnx.eval_shape(lambda: Llama(cfg, rngs=nnx.Rngs(params=0)))
  graphdef, params = nnx.split(model, nnx.Param)
  return graphdef, params


def init_params(cfg: LlamaConfig, key):
  model = Llama(cfg, rngs=nnx.Rngs(params=key))
  return nnx.split(model, nnx.Param)[1]


def apply(graphdef, cfg: LlamaConfig, params, tokens, recipe, key):
  """Logits (B, L, vocab) in float32; `recipe` (a name or None) overrides the policy's recipe."""
  model = nnx.merge(graphdef, params)
  with recipe_override(recipe):
    return model(tokens, key=key).astype(jnp.float32)
