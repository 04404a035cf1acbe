"""ResNet-18 / ResNet-50 (and a tiny CPU variant) in Flax NNX, every conv and the classifier
through lpjax.nn.

All convolutions are `QConv` layers and the classifier a `QDense`, governed by the `QuantPolicy`
the model is built with: unless the policy is pure, the first conv ("stem") and the classifier
("head") stay in high precision, as the published FP4 recipes keep the first and last layers
(docs/numerics.md §7); `keep_first` / `keep_last` count residual blocks ("blocks/i"). BatchNorm computes its
statistics and normalizes in float32 whatever the compute dtype; its running averages are
`nnx.BatchStat` state returned by `apply`, so a train step stays a pure function.

Architectures (`ARCHS`): "resnet18" (basic blocks 2-2-2-2), "resnet50" (bottleneck blocks
3-4-6-3, stride on the 3x3 conv as in torchvision's v1.5) and "resnet_tiny" (basic blocks 1-1-1,
widths 16/32/64). Stems: "imagenet" (7x7/2 conv + 3x3/2 max-pool) or "small" (3x3/1 conv, no
pool; CIFAR, digits).

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lpjax.quant import QuantPolicy
  >>> cfg = ResNetConfig(name="resnet_tiny", num_classes=10, in_channels=1, stem="small")
  >>> policy = QuantPolicy.from_settings("mxfp4_naive", high_precision="bf16")  # as train.py
  >>> graphdef, params, batch_stats = abstract_model(cfg, policy)   # shapes only, nothing allocated
  >>> params, batch_stats = jax.jit(init_variables, static_argnums=0)(cfg, jax.random.key(0))
  >>> forward = jax.jit(lambda p, s, x, key: apply(graphdef, cfg, p, s, x, None, key, train=True))
  >>> logits, new_stats = forward(params, batch_stats, jnp.zeros((2, 8, 8, 1)), jax.random.key(1))
  >>> logits.shape, logits.dtype
  ((2, 10), dtype('float32'))
  >>> table = dict(policy_table(cfg, policy))
  >>> table["stem"], table["blocks/0/conv1"], table["head"]
  ('bf16', 'mxfp4_naive', 'bf16')
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from lpjax.nn import QConv, QDense, apply_policy
from lpjax.quant import QuantPolicy

# name -> (block kind, blocks per stage, channels of the first stage)
ARCHS = {
    "resnet18": ("basic", (2, 2, 2, 2), 64),
    "resnet50": ("bottleneck", (3, 4, 6, 3), 64),
    "resnet_tiny": ("basic", (1, 1, 1), 16),
}
STEMS = ("imagenet", "small")
# The first conv stays high precision with the classifier ("head", in DEFAULT_HIGH_PRECISION).
STEM_PATTERN = r"(^|/)stem(/|$)"
KEEP_HIGH_PRECISION = (STEM_PATTERN,)  # what this model adds to the policy's kept layers

# Logical axes of the parameters, by path. None of these names is mapped onto a mesh axis by
# lpjax.train.step._sharding.LOGICAL_RULES, so every ResNet weight is replicated (data parallelism: the
# batch is what gets split).
PARTITION_RULES = (
    (r"(stem|conv\d|shortcut)/kernel", ("conv_window", "conv_window", "conv_in", "conv_out")),
    (r"head/kernel", ("features", "classes")),
    (r"head/bias", ("classes",)),
    (r"(bn\d?|shortcut_bn)/(scale|bias|mean|var)", ("norm",)),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResNetConfig:
  name: str = "resnet50"  # architecture, one of ARCHS
  num_classes: int = 1000  # classifier outputs
  in_channels: int = 3  # image channels (1 for grayscale)
  stem: str = "imagenet"  # "imagenet": 7x7/2 conv + 3x3/2 max-pool; "small": 3x3/1 conv, no pool
  width: int = 0  # channels of the first stage, doubled per stage (0: the architecture's)
  compute_dtype: str = "float32"  # activation dtype (BatchNorm math is float32 regardless)
  param_dtype: str = "float32"  # master weight dtype
  bn_momentum: float = 0.9  # decay of the BatchNorm running averages
  bn_epsilon: float = 1e-5  # BatchNorm variance epsilon
  zero_init_residual: bool = False  # last BN scale of each block starts at 0 (Goyal et al. 2017)

  def __post_init__(self):
    if self.name not in ARCHS:
      raise ValueError(f"Unknown ResNet {self.name!r}; valid: {', '.join(ARCHS)}.")
    if self.stem not in STEMS:
      raise ValueError(f"Unknown stem {self.stem!r}; valid: {', '.join(STEMS)}.")

  @property
  def base_width(self) -> int:
    return self.width or ARCHS[self.name][2]


class BatchNorm(nnx.BatchNorm):
  """nnx.BatchNorm whose statistics and normalization run in float32; output in x's dtype."""

  def __call__(self, x, use_running_average=None, *, mask=None):
    y = super().__call__(x.astype(jnp.float32), use_running_average, mask=mask)
    return y.astype(x.dtype)


