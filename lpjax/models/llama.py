"""LLaMA (RMSNorm, RoPE, SwiGLU, no biases) in Flax NNX, every matmul through lpjax.nn.

The projections (q, k, v, o, gate, up, down) and the LM head are `QDense` layers and the two
attention products are `QEinsum`s, all governed by the `QuantPolicy` the model is built with
(by default the embeddings, LM head, norms and attention products stay in high precision;
docs/numerics.md §7). A quantized attention-values product stays causal: its quantizer's key
blocks before each query's block go through the recipe, the query's own block in float32
(`lpjax.models._causal_values`). `LlamaConfig` holds the architecture only; sizes follow docs/numerics.md §10
(`LLAMA_SIZES`).

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lpjax.quant import REUSE_FWD, QuantPolicy, fake_quant_operand
  >>> cfg = LlamaConfig(vocab_size=257, hidden=64, intermediate=160, heads=4, layers=2, max_seq_len=32)
  >>> policy = QuantPolicy.from_settings("mxfp4_naive")
  >>> graphdef, params = abstract_model(cfg, policy)
  >>> params = init_params(cfg, jax.random.key(0), policy)
  >>> logits = apply(graphdef, cfg, params, jnp.zeros((2, 16), jnp.int32), None, jax.random.key(1))
  >>> logits.shape
  (2, 16, 257)
  >>> bf16 = apply(graphdef, cfg, params, jnp.zeros((2, 16), jnp.int32), policy.with_recipe("bf16"),
  ...              jax.random.key(1))   # another policy for one call (a precision schedule's switch)
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from lpjax import quant
from lpjax.models import _site_keys
from lpjax.models._causal_values import causal_values, key_span
from lpjax.models.llama_sizes import LLAMA_SIZES, LlamaSize
from lpjax.nn import QDense, QEinsum, apply_policy, constrain
from lpjax.quant import REUSE_FWD, QuantPolicy, fake_quant_operand

# Logical axes of the parameters, by path (lpjax.train.step._sharding maps them onto the mesh).
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
  remat: bool = False  # recompute block activations in the backward pass
  scan_layers: bool = True  # one scanned block (compiles once) instead of `layers` unrolled copies
  compute_dtype: str = "float32"  # activation dtype
  param_dtype: str = "float32"  # master weight dtype
  num_kv_heads: int = 0  # k / v heads (grouped-query attention, heads a multiple); 0: heads
  tie_embeddings: bool = False  # the LM head is the embedding table (no lm_head parameter)
  # RoPE frequency scaling as sorted (key, value) pairs of Hugging Face's rope_scaling dict;
  # () plain RoPE. Supported: rope_type "llama3" (factor, low_freq_factor, high_freq_factor,
  # original_max_position_embeddings), as Llama 3.1+ checkpoints use it
  rope_scaling: tuple = ()

  @property
  def kv_heads(self) -> int:
    """The k / v heads (`num_kv_heads`, or one per query head)."""
    return self.num_kv_heads or self.heads

  @classmethod
  def from_size(cls, size: str, **fields) -> "LlamaConfig":
    """The config of a named size of `LLAMA_SIZES` ("tiny", "60m", ..., "1b")."""
    if size not in LLAMA_SIZES:
      raise ValueError(f"Unknown LLaMA size {size!r}; valid: {', '.join(LLAMA_SIZES)}.")
    d = LLAMA_SIZES[size]
    return cls(hidden=d.hidden, intermediate=d.intermediate, heads=d.heads, layers=d.layers,
               **fields)

  def scanned(self, policy: QuantPolicy) -> bool:
    """Scan over blocks unless `policy` gives blocks different recipes (keep_first / keep_last)."""
    return self.scan_layers and not policy.varies_by_block

  @property
  def num_params_estimate(self) -> int:
    kv = 2 * self.hidden * (self.hidden // self.heads) * self.kv_heads
    per_block = 2 * self.hidden**2 + kv + 3 * self.hidden * self.intermediate + 2 * self.hidden
    tables = (1 if self.tie_embeddings else 2) * self.vocab_size * self.hidden
    return self.layers * per_block + tables + self.hidden


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


def _llama3_freqs(freqs, scaling: dict):
  """Llama 3's RoPE frequencies (Hugging Face's `_compute_llama3_parameters`): wavelengths past
  original_max_position_embeddings / low_freq_factor slowed by `factor`, those under
  .../ high_freq_factor kept, the ones between interpolated smoothly."""
  factor, low, high = (float(scaling[k]) for k in ("factor", "low_freq_factor",
                                                     "high_freq_factor"))
  old = float(scaling["original_max_position_embeddings"])
  wavelen = 2 * math.pi / freqs
  scaled = jnp.where(wavelen > old / low, freqs / factor, freqs)
  smooth = (old / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = (wavelen >= old / high) & (wavelen <= old / low)
  return jnp.where(medium, smoothed, scaled)


def rope(x, theta: float, scaling: tuple = ()):
  """Rotary position embedding of x (B, L, H, D), positions 0..L-1 (half-split convention);
  `scaling`: LlamaConfig.rope_scaling."""
  _, length, _, dim = x.shape
  freqs = 1.0 / (theta ** (jnp.arange(0, dim // 2, dtype=jnp.float32) * 2.0 / dim))
  if scaling:
    freqs = _llama3_freqs(freqs, dict(scaling))
  angles = jnp.arange(length, dtype=jnp.float32)[:, None] * freqs[None, :]
  cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def _dense(cfg, n_in, n_out, rngs, std, axes):
  return QDense(n_in, n_out, use_bias=False, dtype=jnp.dtype(cfg.compute_dtype),
                param_dtype=jnp.dtype(cfg.param_dtype), kernel_axes=axes,
                kernel_init=nnx.initializers.normal(std), rngs=rngs)


class Attention(nnx.Module):
  def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs):
    d, std = cfg.hidden, 0.02
    out_std = std / math.sqrt(2 * cfg.layers)
    self.heads, self.head_dim, self.theta = cfg.heads, d // cfg.heads, cfg.rope_theta
    self.kv_heads, self.rope_scaling = cfg.kv_heads, cfg.rope_scaling
    kv = self.kv_heads * self.head_dim
    self.q_proj = _dense(cfg, d, d, rngs, std, ("embed", "heads"))
    self.k_proj = _dense(cfg, d, kv, rngs, std, ("embed", "heads"))
    self.v_proj = _dense(cfg, d, kv, rngs, std, ("embed", "heads"))
    self.o_proj = _dense(cfg, d, d, rngs, out_std, ("heads", "embed"))
    self.attn_scores = QEinsum("bqhd,bkhd->bhqk", rngs=rngs)
    self.attn_values = QEinsum("bhqk,bkhd->bqhd", rngs=rngs)

  def __call__(self, x, key, block, keys=None):
    b, length, d = x.shape
    site = functools.partial(_site_keys.site, key, block, keys)
    split = lambda t: constrain(t.reshape(b, length, -1, self.head_dim), _HEADS)
    q = rope(split(self.q_proj(x, key=site(self.q_proj))), self.theta, self.rope_scaling)
    k = rope(split(self.k_proj(x, key=site(self.k_proj))), self.theta, self.rope_scaling)
    v = split(self.v_proj(x, key=site(self.v_proj)))
    if self.kv_heads != self.heads:  # grouped-query: query head h reads k / v head h // group
      group = self.heads // self.kv_heads
      k, v = (constrain(jnp.repeat(t, group, axis=2), _HEADS) for t in (k, v))
    scores = self.attn_scores(q, k, key=site(self.attn_scores))
    probs = _causal_softmax(scores, math.sqrt(self.head_dim)).astype(x.dtype)
    recipe = self.attn_values.active_recipe()
    span = 0 if recipe.is_high_precision else key_span(recipe)
    if span:  # quantized P V: no key block mixes later keys into earlier queries
      out = causal_values(self.attn_values, probs, v, key=site(self.attn_values), span=span)
    else:
      out = self.attn_values(probs, v, key=site(self.attn_values))
    out = out.reshape(b, length, d)
    return self.o_proj(out, key=site(self.o_proj))


class MLP(nnx.Module):
  def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs):
    std, out_std = 0.02, 0.02 / math.sqrt(2 * cfg.layers)
    self.gate_proj = _dense(cfg, cfg.hidden, cfg.intermediate, rngs, std, ("embed", "mlp"))
    self.up_proj = _dense(cfg, cfg.hidden, cfg.intermediate, rngs, std, ("embed", "mlp"))
    self.down_proj = _dense(cfg, cfg.intermediate, cfg.hidden, rngs, out_std,
                            ("mlp", "embed"))

  def __call__(self, x, key, block, keys=None):
    site = functools.partial(_site_keys.site, key, block, keys)
    h = _swiglu(self.gate_proj(x, key=site(self.gate_proj)), self.up_proj(x, key=site(self.up_proj)))
    return self.down_proj(constrain(h, _MLP), key=site(self.down_proj))


class Block(nnx.Module):
  def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs):
    pd = jnp.dtype(cfg.param_dtype)
    self.attn_norm = RMSNorm(cfg.hidden, cfg.norm_eps, pd)
    self.attn = Attention(cfg, rngs)
    self.mlp_norm = RMSNorm(cfg.hidden, cfg.norm_eps, pd)
    self.mlp = MLP(cfg, rngs)

  def __call__(self, x, key, block):
    """`key`: the step's key; each GEMM folds in its path and `block` (QuantPolicy.site_key)."""
    keys = self.site_keys(key, block)
    x = constrain(x + self.attn(self.attn_norm(x), key, block, keys), _EMBED)
    return constrain(x + self.mlp(self.mlp_norm(x), key, block, keys), _EMBED)

  def site_keys(self, key, block) -> dict:
    """{path: key} of this block's GEMMs, derived together (`_site_keys.block_site_keys`)."""
    a, m = self.attn, self.mlp
    return _site_keys.block_site_keys((a.q_proj, a.k_proj, a.v_proj, a.attn_scores, a.attn_values,
                                      a.o_proj, m.gate_proj, m.up_proj, m.down_proj), key, block)


