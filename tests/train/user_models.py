"""Models a user brings to the trainer through `model.factory` (tests/train/test_user_model.py)."""

import sys
import os

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "quant"))
from plain_llama import PlainLlama  # noqa: E402

from lpjax.models import llama  # noqa: E402


def plain_llama(vocab_size, seq_len, config, rngs):
  """LLaMA in plain Flax layers at the config's size, initialised exactly as lpjax's LLaMA is
  from the same key (the trainer's `seed`), so the two can be compared bit for bit."""
  cfg = llama.LlamaConfig.from_size(config.model.size, vocab_size=vocab_size, max_seq_len=seq_len)
  model = PlainLlama(cfg, scan=True, rngs=nnx.Rngs(0))
  nnx.update(model, llama.init_params(cfg, rngs.default.key[...]))
  model.partition_rules = llama.PARTITION_RULES  # shard as lpjax's LLaMA is
  return model


class LinenLM(nn.Module):
  vocab_size: int

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(self.vocab_size, 32, name="embed")(tokens)
    x = x + nn.SelfAttention(num_heads=2, name="attn")(nn.LayerNorm(name="ln")(x),
                                                       mask=nn.make_causal_mask(tokens))
    x = x + nn.Dense(32, name="down")(nn.gelu(nn.Dense(64, name="up")(x)))
    return nn.Dense(self.vocab_size, name="lm_head")(x)


def linen_lm(vocab_size):
  return LinenLM(vocab_size)


class LinenCNN(nn.Module):
  num_classes: int

  @nn.compact
  def __call__(self, x, train: bool = True):
    x = nn.Conv(16, (3, 3), name="conv")(x)
    x = nn.relu(nn.BatchNorm(use_running_average=not train, name="bn")(x))
    return nn.Dense(self.num_classes, name="head")(jnp.mean(x, axis=(1, 2)))


def linen_cnn(num_classes, image_shape):
  del image_shape
  return LinenCNN(num_classes)


def not_a_model():
  return jax.numpy.zeros(3)