def _conv(cfg, n_in, n_out, size, stride, rngs):
  pad = size // 2  # torchvision's symmetric padding (differs from "SAME" for stride 2, even input)
  return QConv(n_in, n_out, (size, size), strides=stride, padding=[(pad, pad)] * 2, use_bias=False,
               dtype=jnp.dtype(cfg.compute_dtype), param_dtype=jnp.dtype(cfg.param_dtype),
               kernel_init=nnx.initializers.variance_scaling(2.0, "fan_out", "normal"), rngs=rngs)


def _bn(cfg, n, rngs, zero=False):
  init = nnx.initializers.zeros_init() if zero else nnx.initializers.ones_init()
  return BatchNorm(n, momentum=cfg.bn_momentum, epsilon=cfg.bn_epsilon, dtype=jnp.float32,
                   param_dtype=jnp.dtype(cfg.param_dtype), use_fast_variance=False,
                   scale_init=init, rngs=rngs)


class Block(nnx.Module):
  """A residual block: basic (3x3, 3x3) or bottleneck (1x1, 3x3 with the stride, 1x1 x4)."""

  def __init__(self, cfg: ResNetConfig, kind: str, n_in: int, width: int, stride: int, rngs):
    zero = cfg.zero_init_residual
    if kind == "basic":
      shapes = [(n_in, width, 3, stride), (width, width, 3, 1)]
    else:
      shapes = [(n_in, width, 1, 1), (width, width, 3, stride), (width, 4 * width, 1, 1)]
    self.n_out = shapes[-1][1]
    for i, (a, b, k, s) in enumerate(shapes, start=1):
      setattr(self, f"conv{i}", _conv(cfg, a, b, k, s, rngs))
      setattr(self, f"bn{i}", _bn(cfg, b, rngs, zero=zero and i == len(shapes)))
    self.depth = len(shapes)
    if stride != 1 or n_in != self.n_out:
      self.shortcut = _conv(cfg, n_in, self.n_out, 1, stride, rngs)
      self.shortcut_bn = _bn(cfg, self.n_out, rngs)
    else:
      self.shortcut = self.shortcut_bn = nnx.data(None)

  def __call__(self, x, key, train: bool):
    keys = jax.random.split(key, self.depth + 1) if key is not None else [None] * (self.depth + 1)
    h = x
    for i in range(1, self.depth + 1):
      h = getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(h, key=keys[i - 1]),
                                  use_running_average=not train)
      if i < self.depth:
        h = jax.nn.relu(h)
    if self.shortcut is not None:
      x = self.shortcut_bn(self.shortcut(x, key=keys[-1]), use_running_average=not train)
    return jax.nn.relu(h + x)


