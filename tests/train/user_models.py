"""Models a user brings to the trainer through `model.factory` (tests/train/model/test_user_model.py)."""

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


# --- dropout and BatchNorm (issue 48) -------------------------------------------------------------


class LinenDropoutLM(nn.Module):
  """An LM with nn.Dropout switched by a `deterministic` argument of __call__."""
  vocab_size: int

  @nn.compact
  def __call__(self, tokens, deterministic: bool = False):
    x = nn.Embed(self.vocab_size, 32, name="embed")(tokens)
    x = nn.Dropout(0.3)(nn.gelu(nn.Dense(64, name="up")(x)), deterministic=deterministic)
    return nn.Dense(self.vocab_size, name="lm_head")(x)


def linen_dropout_lm(vocab_size):
  return LinenDropoutLM(vocab_size)


class LinenDropoutField(nn.Module):
  """A classifier whose dropout switch is a module field, not a __call__ argument."""
  num_classes: int
  deterministic: bool = False

  @nn.compact
  def __call__(self, x):
    x = nn.Dropout(0.3, deterministic=self.deterministic)(nn.relu(nn.Dense(32)(x.reshape(
        x.shape[0], -1))))
    return nn.Dense(self.num_classes)(x)


def linen_dropout_field(num_classes):
  return LinenDropoutField(num_classes)


class LinenDropoutNoSwitch(nn.Module):
  """Dropout that no argument turns off: evaluation would draw masks."""
  num_classes: int

  @nn.compact
  def __call__(self, x):
    x = nn.Dropout(0.3, deterministic=False)(nn.Dense(32)(x.reshape(x.shape[0], -1)))
    return nn.Dense(self.num_classes)(x)


def linen_dropout_no_switch(num_classes):
  return LinenDropoutNoSwitch(num_classes)


class NNXBatchNormCNN(nnx.Module):
  """nnx.Conv + nnx.BatchNorm + nnx.Dropout + nnx.Linear: BatchNorm statistics are state, the
  dropout stream is drawn per step."""

  def __init__(self, num_classes, image_shape, rngs):
    self.conv = nnx.Conv(image_shape[-1], 16, (3, 3), rngs=rngs)
    self.bn = nnx.BatchNorm(16, rngs=rngs)
    self.drop = nnx.Dropout(0.2, rngs=rngs)
    self.head = nnx.Linear(16, num_classes, rngs=rngs)

  def __call__(self, x):
    x = nnx.relu(self.bn(self.conv(x)))
    return self.head(self.drop(jnp.mean(x, axis=(1, 2))))


def nnx_batchnorm_cnn(num_classes, image_shape, rngs):
  return NNXBatchNormCNN(num_classes, image_shape, rngs)


class NNXDropoutLM(nnx.Module):
  def __init__(self, vocab_size, rngs):
    self.embed = nnx.Embed(vocab_size, 32, rngs=rngs)
    self.up = nnx.Linear(32, 64, rngs=rngs)
    self.drop = nnx.Dropout(0.3, rngs=rngs)
    self.lm_head = nnx.Linear(64, vocab_size, rngs=rngs)

  def __call__(self, tokens):
    return self.lm_head(self.drop(nnx.gelu(self.up(self.embed(tokens)))))


def nnx_dropout_lm(vocab_size, rngs):
  return NNXDropoutLM(vocab_size, rngs)


# --- bad factories (issue 48) ---------------------------------------------------------------------


def wrong_arguments(vocab, hidden):
  return LinenLM(vocab)


class LastTokenLM(nn.Module):
  """Returns (B, vocab): the logits of the last token only."""
  vocab_size: int

  @nn.compact
  def __call__(self, tokens):
    return nn.Dense(self.vocab_size)(nn.Embed(self.vocab_size, 16)(tokens)[:, -1])


def last_token_lm(vocab_size):
  return LastTokenLM(vocab_size)