class Llama(nnx.Module):
  """The model; `policy` decides each GEMM's recipe (default: everything in bf16)."""

  def __init__(self, cfg: LlamaConfig, policy: QuantPolicy | None = None, *, rngs: nnx.Rngs):
    self.cfg = cfg
    policy = policy if policy is not None else QuantPolicy()
    self.scanned = cfg.scanned(policy)
    pd = jnp.dtype(cfg.param_dtype)
    self.embed = nnx.Embed(cfg.vocab_size, cfg.hidden, param_dtype=pd,
                           embedding_init=nnx.initializers.normal(0.02), rngs=rngs)
    if self.scanned:  # parameters stacked on a leading "layers" axis
      @nnx.split_rngs(splits=cfg.layers)
      @nnx.vmap(in_axes=(0,), out_axes=0)
      def make_blocks(rngs):
        return Block(cfg, rngs)
      self.layers = make_blocks(rngs)
    else:
      self.layers = nnx.List([Block(cfg, rngs) for _ in range(cfg.layers)])
    self.norm = RMSNorm(cfg.hidden, cfg.norm_eps, pd)
    self.lm_head = _dense(cfg, cfg.hidden, cfg.vocab_size, rngs, 0.02, ("embed", "vocab"))
    if cfg.tie_embeddings:  # the head multiplies the embedding table: no parameter of its own
      self.lm_head.kernel = nnx.data(None)
    self.set_policy(policy)

  def head_kernel(self):
    """The LM head's (hidden, vocab) kernel: its own, or the embedding table's transpose."""
    if self.cfg.tie_embeddings:
      return self.embed.embedding[...].T
    return self.lm_head.kernel[...]

  def set_policy(self, policy: QuantPolicy) -> list[tuple[str, str]]:
    """Hands `policy` (completed with this model's blocks) to every quantized layer."""
    if self.scanned and policy.varies_by_block:
      raise ValueError("This model scans one block over its layers, so every block runs the same "
                       "recipes; build it with the policy that keeps blocks (keep_first / "
                       "keep_last) so that it is unrolled.")
    self.policy = policy.for_model(num_blocks=self.cfg.layers)
    return apply_policy(self, self.policy)

  def __call__(self, tokens, *, key):
    features, head_key = self.features(tokens, key=key)
    if self.cfg.tie_embeddings:
      return constrain(self.lm_head(features, key=head_key, kernel=self.head_kernel()), _VOCAB)
    return constrain(self.lm_head(features, key=head_key), _VOCAB)

  def features(self, tokens, *, key):
    """(the final norm's output (B, L, hidden), the LM head's key): everything but the head."""
    cfg = self.cfg
    if tokens.shape[-1] > cfg.max_seq_len:
      raise ValueError(f"Sequence length {tokens.shape[-1]} exceeds the model's max_seq_len "
                       f"{cfg.max_seq_len}.")
    table = self.embed.embedding[...]
    if self.policy.pure:  # "pure" low precision: the embedding table is fake-quantized too
      table = _fake_quant_table(table, self.lm_head.active_recipe(), key)
    x = constrain(jnp.take(table, tokens, axis=0).astype(jnp.dtype(cfg.compute_dtype)), _EMBED)
    # Every GEMM's key is the step's key folded with its path and block index, the derivation the
    # interception (`quant.quantize_model`) uses: a plain-Flax copy of this model gets the same bits.
    run_block = lambda blk, h, i: blk(h, key, i)
    if cfg.remat:
      run_block = nnx.remat(run_block)
    if self.scanned:
      x = nnx.scan(run_block, in_axes=(0, nnx.Carry, 0), out_axes=nnx.Carry)(
          self.layers, x, jnp.arange(cfg.layers, dtype=jnp.int32))
    else:
      for i, block in enumerate(self.layers):
        x = run_block(block, x, i)
    return self.norm(x), self.lm_head.site_key(key)


