"""Language modelling with LLaMA: next-token cross-entropy, loss and perplexity at eval.

Examples:
  >>> from lpjax.train.config import llama_config
  >>> c = llama_config("tiny")
  >>> c.batch_size, c.seq_len, c.data.prefetch = 2, 16, 0
  >>> task = LanguageModelTask(c)
  >>> step, batch = next(task.batches(7, 1, 0, 1))
  >>> step, batch["inputs"].shape, task.units_in(batch)
  (7, (2, 16), 32)
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import math
import os
import shutil
import warnings

import jax
import jax.numpy as jnp
import optax

from lpjax import data as lpdata
from lpjax.models import hf_llama, llama
from lpjax.models._hf_tokenizer import TOKENIZER_FILES
from lpjax.train import config as cfg_lib
from lpjax.train.tasks.base import Task, own_model_report
from lpjax.train.model._user_model import Expected, user_model


def cross_entropy(logits, targets):
  """(mean token loss, token count) of float32 softmax cross-entropy."""
  logits = logits.astype(jnp.float32)
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  return jnp.mean(loss), loss.size


def chunked_cross_entropy(features, head, vocab: int, targets, chunks: int):
  """(mean token loss, token count) of float32 softmax cross-entropy over the logits
  `head(features, start, size)` computed `chunks` vocabulary slices at a time: an online
  log-sum-exp over the slices, each recomputed in the backward pass (`jax.checkpoint`), so
  neither the forward nor the backward holds more than one slice of logits (`cross_entropy` of
  the whole logits holds them and their gradient, a (tokens, vocab) float32 array each). Equal to
  `cross_entropy` up to float32 rounding (the sums run in another order).

  Examples:
    >>> w = jax.random.normal(jax.random.key(0), (16, 50))
    >>> h = jax.random.normal(jax.random.key(1), (2, 3, 16))
    >>> t = jnp.array([[0, 7, 49], [12, 25, 33]])
    >>> head = lambda x, start, size: x @ jax.lax.dynamic_slice_in_dim(w, start, size, axis=1)
    >>> whole = cross_entropy(h @ w, t)[0]
    >>> bool(jnp.allclose(chunked_cross_entropy(h, head, 50, t, 4)[0], whole, rtol=1e-6))
    True
  """
  if not 1 <= chunks <= vocab:
    raise ValueError(f"chunks must be in [1, vocab={vocab}], got {chunks}.")
  size = -(-vocab // chunks)  # the last slice overlaps the one before when chunks does not divide

  @jax.checkpoint  # keep only (carry, chunk index): the backward recomputes the slice's logits
  def body(carry, c):
    top, sum_exp, target_logit = carry
    start = jnp.minimum(c * size, vocab - size)
    logits = head(features, start, size)
    column = start + jnp.arange(size)
    fresh = column >= c * size  # columns an earlier slice has not counted
    logits = jnp.where(fresh, logits, -jnp.inf)
    # a running maximum keeps exp() in range; it is a constant to the gradient (log-sum-exp is
    # the same function of the logits for any constant shift)
    new_top = jax.lax.stop_gradient(jnp.maximum(top, jnp.max(logits, axis=-1)))
    sum_exp = sum_exp * jnp.exp(top - new_top) + jnp.sum(jnp.exp(logits - new_top[..., None]),
                                                         axis=-1)
    hit = fresh & (column == targets[..., None])
    target_logit = target_logit + jnp.sum(jnp.where(hit, logits, 0.0), axis=-1)
    return (new_top, sum_exp, target_logit), None

  init = (jnp.full(targets.shape, -jnp.inf, jnp.float32), jnp.zeros(targets.shape, jnp.float32),
          jnp.zeros(targets.shape, jnp.float32))
  (top, sum_exp, target_logit), _ = jax.lax.scan(body, init, jnp.arange(chunks))
  loss = top + jnp.log(sum_exp) - target_logit
  return jnp.mean(loss), loss.size


HF_PREFIX = "hf:"
SOURCE_COPY = "init_from"  # <workdir>/init_from: the init_from checkpoint's config and tokenizer


def _hf_path(config) -> str | None:
  spec = config.model.get("init_from", "")
  if not spec:
    return None
  if not spec.startswith(HF_PREFIX):
    raise cfg_lib.ConfigError(f"model.init_from={spec!r}: give hf:PATH, the directory of a "
                              "Hugging Face LLaMA checkpoint (config.json + *.safetensors).")
  return spec[len(HF_PREFIX):]


def _source_copy(workdir: str | None) -> str | None:
  """<workdir>/init_from when it holds the copy of the init_from checkpoint's config.json."""
  if not workdir:
    return None
  copy = os.path.join(workdir, SOURCE_COPY)
  return copy if os.path.isfile(os.path.join(copy, hf_llama.CONFIG)) else None