def wide_lm(vocab_size):
  return LinenLM(vocab_size + 7)


def wrong_classes(num_classes):
  return LinenCNN(num_classes + 2)


class TupleClassifier(nn.Module):
  num_classes: int

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(16)(x.reshape(x.shape[0], -1))
    return nn.Dense(self.num_classes)(h), h


def tuple_classifier(num_classes):
  return TupleClassifier(num_classes)


def padded_lm():
  """A vocabulary padded to 264 columns written into the model (the byte data has 257)."""
  return LinenLM(264)


class LinenBatchNormNoSwitch(nn.Module):
  """BatchNorm in batch-statistics mode always: evaluation would update the statistics."""
  num_classes: int

  @nn.compact
  def __call__(self, x):
    x = nn.BatchNorm(use_running_average=False)(nn.Conv(8, (3, 3))(x))
    return nn.Dense(self.num_classes)(jnp.mean(x, axis=(1, 2)))


def linen_batchnorm_no_switch(num_classes):
  return LinenBatchNormNoSwitch(num_classes)


class NNXTrainArgument(nnx.Module):
  """An NNX classifier whose __call__ takes `train` (no default) and passes it to dropout."""

  def __init__(self, num_classes, image_shape, rngs):
    size = image_shape[0] * image_shape[1] * image_shape[2]
    self.up = nnx.Linear(size, 32, rngs=rngs)
    self.drop = nnx.Dropout(0.3, rngs=rngs)
    self.head = nnx.Linear(32, num_classes, rngs=rngs)

  def __call__(self, x, train):
    h = nnx.relu(self.up(x.reshape(x.shape[0], -1)))
    return self.head(self.drop(h, deterministic=not train))


def nnx_train_argument(num_classes, image_shape, rngs):
  return NNXTrainArgument(num_classes, image_shape, rngs)


# --- dropout inside a scan over blocks (issue 48) -------------------------------------------------


class _DropoutBlock(nnx.Module):
  def __init__(self, rngs):
    self.lin = nnx.Linear(32, 32, rngs=rngs)
    self.drop = nnx.Dropout(0.2, rngs=rngs)

  def __call__(self, x):
    return x + self.drop(nnx.gelu(self.lin(x)))


class NNXScanDropoutLM(nnx.Module):
  """Three blocks stacked by nnx.vmap and applied by nnx.scan; each holds a dropout stream (its
  keys stacked too)."""

  def __init__(self, vocab_size, rngs, blocks=3):
    self.embed = nnx.Embed(vocab_size, 32, rngs=rngs)

    @nnx.split_rngs(splits=blocks)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create(rngs):
      return _DropoutBlock(rngs)

    self.blocks = create(rngs)
    self.lm_head = nnx.Linear(32, vocab_size, rngs=rngs)

  def __call__(self, tokens):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def body(x, block):
      return block(x)

    return self.lm_head(body(self.embed(tokens), self.blocks))


def nnx_scan_dropout_lm(vocab_size, rngs):
  return NNXScanDropoutLM(vocab_size, rngs)


class _LinenDropoutBlock(nn.Module):
  train: bool

  @nn.compact
  def __call__(self, x, _):
    return x + nn.Dropout(0.2, deterministic=not self.train)(nn.gelu(nn.Dense(32)(x))), None


class LinenScanDropoutLM(nn.Module):
  """nn.scan over three blocks with split dropout streams; the switch is named `training`."""
  vocab_size: int

  @nn.compact
  def __call__(self, tokens, training: bool = False):
    blocks = nn.scan(_LinenDropoutBlock, variable_axes={"params": 0},
                     split_rngs={"params": True, "dropout": True}, length=3)
    x, _ = blocks(training, name="blocks")(nn.Embed(self.vocab_size, 32)(tokens), None)
    return nn.Dense(self.vocab_size, name="lm_head")(x)


def linen_scan_dropout_lm(vocab_size):
  return LinenScanDropoutLM(vocab_size)