def _fake_quant_table(table, recipe, key):
  """The forward weight quantizer of `recipe` applied to the embedding rows (pure mode)."""
  op = recipe.fwd.rhs if recipe.fwd is not None else None
  if op is None or op == REUSE_FWD:
    return table
  return fake_quant_operand(table, op, axis=-1, key=key)


def abstract_model(cfg: LlamaConfig, policy: QuantPolicy | None = None):
  """(graphdef, abstract params) without allocating anything."""
  model = nnx.eval_shape(lambda: Llama(cfg, policy, rngs=nnx.Rngs(params=0)))
  graphdef, params = nnx.split(model, nnx.Param)
  return graphdef, params


def init_params(cfg: LlamaConfig, key, policy: QuantPolicy | None = None):
  """The initial parameters (their layout depends on the policy: scanned or unrolled blocks)."""
  model = Llama(cfg, policy, rngs=nnx.Rngs(params=key))
  return nnx.split(model, nnx.Param)[1]


def stacked_layers(cfg: LlamaConfig, params, policy: QuantPolicy | None = None):
  """A pytree of bools like `params`: True for the blocks' parameters of a scanned model (their
  leading axis is the layer), False elsewhere. Optimizers with per-tensor statistics take it to
  keep them per layer (`lpjax.optim.stable_spam(stacked_layers=...)`).

  Examples:
    >>> cfg = LlamaConfig(vocab_size=257, hidden=64, intermediate=160, heads=4, layers=2,
    ...                   max_seq_len=32)
    >>> flags = stacked_layers(cfg, abstract_model(cfg)[1])
    >>> sum(jax.tree.leaves(flags)), len(jax.tree.leaves(flags))  # the 9 tensors of a block
    (9, 12)
  """
  scanned = cfg.scanned(policy if policy is not None else QuantPolicy())
  first_key = lambda path: str(getattr(path[0], "key", getattr(path[0], "name", path[0])))
  return jax.tree_util.tree_map_with_path(
      lambda path, _: scanned and first_key(path) == "layers", params)