def init_checkpoint(config, workdir: str | None = None) -> str | None:
  """The Hugging Face checkpoint directory of `model.init_from` ("hf:PATH"), or None. When PATH
  is gone but the run's `workdir` kept a copy of its config.json and tokenizer files
  (`record_init_source`), that copy (which has no weights: the run's checkpoint has them)."""
  path = _hf_path(config)
  if path is None or os.path.isfile(os.path.join(path, hf_llama.CONFIG)):
    return path
  copy = _source_copy(workdir)
  if copy is not None:
    return copy
  raise cfg_lib.ConfigError(f"model.init_from={config.model.init_from!r}: {path} has no "
                            f"{hf_llama.CONFIG}; give the directory of a Hugging Face checkpoint.")


def record_init_source(config, workdir: str):
  """Copies the init_from checkpoint's config.json and tokenizer files (not its weights) into
  <workdir>/init_from, so that exporting or advising the run needs only the workdir."""
  path = _hf_path(config)
  if path is None or not os.path.isfile(os.path.join(path, hf_llama.CONFIG)):
    return
  copy = os.path.join(workdir, SOURCE_COPY)
  os.makedirs(copy, exist_ok=True)
  for name in (hf_llama.CONFIG, *TOKENIZER_FILES):
    if os.path.isfile(os.path.join(path, name)):
      shutil.copyfile(os.path.join(path, name), os.path.join(copy, name))


def _hf_llama_config(config, path: str, vocab_size: int) -> llama.LlamaConfig:
  """The LlamaConfig of the init_from checkpoint (its sizes; the run's sequence and dtypes)."""
  m = config.model
  with open(os.path.join(path, hf_llama.CONFIG)) as f:
    hf = json.load(f)
  try:
    cfg, _ = hf_llama.llama_config_from_hf(
        hf, max_seq_len=m.max_seq_len or config.seq_len, remat=m.remat,
        scan_layers=m.scan_layers, compute_dtype=m.compute_dtype, param_dtype=m.param_dtype)
  except hf_llama.CheckpointError as error:
    raise cfg_lib.ConfigError(f"model.init_from: {error}") from error
  if cfg.vocab_size < vocab_size or (m.vocab_size and m.vocab_size != cfg.vocab_size):
    raise cfg_lib.ConfigError(
        f"model.init_from: the checkpoint's vocabulary has {cfg.vocab_size} tokens, but the data's "
        f"tokenizer has {vocab_size} (model.vocab_size={m.vocab_size}); use the checkpoint's "
        "tokenizer (data.tokenizer) so that token ids mean the same words.")
  if cfg.vocab_size > vocab_size:
    message = (f"model.init_from: the checkpoint's vocabulary has {cfg.vocab_size} tokens, the "
               f"data's tokenizer {vocab_size}: ids {vocab_size}..{cfg.vocab_size - 1} never occur "
               "in training. Fine for a vocabulary padded past its tokenizer's; otherwise the "
               "tokenizer is another one than the checkpoint's, and its ids mean other words: "
               "use the checkpoint's tokenizer (data.tokenizer).")
    logging.getLogger("lpjax.train").warning(message)
    warnings.warn(message, UserWarning, stacklevel=2)
  return cfg


def llama_config_of(config, vocab_size: int, workdir: str | None = None) -> llama.LlamaConfig:
  """The LlamaConfig of a run's `config.model` (`vocab_size`: the data's, unless the config sets
  one; with model.init_from, the checkpoint's sizes, read from the run's copy in `workdir` when
  the checkpoint has moved)."""
  m = config.model
  path = init_checkpoint(config, workdir)
  if path is not None:
    return _hf_llama_config(config, path, vocab_size)
  return llama.LlamaConfig.from_size(
      m.size, vocab_size=m.vocab_size or vocab_size, max_seq_len=m.max_seq_len or config.seq_len,
      remat=m.remat, scan_layers=m.scan_layers, compute_dtype=m.compute_dtype,
      param_dtype=m.param_dtype, num_kv_heads=m.get("num_kv_heads", 0),
      tie_embeddings=m.get("tie_embeddings", False))


