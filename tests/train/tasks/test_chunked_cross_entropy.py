"""The vocab-chunked LM loss (model.vocab_chunks): the same loss and gradients as the whole
logits, checked against a numpy re-derivation, without holding the logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax.models import llama
from lpjax.quant import QuantPolicy
from lpjax.train.tasks.lm import chunked_cross_entropy, cross_entropy


def numpy_cross_entropy(logits, targets):
  """Mean softmax cross-entropy in float64 (max-shifted log-sum-exp)."""
  z = np.asarray(logits, np.float64)
  top = z.max(-1, keepdims=True)
  lse = np.log(np.exp(z - top).sum(-1)) + top[..., 0]
  picked = np.take_along_axis(z, np.asarray(targets)[..., None], -1)[..., 0]
  return float(np.mean(lse - picked))


@pytest.mark.parametrize("vocab,chunks", [(64, 4), (61, 4), (61, 61), (50, 1), (37, 5)])
def test_loss_and_gradients_equal_the_whole_logits(vocab, chunks):
  """Dividing and non-dividing chunk counts (the last slice overlaps), one column per chunk, and
  extreme logits (a shift of 80 would overflow exp without the running maximum)."""
  kw, kh = jax.random.split(jax.random.key(vocab + chunks))
  w = jax.random.normal(kw, (24, vocab)) * 4.0
  h = jax.random.normal(kh, (3, 5, 24))
  targets = jax.random.randint(jax.random.key(1), (3, 5), 0, vocab)
  bias = jnp.zeros(vocab).at[vocab - 1].set(80.0)  # the last column (in the overlap) dominates
  head = lambda x, w, start, size: (x @ jax.lax.dynamic_slice_in_dim(w, start, size, axis=1)
                                    + jax.lax.dynamic_slice_in_dim(bias, start, size))
  whole = lambda h, w: cross_entropy(h @ w + bias, targets)[0]
  chunked = lambda h, w: chunked_cross_entropy(h, lambda x, s, n: head(x, w, s, n), vocab,
                                               targets, chunks)[0]
  expected = numpy_cross_entropy(np.asarray(h) @ np.asarray(w) + np.asarray(bias), targets)
  np.testing.assert_allclose(float(chunked(h, w)), expected, rtol=2e-6)
  for a, b in zip(jax.grad(chunked, argnums=(0, 1))(h, w), jax.grad(whole, argnums=(0, 1))(h, w)):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


def test_bad_chunk_count_is_named():
  with pytest.raises(ValueError, match="chunks must be in"):
    chunked_cross_entropy(jnp.ones((1, 2, 4)), None, 10, jnp.zeros((1, 2), jnp.int32), 11)


def test_llama_loss_with_chunks_equals_the_whole_head_and_never_holds_the_logits():
  """Through the LLaMA LM head (QDense.columns): the loss and every parameter's gradient match,
  and the backward pass holds no (tokens, vocab) float32 array: the compiled step needs less
  temporary memory than one such array takes, where the whole-logits loss needs several."""
  cfg = llama.LlamaConfig(vocab_size=4096, hidden=32, intermediate=64, heads=2, layers=1,
                          max_seq_len=64, compute_dtype="float32")
  policy = QuantPolicy(recipe="fp32", high_precision="fp32")  # float32 GEMMs: exact to compare
  graphdef, _ = llama.abstract_model(cfg, policy)
  params = llama.init_params(cfg, jax.random.key(0), policy)
  tokens = jax.random.randint(jax.random.key(1), (4, 64), 0, cfg.vocab_size)
  key = jax.random.key(2)

  def whole(params):
    return cross_entropy(llama.apply(graphdef, cfg, params, tokens, None, key), tokens)[0]

  def chunked(params):
    h, head = llama.apply_features(graphdef, cfg, params, tokens, None, key)
    return chunked_cross_entropy(h, head, cfg.vocab_size, tokens, 16)[0]

  lw, gw = jax.value_and_grad(whole)(params)
  lc, gc = jax.value_and_grad(chunked)(params)
  np.testing.assert_allclose(lc, lw, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(gc), jax.tree.leaves(gw)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
  logits_bytes = tokens.size * cfg.vocab_size * 4  # 4 MiB
  temp = lambda f: jax.jit(jax.grad(f)).lower(params).compile().memory_analysis().temp_size_in_bytes
  assert temp(chunked) < logits_bytes < 2 * logits_bytes < temp(whole)


def test_a_quantized_head_cannot_be_sliced():
  from flax import nnx
  from lpjax.nn import QDense
  layer = QDense(64, 32, recipe="mxfp4_naive", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="high-precision recipe"):
    layer.columns(jnp.ones((2, 64)), 0, 16, key=jax.random.key(0))


@pytest.mark.parametrize("overrides,match", [
    ({"model.vocab_chunks": -1}, "vocab_chunks must be in"),
    ({"model.vocab_chunks": 8, "model.vocab_size": 4}, "vocab_chunks must be in"),
    ({"model.vocab_chunks": 8, "quant.policy": "pure"}, "high-precision LM head"),
])
def test_config_errors_name_vocab_chunks(overrides, match):
  from config_helpers import small
  from lpjax.train.config import ConfigError, validate
  with pytest.raises(ConfigError, match=match):
    validate(small(**overrides), device_count=8)


def test_the_lm_task_with_chunks_gives_the_whole_logits_loss_and_gradients():
  """The trainer's LM task built from a config with model.vocab_chunks (tiny LLaMA, MXFP4 RTN
  blocks, bf16 head, 4 slices of the 257-token byte vocabulary: the last one overlaps): the same
  loss as without to float32 rounding, and the same gradients to the bf16 rounding of the GEMM
  operands (a last-bit change of a float32 dlogit can flip its bf16 rounding), on a batch of the
  offline corpus."""
  from config_helpers import small
  from lpjax.train.tasks.lm import LanguageModelTask
  tasks = {c: LanguageModelTask(small("mxfp4_naive", **{"model.vocab_chunks": c}))
           for c in (0, 4)}
  params, _ = tasks[0].init_variables(jax.random.key(0))
  _, batch = next(tasks[0].batches(0, 1, 0, 1))
  batch = jax.tree.map(jnp.asarray, batch)
  out = {c: jax.jit(jax.value_and_grad(lambda p, t=t: t.loss(p, None, batch, jax.random.key(1),
                                                              None)[0]))(params)
         for c, t in tasks.items()}
  np.testing.assert_allclose(out[4][0], out[0][0], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(out[4][1]), jax.tree.leaves(out[0][1])):
    scale = float(jnp.max(jnp.abs(b))) + 1e-30
    np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale, atol=4e-3)
