"""The DDPM U-Net (Ho et al. 2020) in Flax NNX, every conv and matmul through lpjax.nn.

Residual blocks (GroupNorm in fp32, SiLU, 3x3 conv, a projection of the time embedding added,
dropout, zero-initialised second conv), single- or multi-head self-attention at the chosen
resolutions and in the middle, a sinusoidal time embedding followed by a two-layer MLP, strided-conv
downsampling, nearest-neighbour + conv upsampling, skip connections from every encoder stage, and an
epsilon-prediction output conv. The convolutions are `QConv`s, the 1x1 projections `QDense`s and
the two attention products `QEinsum`s, all governed by the `QuantPolicy` the model is built with:
unless it is pure, as the first and last layers of published FP4 recipes, the input conv
(`conv_in`), the output conv (`conv_out`) and the time embedding MLP (`time_embed/...`) stay in
high precision, and so do the attention products (`attn_scores`, `attn_values`; docs/numerics.md §7).
`keep_first` / `keep_last` count levels in forward order: the encoder levels, the middle, then
the decoder levels.

`unet_cifar10()` is the DDPM CIFAR-10 model (35.7M parameters, Ho et al. 2020, Appendix B);
`unet_tiny()` a 164k-parameter variant for 8x8 or 16x16 digits on a CPU.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> cfg = unet_tiny(image_size=8, channels=1)
  >>> graphdef, params = abstract_model(cfg)
  >>> params = init_params(cfg, jax.random.key(0))
  >>> eps = apply(graphdef, cfg, params, jnp.zeros((2, 8, 8, 1)), jnp.array([0, 999]), None,
  ...             jax.random.key(1))
  >>> eps.shape, eps.dtype
  ((2, 8, 8, 1), dtype('float32'))
  >>> round(num_params(abstract_model(unet_cifar10())[1]) / 1e6, 1)
  35.7
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from lpjax.models._batched_init import batched_init, fan_avg_uniform
from lpjax.nn import QConv, QDense, QEinsum, apply_policy
from lpjax.quant import QuantPolicy

# What this model adds to the policy's kept layers: the input and output convs (the "first and
# last layer" of FP4 recipes); the time-embedding MLP ("time_embed/...") is already covered by
# the default keeps' "embed".
KEEP_HIGH_PRECISION = (r"(^|/)(conv_in|conv_out)(/|$)",)

# Logical axes of the parameters, by path (lpjax.train.step._sharding maps them onto the mesh). Convs
# (and everything not listed) stay replicated: the largest kernel, 3x3x512x256, is 4.7 MB.
PARTITION_RULES = (
    (r"time_embed/dense0/kernel", ("embed", "mlp")),
    (r"time_embed/dense1/kernel", ("mlp", "embed")),
    (r"(^|/)(q|k|v)/kernel", ("embed", "heads")),
    (r"(^|/)proj_out/kernel", ("heads", "embed")),
    (r"norm", ("norm",)),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class UNetConfig:
  image_size: int  # height = width of the images (pixels)
  channels: int = 3  # image channels (input x_t and predicted epsilon)
  base_width: int = 128  # channels of the first level; the time embedding has 4x this
  channel_mults: tuple[int, ...] = (1, 2, 2, 2)  # width multiplier per level (2x downsample between)
  num_res_blocks: int = 2  # residual blocks per encoder level (the decoder has one more)
  attention_resolutions: tuple[int, ...] = (16,)  # feature-map sizes with self-attention (mid: always)
  heads: int = 1  # attention heads (DDPM: 1)
  dropout: float = 0.1  # dropout rate in the residual blocks, active with train=True
  norm_groups: int = 32  # GroupNorm groups (must divide every level's width)
  compute_dtype: str = "float32"  # activation dtype (GroupNorm and softmax always run in fp32)
  param_dtype: str = "float32"  # master weight dtype

  def __post_init__(self):
    object.__setattr__(self, "channel_mults", tuple(self.channel_mults))
    object.__setattr__(self, "attention_resolutions", tuple(self.attention_resolutions))
    levels = len(self.channel_mults)
    if not levels or min(self.channel_mults) < 1:
      raise ValueError(f"channel_mults must be a non-empty tuple of positive ints, got {self.channel_mults}.")
    if self.image_size % 2 ** (levels - 1):
      raise ValueError(f"image_size {self.image_size} must be divisible by 2^(levels-1) = "
                       f"{2 ** (levels - 1)} for {levels} levels; pad the images or drop a level.")
    widths = [self.base_width * m for m in self.channel_mults]
    bad = [w for w in widths if w % self.norm_groups]
    if bad:
      raise ValueError(f"norm_groups {self.norm_groups} must divide every level width {widths}.")
    resolutions = self.resolutions
    for r in self.attention_resolutions:
      if r not in resolutions:
        raise ValueError(f"attention resolution {r} is none of the level resolutions {resolutions}.")
    attn_widths = [w for w, r in zip(widths, resolutions) if r in self.attention_resolutions]
    if any(w % self.heads for w in attn_widths + [widths[-1]]):
      raise ValueError(f"heads {self.heads} must divide the widths of the attention levels "
                       f"{attn_widths + [widths[-1]]}.")
    if not 0.0 <= self.dropout < 1.0:
      raise ValueError(f"dropout must be in [0, 1), got {self.dropout}.")

  @property
  def resolutions(self) -> tuple[int, ...]:
    """Feature-map size of each level."""
    return tuple(self.image_size // 2**i for i in range(len(self.channel_mults)))

  @property
  def time_dim(self) -> int:
    return 4 * self.base_width


def unet_cifar10(**overrides) -> UNetConfig:
  """The DDPM CIFAR-10 U-Net (Ho et al. 2020, App. B): 32x32x3, ch 128, mults (1,2,2,2), 2 res
  blocks, attention at 16x16, dropout 0.1; 35.7M parameters."""
  return UNetConfig(**{"image_size": 32, "channels": 3, **overrides})


def unet_tiny(image_size: int = 8, channels: int = 1, **overrides) -> UNetConfig:
  """A 164k-parameter U-Net for 8x8 or 16x16 digits on a CPU: width 16, mults (1, 2), one res
  block per level, attention only in the middle (the lowest resolution), no dropout."""
  fields = dict(image_size=image_size, channels=channels, base_width=16, channel_mults=(1, 2),
                num_res_blocks=1, attention_resolutions=(), heads=1, dropout=0.0, norm_groups=8)
  return UNetConfig(**{**fields, **overrides})


PRESETS = {"tiny": unet_tiny, "cifar10": unet_cifar10}


def timestep_embedding(t, dim: int):
  """Sinusoidal embedding (b, dim) of timesteps t (b,), as in DDPM (sin half, then cos half)."""
  half = dim // 2
  freqs = jnp.exp(-math.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / max(half - 1, 1))
  args = jnp.asarray(t, jnp.float32)[:, None] * freqs[None, :]
  emb = jnp.concatenate([jnp.sin(args), jnp.cos(args)], axis=-1)
  return jnp.pad(emb, ((0, 0), (0, dim % 2)))


class GroupNorm(nnx.Module):
  """GroupNorm over (H, W, C / groups), computed in float32 whatever the activation dtype."""

  def __init__(self, channels: int, groups: int, param_dtype, eps: float = 1e-6):
    self.groups, self.eps = groups, eps
    self.scale = nnx.Param(jnp.ones((channels,), param_dtype))
    self.bias = nnx.Param(jnp.zeros((channels,), param_dtype))

  def __call__(self, x):
    b, h, w, c = x.shape
    xf = x.astype(jnp.float32).reshape(b, h, w, self.groups, c // self.groups)
    mean = xf.mean(axis=(1, 2, 4), keepdims=True)
    var = jnp.square(xf - mean).mean(axis=(1, 2, 4), keepdims=True)
    y = ((xf - mean) * jax.lax.rsqrt(var + self.eps)).reshape(b, h, w, c)
    y = y * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
    return y.astype(x.dtype)


def _init(zero: bool):
  # DDPM: variance_scaling(1, fan_avg, uniform); the layers closing a residual branch start at 0.
  if zero:
    return nnx.initializers.zeros_init()
  return fan_avg_uniform(1.0)  # variance_scaling(1, fan_avg, uniform), batched by init_params


def _conv(cfg, n_in, n_out, rngs, *, kernel=3, strides=1, zero=False):
  return QConv(n_in, n_out, (kernel, kernel), strides=(strides, strides), padding="SAME",
               dtype=jnp.dtype(cfg.compute_dtype), param_dtype=jnp.dtype(cfg.param_dtype),
               kernel_init=_init(zero), rngs=rngs)


def _dense(cfg, n_in, n_out, rngs, *, zero=False):
  return QDense(n_in, n_out, dtype=jnp.dtype(cfg.compute_dtype), param_dtype=jnp.dtype(cfg.param_dtype),
                kernel_init=_init(zero), rngs=rngs)


def _norm(cfg, channels):
  return GroupNorm(channels, cfg.norm_groups, jnp.dtype(cfg.param_dtype))


class TimeEmbedding(nnx.Module):
  """Sinusoidal embedding of t (width base_width) -> Dense -> SiLU -> Dense (width 4 base_width)."""

  def __init__(self, cfg: UNetConfig, rngs: nnx.Rngs):
    self.dim = cfg.base_width
    self.dense0 = _dense(cfg, cfg.base_width, cfg.time_dim, rngs)
    self.dense1 = _dense(cfg, cfg.time_dim, cfg.time_dim, rngs)

  def __call__(self, t, key):
    k0, k1 = jax.random.split(key)
    h = timestep_embedding(t, self.dim).astype(self.dense0.dtype)
    return self.dense1(jax.nn.silu(self.dense0(h, key=k0)), key=k1)


class ResBlock(nnx.Module):
  def __init__(self, cfg: UNetConfig, n_in: int, n_out: int, rngs: nnx.Rngs):
    self.dropout = cfg.dropout
    self.norm1 = _norm(cfg, n_in)
    self.conv1 = _conv(cfg, n_in, n_out, rngs)
    self.time_proj = _dense(cfg, cfg.time_dim, n_out, rngs)
    self.norm2 = _norm(cfg, n_out)
    self.conv2 = _conv(cfg, n_out, n_out, rngs, zero=True)
    # DDPM's "nin" shortcut: a 1x1 projection when the width changes.
    self.skip = _dense(cfg, n_in, n_out, rngs) if n_in != n_out else nnx.data(None)

  def __call__(self, x, temb, key, train: bool):
    k = jax.random.split(key, 5)
    h = self.conv1(jax.nn.silu(self.norm1(x)), key=k[0])
    h = h + self.time_proj(jax.nn.silu(temb), key=k[1])[:, None, None, :].astype(h.dtype)
    h = jax.nn.silu(self.norm2(h))
    if train and self.dropout > 0:
      keep = jax.random.bernoulli(k[2], 1.0 - self.dropout, h.shape)
      h = jnp.where(keep, h / (1.0 - self.dropout), 0).astype(h.dtype)
    h = self.conv2(h, key=k[3])
    if self.skip is not None:
      x = self.skip(x, key=k[4])
    return x + h


class Attention(nnx.Module):
  """Self-attention over the H x W positions (DDPM's AttnBlock), with a residual connection."""

  def __init__(self, cfg: UNetConfig, channels: int, rngs: nnx.Rngs):
    self.heads, self.head_dim = cfg.heads, channels // cfg.heads
    self.norm = _norm(cfg, channels)
    self.q = _dense(cfg, channels, channels, rngs)
    self.k = _dense(cfg, channels, channels, rngs)
    self.v = _dense(cfg, channels, channels, rngs)
    self.attn_scores = QEinsum("bqhd,bkhd->bhqk", rngs=rngs)
    self.attn_values = QEinsum("bhqk,bkhd->bqhd", rngs=rngs)
    self.proj_out = _dense(cfg, channels, channels, rngs, zero=True)

  def __call__(self, x, key):
    b, hh, ww, c = x.shape
    k = jax.random.split(key, 6)
    h = self.norm(x).reshape(b, hh * ww, c)
    split = lambda y: y.reshape(b, hh * ww, self.heads, self.head_dim)
    q, kk, v = split(self.q(h, key=k[0])), split(self.k(h, key=k[1])), split(self.v(h, key=k[2]))
    scores = self.attn_scores(q, kk, key=k[3]).astype(jnp.float32) / math.sqrt(self.head_dim)
    probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
    out = self.attn_values(probs, v, key=k[4]).reshape(b, hh * ww, c)
    return x + self.proj_out(out, key=k[5]).reshape(b, hh, ww, c).astype(x.dtype)


class Level(nnx.Module):
  """One resolution: res blocks (each followed by attention at attention resolutions), then an
  optional 2x resample (a stride-2 conv going down, nearest-neighbour + conv going up)."""

  def __init__(self, cfg: UNetConfig, in_widths, width, attention, resample, rngs):
    self.res = nnx.List([ResBlock(cfg, n, width, rngs) for n in in_widths])
    self.attn = nnx.List([Attention(cfg, width, rngs) for _ in in_widths] if attention else [])
    self.resample_kind = resample
    strides = 2 if resample == "down" else 1
    self.resample = _conv(cfg, width, width, rngs, strides=strides) if resample else nnx.data(None)

  def __call__(self, x, temb, key, train, skips=None):
    """Encoder (skips None): returns (x, outputs to skip); decoder: concatenates popped skips."""
    keys = jax.random.split(key, 2 * len(self.res) + 1)
    outs = []
    for i, block in enumerate(self.res):
      if skips is not None:
        x = jnp.concatenate([x, skips.pop()], axis=-1)
      x = block(x, temb, keys[2 * i], train)
      if len(self.attn):
        x = self.attn[i](x, keys[2 * i + 1])
      outs.append(x)
    if self.resample_kind == "up":
      x = jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)
    if self.resample is not None:
      x = self.resample(x, key=keys[-1])
      outs.append(x)
    return x, outs


