"""Real clients read lpjax's exports: transformers (PyTorch, CPU) loads the bf16 export and its
logits match lpjax's for the same weights. Needs the interop extra (requirements-interop.txt,
`make test-interop`); skipped without it."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lpjax import quant  # noqa: E402
from lpjax.models import hf_llama, llama  # noqa: E402

FP32 = quant.QuantPolicy(recipe="fp32", high_precision="fp32")
TOKENS = np.random.default_rng(1).integers(0, 67, (2, 12))


def _lpjax_logits(cfg, params, tokens):
  graphdef, _ = llama.abstract_model(cfg, FP32)
  return np.asarray(llama.apply(graphdef, cfg, params, jnp.asarray(tokens), FP32,
                                jax.random.key(0)))


def _transformers_logits(path, tokens):
  model = transformers.AutoModelForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32)
  model.eval()
  with torch.no_grad():
    return model(torch.as_tensor(tokens)).logits.numpy()


def test_transformers_loads_the_bf16_export_and_its_logits_match_lpjax(tmp_path):
  cfg = llama.LlamaConfig(vocab_size=67, hidden=64, intermediate=96, heads=4, layers=2,
                          max_seq_len=16)
  params = jax.tree.map(lambda a: a * 5.0, llama.init_params(cfg, jax.random.key(0)))
  hf_llama.save_pretrained(str(tmp_path), cfg, params)  # bf16
  rounded = jax.tree.map(
      lambda a: jnp.asarray(np.asarray(a).astype(ml_dtypes.bfloat16).astype(np.float32)), params)
  want = _lpjax_logits(cfg, rounded, TOKENS)
  got = _transformers_logits(tmp_path, TOKENS)
  assert np.abs(want).max() > 1.0
  assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