def lm_loss(graphdef, model_config: llama.LlamaConfig, vocab_chunks: int, params, batch, policy,
            key):
  """Mean next-token cross-entropy of a batch {"inputs", "targets"}: over the whole logits, or
  with `vocab_chunks` > 1 over vocabulary slices (`chunked_cross_entropy`, never the whole
  logits). The trainer's loss; `benchmarks/speed/llama_step.py` compiles the same one."""
  if vocab_chunks > 1:
    features, head = llama.apply_features(graphdef, model_config, params, batch["inputs"], policy,
                                          key)
    return chunked_cross_entropy(features, head, model_config.vocab_size, batch["targets"],
                                 vocab_chunks)[0]
  logits = llama.apply(graphdef, model_config, params, batch["inputs"], policy, key)
  return cross_entropy(logits, batch["targets"])[0]


class LanguageModelTask(Task):
  name = "lm"
  partition_rules = llama.PARTITION_RULES
  unit = "tokens"

  def __init__(self, config, policy=None, workdir: str | None = None):
    self.config = config
    self.workdir = workdir  # the run's: holds the init_from checkpoint's config when it moves
    self._set_policy(config, policy)
    d = config.data
    self.dataset = lpdata.make_dataset(d.source, path=d.path, tfds_name=d.tfds_name,
                                       tokenizer=d.tokenizer, tfds_data_dir=d.tfds_data_dir or None,
                                       cache_dir=d.cache_dir or None, text_key=d.text_key,
                                       tfds_reader=d.tfds_reader, seq_len=config.seq_len,
                                       encoding=d.encoding, encoding_errors=d.encoding_errors)
    if workdir is not None and jax.process_index() == 0:
      record_init_source(config, workdir)
    self.model_config = llama_config_of(config, self.dataset.vocab_size, workdir)
    # the user's own model (model.factory), its GEMMs quantized by interception; else LLaMA
    vocab = self.model_config.vocab_size
    self.user = user_model(config, dict(vocab_size=vocab, seq_len=config.seq_len),
                           jnp.zeros((1, config.seq_len), jnp.int32),
                           Expected("(batch, seq_len, vocab_size)", (2, config.seq_len, vocab),
                                    "model.vocab_size"))
    if self.user is not None:
      if config.model.vocab_chunks > 1:
        raise cfg_lib.ConfigError("model.vocab_chunks needs lpjax's LLaMA (its head apart from "
                                  "its body); with model.factory set it to 0.")
      self.partition_rules = self.user.partition_rules
      return
    self.graphdef, _ = llama.abstract_model(self.model_config, self.policy)
    self._apply = functools.partial(llama.apply, self.graphdef, self.model_config)

  def pretrained_variables(self):
    """lpjax's LLaMA from model.init_from, read once on the host (a jitted init would hold the
    weights as constants of its program)."""
    path = self._weights()
    if path is None or self.user is not None:
      return None
    return self._load(path), None

  def _load(self, path):
    try:
      return hf_llama.load_pretrained(path, self.policy, **self._hf_fields())[1]
    except hf_llama.CheckpointError as error:
      raise cfg_lib.ConfigError(f"model.init_from: {error}") from None

  def _weights(self) -> str | None:
    """The init_from checkpoint to read weights from; None without one, or when it has moved but
    the run has a checkpoint of its own (which replaces whatever is initialised)."""
    path = init_checkpoint(self.config, self.workdir)
    if path is None or path != _source_copy(self.workdir):
      return path
    from lpjax.train.state._checkpoint import Checkpointer  # noqa: PLC0415
    checkpoints = os.path.join(self.workdir, "checkpoints")
    if os.path.isdir(checkpoints):
      ckpt = Checkpointer(checkpoints, async_save=False)
      step = ckpt.latest_step()
      ckpt.close()
      if step is not None:
        return None
    raise cfg_lib.ConfigError(
        f"model.init_from={self.config.model.init_from!r}: that folder is gone and this run has "
        "no checkpoint of its own yet to resume from; point model.init_from at the checkpoint's "
        "new place.")

  def init_variables(self, key):
    path = self._weights()
    if self.user is not None:
      params, state = self.user.init_variables(key)
      if path is not None:
        params = self._converted(path, params)
      return params, state
    if path is not None:
      return self._load(path), None
    return llama.init_params(self.model_config, key, self.policy), None

  def _hf_fields(self):
    c = self.model_config
    return dict(max_seq_len=c.max_seq_len, remat=c.remat, scan_layers=c.scan_layers,
                compute_dtype=c.compute_dtype, param_dtype=c.param_dtype)

  def _converted(self, path, params):
    """A model.factory model's params from the checkpoint, by model.init_converter."""
    spec = self.config.model.get("init_converter", "")
    if not spec:
      raise cfg_lib.ConfigError("model.init_from with model.factory needs model.init_converter="
                                "package.module:function, which maps the checkpoint's tensors "
                                "({name: numpy array}) onto your model's params.")
    module, _, name = spec.partition(":")
    try:
      convert = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
      raise cfg_lib.ConfigError(f"model.init_converter={spec!r} does not load ({error}); give "
                                "package.module:function, importable from the working "
                                "directory.") from error
    try:
      tensors = hf_llama.read_tensors(path)
    except hf_llama.CheckpointError as error:
      raise cfg_lib.ConfigError(f"model.init_from: {error}") from None
    return convert(tensors, params)

  def stacked_layers(self, params):
    if self.user is not None:
      return self.user.stacked_layers(params)
    return llama.stacked_layers(self.model_config, params, self.policy)

  def _user_logits(self, params, model_state, tokens, policy, key, train):
    return self.user.apply(params, model_state, tokens,
                           policy if policy is not None else self.policy, key, train=train)

  def loss(self, params, model_state, batch, key, policy):
    if self.user is not None:
      logits, model_state = self._user_logits(params, model_state, batch["inputs"], policy, key,
                                              True)
      return cross_entropy(logits, batch["targets"])[0], (model_state, {})
    loss = lm_loss(self.graphdef, self.model_config, self.config.model.vocab_chunks, params,
                   batch, policy, key)
    return loss, (model_state, {})

  def batches(self, start_step, num_steps, process_index, process_count):
    c = self.config
    return lpdata.batch_iterator(
        self.dataset, start_step=start_step, batch_size=c.batch_size, seq_len=c.seq_len,
        seed=c.seed, process_index=process_index, process_count=process_count,
        num_steps=num_steps, prefetch=c.data.prefetch,
        seq_len_at=lambda s: cfg_lib.seq_len_at(c, s))

  def units_in(self, local_batch):
    return int(local_batch["inputs"].shape[1]) * self.config.batch_size

  def eval_batches(self, process_index, process_count):
    c = self.config
    for i in range(c.eval_steps):
      yield self.dataset.eval_batch(i, c.batch_size, c.seq_len, process_index, process_count)

  def eval_sums(self, params, model_state, batch, policy):
    if self.user is not None:
      logits, _ = self._user_logits(params, model_state, batch["inputs"], policy,
                                    jax.random.key(0), False)
    else:
      logits = self._apply(params, batch["inputs"], policy, jax.random.key(0))
    loss, count = cross_entropy(logits, batch["targets"])
    return {"loss_sum": loss * count, "count": jnp.asarray(count, jnp.float32)}

  def eval_summary(self, sums):
    loss = float(sums["loss_sum"]) / max(float(sums["count"]), 1.0)
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0))}

  def describe(self):
    if self.user is not None:
      return {"model": self.config.model.factory}
    if self.config.model.init_from:
      return {"model": self.config.model.init_from}
    return {"model": self.config.model.size}

  def model_description(self):
    if self.user is not None:
      return self.user.describe()
    if self.config.model.init_from:
      return f"lpjax LLaMA from {self.config.model.init_from}"
    return f"lpjax LLaMA {self.config.model.size}"

  def quant_report(self, policy):
    if self.user is not None:
      return self.user.report(policy)
    graphdef, params = llama.abstract_model(self.model_config, policy)
    return own_model_report(graphdef, params,
                            scanned=("layers",) if self.model_config.scanned(policy) else ())