class ResNet(nnx.Module):
  """The model; `policy` decides each GEMM's recipe (default: everything in bf16)."""

  def __init__(self, cfg: ResNetConfig, policy: QuantPolicy | None = None, *, rngs: nnx.Rngs):
    self.cfg = cfg
    kind, stages, _ = ARCHS[cfg.name]
    width = cfg.base_width
    size, stride = (7, 2) if cfg.stem == "imagenet" else (3, 1)
    self.stem = _conv(cfg, cfg.in_channels, width, size, stride, rngs)
    self.stem_bn = _bn(cfg, width, rngs)
    blocks, n_in = [], width
    for s, count in enumerate(stages):
      for b in range(count):
        blocks.append(Block(cfg, kind, n_in, width * 2**s, 2 if (s > 0 and b == 0) else 1, rngs))
        n_in = blocks[-1].n_out
    self.blocks = nnx.List(blocks)
    self.head = QDense(n_in, cfg.num_classes, dtype=jnp.dtype(cfg.compute_dtype),
                       param_dtype=jnp.dtype(cfg.param_dtype), rngs=rngs)
    self.set_policy(policy if policy is not None else QuantPolicy())

  def set_policy(self, policy: QuantPolicy) -> list[tuple[str, str]]:
    """Hands `policy` (completed with this model's blocks and stem) to every quantized layer."""
    self.policy = policy.for_model(num_blocks=len(self.blocks),
                                   keep_high_precision=KEEP_HIGH_PRECISION)
    return apply_policy(self, self.policy)

  def __call__(self, images, *, key, train: bool):
    x = images.astype(jnp.dtype(self.cfg.compute_dtype))
    keys = (jax.random.split(key, len(self.blocks) + 2) if key is not None
            else [None] * (len(self.blocks) + 2))
    x = jax.nn.relu(self.stem_bn(self.stem(x, key=keys[0]), use_running_average=not train))
    if self.cfg.stem == "imagenet":
      x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    for block, k in zip(self.blocks, keys[1:-1]):
      x = block(x, k, train)
    features = jnp.mean(x.astype(jnp.float32), axis=(1, 2)).astype(x.dtype)  # global average pool
    return self.head(features, key=keys[-1])


def abstract_model(cfg: ResNetConfig, policy: QuantPolicy | None = None):
  """(graphdef, abstract params, abstract batch_stats) without allocating anything."""
  model = nnx.eval_shape(lambda: ResNet(cfg, policy, rngs=nnx.Rngs(params=0)))
  return nnx.split(model, nnx.Param, nnx.BatchStat)


def init_variables(cfg: ResNetConfig, key):
  """(params, batch_stats): nnx.Param and nnx.BatchStat states of a freshly initialized model."""
  model = ResNet(cfg, rngs=nnx.Rngs(params=key))
  _, params, batch_stats = nnx.split(model, nnx.Param, nnx.BatchStat)
  return params, batch_stats


def apply(graphdef, cfg: ResNetConfig, params, batch_stats, images, policy: QuantPolicy | None,
          key, *, train: bool):
  """(logits (B, num_classes) float32, new batch_stats) of images (B, H, W, C).

  `policy` (None: the one the model was built with) decides each GEMM's recipe for this call, as
  in `lpjax.models.llama.apply`. In train mode BatchNorm normalizes with the batch's statistics
  and the returned batch_stats carry the updated running averages; in eval mode it uses the
  running averages and returns batch_stats unchanged. `key` drives stochastic rounding (may be
  None for deterministic recipes).
  """
  del cfg  # the graphdef carries the config; kept for symmetry with llama.apply
  model = nnx.merge(graphdef, params, batch_stats, copy=True)  # fresh Variables in this trace
  if policy is not None:
    model.set_policy(policy)
  logits = model(images, key=key, train=train)
  if not train:
    return logits.astype(jnp.float32), batch_stats
  return logits.astype(jnp.float32), nnx.state(model, nnx.BatchStat)


def policy_table(cfg: ResNetConfig, policy: QuantPolicy | None = None) -> list[tuple[str, str]]:
  """[(layer path, recipe name)] of every quantized layer."""
  model = nnx.eval_shape(lambda: ResNet(cfg, rngs=nnx.Rngs(params=0)))
  return model.set_policy(policy if policy is not None else QuantPolicy())