class UNet(nnx.Module):
  """The model; `policy` decides each GEMM's recipe (default: everything in bf16)."""

  def __init__(self, cfg: UNetConfig, policy: QuantPolicy | None = None, *, rngs: nnx.Rngs):
    self.cfg = cfg
    widths = [cfg.base_width * m for m in cfg.channel_mults]
    levels = len(widths)
    self.time_embed = TimeEmbedding(cfg, rngs)
    self.conv_in = _conv(cfg, cfg.channels, cfg.base_width, rngs)
    skip_widths, down, width = [cfg.base_width], [], cfg.base_width
    for i, w in enumerate(widths):
      attention = cfg.resolutions[i] in cfg.attention_resolutions
      ins = [width] + [w] * (cfg.num_res_blocks - 1)
      down.append(Level(cfg, ins, w, attention, "down" if i < levels - 1 else None, rngs))
      width = w
      skip_widths += [w] * cfg.num_res_blocks + ([w] if i < levels - 1 else [])
    self.down = nnx.List(down)
    self.mid_res1 = ResBlock(cfg, width, width, rngs)
    self.mid_attn = Attention(cfg, width, rngs)
    self.mid_res2 = ResBlock(cfg, width, width, rngs)
    up = []
    for i in reversed(range(levels)):
      w = widths[i]
      ins = []
      for _ in range(cfg.num_res_blocks + 1):
        ins.append(width + skip_widths.pop())
        width = w
      attention = cfg.resolutions[i] in cfg.attention_resolutions
      up.append(Level(cfg, ins, w, attention, "up" if i > 0 else None, rngs))
    self.up = nnx.List(up)
    self.norm_out = _norm(cfg, width)
    self.conv_out = _conv(cfg, width, cfg.channels, rngs, zero=True)
    self.set_policy(policy if policy is not None else QuantPolicy())

  def set_policy(self, policy: QuantPolicy) -> list[tuple[str, str]]:
    """Hands `policy` (completed with this model's levels and kept convs) to every quantized
    layer; the blocks, in forward order, are the encoder levels, the middle and the decoder."""
    levels = len(self.down)
    blocks = ([rf"^down/{i}/" for i in range(levels)] + [r"^mid_"]
              + [rf"^up/{i}/" for i in range(levels)])
    self.policy = policy.for_model(keep_high_precision=KEEP_HIGH_PRECISION, block_paths=blocks)
    return apply_policy(self, self.policy)

  def __call__(self, x, t, *, key, train: bool = False):
    cfg = self.cfg
    want = (cfg.image_size, cfg.image_size, cfg.channels)
    if x.ndim != 4 or tuple(x.shape[1:]) != want:
      raise ValueError(f"x_t must have shape (batch, {want[0]}, {want[1]}, {want[2]}) (NHWC) for "
                       f"this UNetConfig, got {tuple(x.shape)}.")
    t = jnp.broadcast_to(jnp.asarray(t), (x.shape[0],))
    keys = jax.random.split(key, len(self.down) + len(self.up) + 6)
    temb = self.time_embed(t, keys[0])
    h = self.conv_in(x.astype(jnp.dtype(cfg.compute_dtype)), key=keys[1])
    skips = [h]
    for i, level in enumerate(self.down):
      h, outs = level(h, temb, keys[6 + i], train)
      skips += outs
    h = self.mid_res1(h, temb, keys[2], train)
    h = self.mid_attn(h, keys[3])
    h = self.mid_res2(h, temb, keys[4], train)
    for i, level in enumerate(self.up):
      h, _ = level(h, temb, keys[6 + len(self.down) + i], train, skips=skips)
    return self.conv_out(jax.nn.silu(self.norm_out(h)), key=keys[5])


