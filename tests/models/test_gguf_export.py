"""GGUF exports read by llama.cpp's own Python package (gguf-py: `GGUFReader` and
`gguf.quants.dequantize`): gguf-mxfp4's linear weights decode to exactly lpjax's dequantized MXFP4
weights (the run's codes and E8M0 scales, bit for bit), the rest to the bf16 / float32 export,
and lpjax's logits from what the reader decodes equal lpjax's own. Needs the interop extra
(requirements-interop.txt: `gguf`); skipped without it."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

import os  # noqa: E402

from lpjax import quant  # noqa: E402
from lpjax.models import _gguf, hf_llama, llama  # noqa: E402

CFG = llama.LlamaConfig(vocab_size=67, hidden=64, intermediate=96, heads=4, layers=2,
                        max_seq_len=16, num_kv_heads=2)
POLICY = quant.QuantPolicy.from_settings("mxfp4_naive")
FP32 = quant.QuantPolicy(recipe="fp32", high_precision="fp32")
TOKENS = np.random.default_rng(1).integers(0, 67, (2, 12))
_HF = {v: k for k, v in _gguf._BLOCK.items()}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """(params, {format: directory}) of one tiny GQA LLaMA exported as gguf and gguf-mxfp4."""
  params = llama.init_params(CFG, jax.random.key(0))
  params = jax.tree.map(lambda a: a * 5.0, params)
  dirs = {}
  for fmt in _gguf.GGUF_FORMATS:
    dirs[fmt] = str(tmp_path_factory.mktemp(fmt))
    _gguf.save_gguf(dirs[fmt], CFG, params, fmt, policy=POLICY, overwrite=True)
  return params, dirs


def _read(directory):
  """{Hugging Face name: float32 (out, in) array} and {name: GGML type} of a GGUF, decoded by
  gguf-py alone; q / k rows permuted back to Hugging Face's order."""
  reader = gguf.GGUFReader(os.path.join(directory, "model.gguf"))
  heads = int(reader.fields["llama.attention.head_count"].parts[-1][0])
  kv = int(reader.fields["llama.attention.head_count_kv"].parts[-1][0])
  out, types = {}, {}
  for t in reader.tensors:
    a = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
    a = a.reshape(tuple(int(n) for n in reversed(t.shape.tolist())))
    base = t.name[:-len(".weight")]
    if base.startswith("blk."):
      _, block, short = base.split(".", 2)
      name = f"model.layers.{block}.{_HF[short]}.weight"
    else:
      name = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
              "output": "lm_head"}[base] + ".weight"
    if name.endswith(("q_proj.weight", "k_proj.weight")):  # GGML's RoPE pairs -> half-split
      h = heads if "q_proj" in name else kv
      a = a.reshape(h, a.shape[0] // h // 2, 2, -1).swapaxes(1, 2).reshape(a.shape)
    out[name], types[name] = a, t.tensor_type.name
  return out, types


def _logits(params):
  graphdef, _ = llama.abstract_model(CFG, FP32)
  return np.asarray(llama.apply(graphdef, CFG, params, jnp.asarray(TOKENS), FP32,
                                jax.random.key(0)))


def _bf16(a):
  return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def test_gguf_mxfp4_decodes_to_exactly_lpjax_s_mxfp4_weights(exported):
  params, dirs = exported
  got, types = _read(dirs["gguf-mxfp4"])
  packed = quant.export_weights(params, POLICY.for_model(num_blocks=CFG.layers))
  assert len(packed) == 7 * CFG.layers
  for name, w in packed.items():
    _, block, module, proj, _ = name.split("/")
    hf = f"model.layers.{block}.{hf_llama._BLOCK[module + '/' + proj]}.weight"
    assert types[hf] == "MXFP4"
    want = np.asarray(w.dequantize(), np.float32)
    assert got[hf].shape == want.shape and np.array_equal(got[hf], want), hf  # bit for bit
  assert types["model.embed_tokens.weight"] == "BF16" and types["lm_head.weight"] == "BF16"
  assert types["model.norm.weight"] == "F32"
  flat = hf_llama._flat_params(params)
  assert np.array_equal(got["model.embed_tokens.weight"], _bf16(flat["embed/embedding"]))
  # lpjax's logits from what llama.cpp's reader decodes are lpjax's logits of its own decode
  cfg_params = hf_llama.params_from_tensors(got, CFG, hf_llama.layout_of(CFG))
  assert np.array_equal(_logits(cfg_params), _logits(_held(params, packed)))
  size = lambda f: os.path.getsize(os.path.join(dirs[f], "model.gguf"))
  assert size("gguf-mxfp4") < 0.8 * size("gguf")


def _held(params, packed=None):
  """`params` as an export holds them: lpjax's MXFP4 decode for the `packed` linear weights
  ((in, out) kernels), the norms' float32 scales, bf16 for the rest."""
  def one(path, leaf):
    name = hf_llama._lpjax_path(path)
    if packed and name.startswith("layers/") and name.endswith("kernel"):
      rest = name.split("/", 1)[1]
      return jnp.stack([np.asarray(packed[f"layers/{i}/{rest}"].dequantize()).T
                        for i in range(CFG.layers)])
    return jnp.asarray(np.asarray(leaf) if name.endswith("scale") else _bf16(leaf))

  return jax.tree_util.tree_map_with_path(one, params)


def test_gguf_bf16_decodes_to_the_bf16_weights_and_keeps_the_config(exported):
  params, dirs = exported
  got, types = _read(dirs["gguf"])
  flat = hf_llama._flat_params(params)
  up = flat["layers/1/mlp/up_proj/kernel"].T
  assert types["model.layers.1.mlp.up_proj.weight"] == "BF16"
  assert np.array_equal(got["model.layers.1.mlp.up_proj.weight"], _bf16(up))
  q = flat["layers/0/attn/q_proj/kernel"].T  # permuted on the way in, back on the way out
  assert np.array_equal(got["model.layers.0.self_attn.q_proj.weight"], _bf16(q))
  assert np.array_equal(got["model.norm.weight"], np.asarray(flat["norm/scale"], np.float32))
  reader = gguf.GGUFReader(os.path.join(dirs["gguf"], "model.gguf"))
  field = lambda k: reader.fields[k].parts[-1][0]
  assert (field("llama.block_count"), field("llama.attention.head_count_kv"),
          field("llama.embedding_length"), field("llama.feed_forward_length")) == (2, 2, 64, 96)
  assert bytes(reader.fields["general.architecture"].parts[-1]).decode() == "llama"
  cfg_params = hf_llama.params_from_tensors(got, CFG, hf_llama.layout_of(CFG))
  assert np.array_equal(_logits(cfg_params), _logits(_held(params)))


def test_ggml_rope_permutation_pairs_each_half_split_row_with_its_partner():
  """GGML rotates rows (2i, 2i+1) of a head; Hugging Face rotates rows i and i + D/2."""
  w = np.arange(2 * 8)[:, None].repeat(3, 1)  # 2 heads of dim 8: row r holds r
  p = _gguf.permute_rope_rows(w, 2)[:, 0]
  assert p.tolist() == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]


def test_llama3_rope_freqs_are_the_divisors_of_lpjax_s_frequencies():
  scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
             "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
  hf = {"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 500000.0,
        "rope_scaling": scaling}
  factors = _gguf._rope_factors(hf)
  base = 1.0 / 500000.0 ** (np.arange(0, 16, 2, dtype=np.float32) / 16)
  ours = np.asarray(llama._llama3_freqs(jnp.asarray(base), scaling))
  assert np.allclose(base / factors, ours, rtol=1e-6)
  assert factors.min() == 1.0 and factors.max() == 8.0
  assert _gguf._rope_factors({**hf, "rope_scaling": None}) is None