def apply_features(graphdef, cfg: LlamaConfig, params, tokens, policy: QuantPolicy | None, key):
  """(features, head): the final norm's output (B, L, hidden) and `head(features, start, size)`,
  the float32 logits of vocabulary entries start .. start + size - 1 (`QDense.columns` of the LM
  head: it needs a high-precision head, the default policy's). For losses that never hold the
  whole logits (lpjax.train's vocab-chunked cross-entropy).

  Examples:
    >>> cfg = LlamaConfig(vocab_size=40, hidden=32, intermediate=64, heads=2, layers=1,
    ...                   max_seq_len=8)
    >>> graphdef, params = abstract_model(cfg)
    >>> params = init_params(cfg, jax.random.key(0))
    >>> tokens = jnp.zeros((1, 8), jnp.int32)
    >>> h, head = apply_features(graphdef, cfg, params, tokens, None, jax.random.key(1))
    >>> full = apply(graphdef, cfg, params, tokens, None, jax.random.key(1))
    >>> h.shape, bool(jnp.allclose(head(h, 10, 5), full[..., 10:15], atol=1e-6))
    ((1, 8, 32), True)
  """
  model = nnx.merge(graphdef, params)
  if policy is not None:
    model.set_policy(policy)
  features, head_key = model.features(tokens, key=key)
  # Under FSDP the head is gathered once, here: the loss slices it inside a loop, where each
  # slice would otherwise be gathered on its own, in the forward and again in the recomputation.
  lm_head = model.lm_head
  kernel = quant.gather_weight(model.head_kernel(), lm_head.kernel_axes)

  def head(x, start, size):
    logits = lm_head.columns(x, start, size, key=head_key, kernel=kernel)
    return constrain(logits, _VOCAB).astype(jnp.float32)

  return features, head


def apply(graphdef, cfg: LlamaConfig, params, tokens, policy: QuantPolicy | None, key):
  """Logits (B, L, vocab) in float32; `policy` (None: the one the model was built with) decides
  each GEMM's recipe for this call."""
  model = nnx.merge(graphdef, params)
  if policy is not None:
    model.set_policy(policy)
  return model(tokens, key=key).astype(jnp.float32)