def num_params(params) -> int:
  """Number of parameter elements of a params tree (abstract or concrete)."""
  return sum(math.prod(x.shape) for x in jax.tree.leaves(params))


def abstract_model(cfg: UNetConfig, policy: QuantPolicy | None = None):
  """(graphdef, abstract params) without allocating anything."""
  model = nnx.eval_shape(lambda: UNet(cfg, policy, rngs=nnx.Rngs(params=0)))
  return nnx.split(model, nnx.Param)


def init_params(cfg: UNetConfig, key):
  """The initial parameters: variance_scaling(1, fan_avg, uniform) kernels drawn one vmapped
  uniform per kernel shape (the same values as one draw per kernel, a much smaller jitted init)."""
  with batched_init(key) as (rngs, fill):
    model = fill(UNet(cfg, rngs=rngs))
  return nnx.split(model, nnx.Param)[1]


def apply(graphdef, cfg: UNetConfig, params, x_t, t, policy: QuantPolicy | None, key, *,
          train: bool = False):
  """Predicted noise epsilon (b, H, W, C) in float32 for noisy images x_t at timesteps t (b,).

  `policy` (None: the one the model was built with) decides each GEMM's recipe for this call;
  `key` feeds the stochastic rounding / Hadamard signs of every GEMM and, with `train=True`,
  dropout.
  """
  if key is None:
    raise ValueError("apply needs a key (stochastic rounding, Hadamard signs and dropout draw from "
                     "it): pass jax.random.key(step) or any fixed key for evaluation.")
  model = nnx.merge(graphdef, params)
  if policy is not None:
    model.set_policy(policy)
  return model(x_t, t, key=key, train=train).astype(jnp.float32)
