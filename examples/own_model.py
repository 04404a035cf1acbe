"""Your own Flax model in lpjax's trainer, on the CPU in about a minute: factories for
`--config.model.factory` (docs/your_own_model.md, "In the trainer").

A classifier on the offline 8x8 digits images (NNX: convolutions, BatchNorm, dropout), from the
repository root:

    python train.py --config=configs/resnet_tiny_digits_mxfp4.py \\
        --config.model.factory=examples.own_model:digits_cnn --workdir=runs/own_model_digits

A causal LM on the embedded corpus (linen: attention, dropout; about a minute too):

    python train.py --config=configs/llama_tiny_mxfp4.py --config.steps=300 \\
        --config.model.factory=examples.own_model:tiny_lm --workdir=runs/own_model_lm

The trainer calls a factory with the arguments it takes among `vocab_size`, `seq_len`,
`num_classes`, `image_shape`, `config` and `rngs`; every GEMM of the model runs through the run's
recipe by interception, and <workdir>/quant_report.txt lists which were quantized and which kept.

Examples:
  >>> import jax.numpy as jnp
  >>> from flax import nnx
  >>> model = digits_cnn(num_classes=10, image_shape=(8, 8, 1), rngs=nnx.Rngs(0))
  >>> model(jnp.zeros((4, 8, 8, 1))).shape
  (4, 10)
"""

import jax.numpy as jnp
from flax import linen as nn
from flax import nnx


class DigitsCNN(nnx.Module):
  """Two 3x3 convolutions with BatchNorm, global average pooling, dropout, a linear head."""

  def __init__(self, num_classes: int, channels: int, *, width: int = 32, rngs: nnx.Rngs):
    self.conv1 = nnx.Conv(channels, width, (3, 3), rngs=rngs)
    self.bn1 = nnx.BatchNorm(width, rngs=rngs)  # statistics: the run's model state, checkpointed
    self.conv2 = nnx.Conv(width, 2 * width, (3, 3), strides=(2, 2), rngs=rngs)
    self.bn2 = nnx.BatchNorm(2 * width, rngs=rngs)
    self.dropout = nnx.Dropout(0.1, rngs=rngs)  # masks from (seed, step); off in evaluation
    self.head = nnx.Linear(2 * width, num_classes, rngs=rngs)  # kept in bf16 (its name)

  def __call__(self, x):
    x = nnx.relu(self.bn1(self.conv1(x)))
    x = nnx.relu(self.bn2(self.conv2(x)))
    return self.head(self.dropout(jnp.mean(x, axis=(1, 2))))


def digits_cnn(num_classes, image_shape, rngs):
  """The factory: `--config.model.factory=examples.own_model:digits_cnn`."""
  return DigitsCNN(num_classes, image_shape[-1], rngs=rngs)


class TinyLM(nn.Module):
  """A one-block causal transformer LM (pre-norm attention and MLP, dropout)."""

  vocab_size: int
  dim: int = 64
  heads: int = 4

  @nn.compact
  def __call__(self, tokens, train: bool = False):
    x = nn.Embed(self.vocab_size, self.dim, name="embed")(tokens)  # kept in bf16 (its name)
    h = nn.LayerNorm()(x)
    attention = nn.MultiHeadDotProductAttention(self.heads, dropout_rate=0.1,
                                                deterministic=not train)
    x = x + attention(h, mask=nn.make_causal_mask(tokens))
    h = nn.Dense(4 * self.dim, name="up")(nn.LayerNorm()(x))
    x = x + nn.Dropout(0.1)(nn.Dense(self.dim, name="down")(nn.gelu(h)), deterministic=not train)
    return nn.Dense(self.vocab_size, name="lm_head")(nn.LayerNorm()(x))


def tiny_lm(vocab_size):
  """The factory: `--config.model.factory=examples.own_model:tiny_lm`."""
  return TinyLM(vocab_size)
