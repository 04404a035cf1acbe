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
import math

import jax
import jax.numpy as jnp
import optax

from lpjax import data as lpdata
from lpjax.models import llama
from lpjax.train import config as cfg_lib
from lpjax.train._tasks.base import Task


def cross_entropy(logits, targets):
  """(mean token loss, token count) of float32 softmax cross-entropy."""
  logits = logits.astype(jnp.float32)
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  return jnp.mean(loss), loss.size


class LanguageModelTask(Task):
  name = "lm"
  partition_rules = llama.PARTITION_RULES
  unit = "tokens"

  def __init__(self, config, policy=None):
    self.config = config
    self._set_policy(config, policy)
    d = config.data
    self.dataset = lpdata.make_dataset(d.source, path=d.path, tfds_name=d.tfds_name,
                                       tokenizer=d.tokenizer, tfds_data_dir=d.tfds_data_dir or None,
                                       cache_dir=d.cache_dir or None, text_key=d.text_key,
                                       tfds_reader=d.tfds_reader, seq_len=config.seq_len)
    m = config.model
    self.model_config = llama.LlamaConfig.from_size(
        m.size, vocab_size=m.vocab_size or self.dataset.vocab_size,
        max_seq_len=m.max_seq_len or config.seq_len, remat=m.remat, scan_layers=m.scan_layers,
        compute_dtype=m.compute_dtype, param_dtype=m.param_dtype)
    self.graphdef, _ = llama.abstract_model(self.model_config, self.policy)
    self._apply = functools.partial(llama.apply, self.graphdef, self.model_config)

  def init_variables(self, key):
    return llama.init_params(self.model_config, key, self.policy), None

  def stacked_layers(self, params):
    return llama.stacked_layers(self.model_config, params, self.policy)

  def loss(self, params, model_state, batch, key, policy):
    logits = self._apply(params, batch["inputs"], policy, key)
    loss, _ = cross_entropy(logits, batch["targets"])
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
    logits = self._apply(params, batch["inputs"], policy, jax.random.key(0))
    loss, count = cross_entropy(logits, batch["targets"])
    return {"loss_sum": loss * count, "count": jnp.asarray(count, jnp.float32)}

  def eval_summary(self, sums):
    loss = float(sums["loss_sum"]) / max(float(sums["count"]), 1.0)
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0))}

  def describe(self):
    return {"model": self.config.model.size}
