"""Structural speed properties of the quantized step (no timing): what a GEMM site costs the
traced and compiled program.

- Site keys (`QuantPolicy.site_key`) are the bits of `jax.random.fold_in`, computed without its
  Threefry primitive (XLA:CPU compiles each one to a rolled while loop with tuple copies), and a
  LLaMA block derives the keys of all its GEMMs in two vectorized hashes, not two per GEMM.
- Quartet's backward takes the forward's Q(X), Q(W) and their trust masks from one RHT + QuEST of
  each operand (it ran both twice).
"""

from __future__ import annotations

import collections
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lpjax.models import llama
from lpjax.quant import QuantPolicy
from lpjax.quant.gemm.dot_general import dot_general
from lpjax.quant.intercept.jax_compat import inner_jaxprs


def _primitives(jaxpr, counts=None):
  """primitive name (and pjit's function name, as 'pjit:<name>') -> count, nested jaxprs included."""
  counts = collections.Counter() if counts is None else counts
  for eqn in jaxpr.eqns:
    counts[eqn.primitive.name] += 1
    if eqn.primitive.name in ("pjit", "jit"):
      counts[f"pjit:{eqn.params.get('name')}"] += 1
    for inner in inner_jaxprs(eqn):
      _primitives(inner, counts)
  return counts


def _words(key):
  return np.asarray(jax.random.key_data(key))


# -- site keys ------------------------------------------------------------------------------------
def test_threefry_fold_in_is_jax_random_fold_in_bit_for_bit():
  from lpjax.quant.numerics import threefry
  rs = np.random.RandomState(0)
  keys = jax.random.split(jax.random.key(11), 64)
  data = rs.randint(-2**31, 2**31 - 1, size=64).astype(np.int32)
  data[:4] = (0, 1, -1, 2**31 - 1)
  ours = jax.jit(jax.vmap(lambda k, d: jax.random.key_data(threefry.fold_in(k, d))))(keys, data)
  theirs = jax.vmap(lambda k, d: jax.random.key_data(jax.random.fold_in(k, d)))(keys, data)
  np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
  each = threefry.fold_in_each(list(keys[:5]), [int(d) for d in data[:5]])
  np.testing.assert_array_equal(np.stack([_words(k) for k in each]), np.asarray(theirs[:5]))


def test_site_keys_are_the_bits_of_jax_random_fold_in_and_draw_no_threefry():
  policy, key = QuantPolicy(), jax.random.key(3)
  paths = ["layers/2/mlp/up_proj", "layers/2/attn/q_proj", "lm_head"]

  def reference(path):  # the documented derivation (docs/numerics.md §7, "Keys")
    k = jax.random.fold_in(key, zlib.crc32(policy.canonical_path(path).encode()) & 0x7FFFFFFF)
    block = policy.block_index(path)
    return k if block is None else jax.random.fold_in(k, block)

  for path, together in zip(paths, policy.site_keys(key, paths)):
    np.testing.assert_array_equal(_words(policy.site_key(key, path)), _words(reference(path)))
    np.testing.assert_array_equal(_words(together), _words(reference(path)))
  scanned = jax.jit(lambda k, i: jax.random.key_data(policy.site_key(k, "layers/mlp/up_proj", i)))
  np.testing.assert_array_equal(np.asarray(scanned(key, 2)), _words(reference(paths[0])))
  prims = _primitives(jax.make_jaxpr(lambda k, i: policy.site_keys(k, paths[:2], i))(key, 2).jaxpr)
  assert prims["random_fold_in"] == prims["threefry2x32"] == prims["while"] == 0, prims
  assert prims["pjit:_threefry_words"] == 2  # one hash per fold, for both paths together
  # compiled (XLA:CPU): no while loop (before: one rolled Threefry loop per fold, 2 per site)
  hlo = jax.jit(lambda k: jax.random.key_data(policy.site_key(k, paths[0]))).lower(key).compile()
  assert hlo.as_text().count(" while(") == 0


@pytest.mark.parametrize("scan_layers", [True, False])
def test_an_mxfp4_llama_derives_its_site_keys_without_threefry_two_hashes_per_block(scan_layers):
  cfg = llama.LlamaConfig(vocab_size=64, hidden=64, intermediate=128, heads=2, layers=2,
                          max_seq_len=16, scan_layers=scan_layers)
  model = llama.Llama(cfg, QuantPolicy(recipe="mxfp4"), rngs=nnx.Rngs(0))
  tokens = jnp.zeros((1, 16), jnp.int32)
  graph, state = nnx.split(model)
  forward = lambda state, k: nnx.merge(graph, state)(tokens, key=k)
  prims = _primitives(jax.make_jaxpr(forward)(state, jax.random.key(0)).jaxpr)
  # before: 2 jax.random.fold_in per GEMM site (9 per block and the head), each a Threefry loop
  assert prims["random_fold_in"] == prims["threefry2x32"] == 0, prims
  blocks_traced = 1 if scan_layers else cfg.layers
  assert prims["pjit:_threefry_words"] == 2 * blocks_traced + 1  # + the LM head's (kept) path


def test_a_blocks_keys_are_its_layers_own_site_keys():
  cfg = llama.LlamaConfig(vocab_size=64, hidden=64, intermediate=128, heads=2, layers=2,
                          max_seq_len=16, scan_layers=False)
  model = llama.Llama(cfg, QuantPolicy(recipe="mxfp4"), rngs=nnx.Rngs(0))
  key, block = jax.random.key(5), model.layers[1]
  keys = block.site_keys(key, 1)
  for layer in (block.attn.q_proj, block.attn.o_proj, block.mlp.down_proj):
    np.testing.assert_array_equal(_words(keys[layer.path]), _words(layer.site_key(key, 1)))
  assert keys[block.attn.attn_scores.path] is None  # kept in high precision: draws no bits


# -- Quartet's backward ---------------------------------------------------------------------------
def test_quartet_backward_runs_one_quest_per_operand():
  x, w = jnp.ones((8, 64)), jnp.ones((64, 32))
  loss = lambda x, w, k: dot_general(x, w, (((1,), (0,)), ((), ())), "quartet", key=k).sum()
  prims = _primitives(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, w, jax.random.key(0)).jaxpr)
  # QuEST takes one sqrt per call (its RMS scale): 2 in the forward, then X's and W's once each in
  # the backward for both the from_fwd operands and the trust masks (before: 6, each twice).
  assert prims["sqrt"] == 4, prims["sqrt"]
  assert prims["dot_general"] == 3


# -- a GEMM's keys ----------------------------------------------------------------------------------
def _entry_kernels(compiled_text):
  """(dtype, sorted dims) of each kernel (fusion) of the compiled program's entry computation."""
  entry = compiled_text[compiled_text.index("ENTRY"):]
  out = []
  for line in entry.splitlines():
    if " fusion(" in line:
      shape = line.split("=")[1].split("fusion(")[0].strip()  # e.g. u32[2,4]{1,0}
      dtype, dims = shape.split("[")[0], shape.split("[")[1].split("]")[0]
      out.append((dtype, tuple(sorted(int(d) for d in dims.split(",") if d))))
  return out


@pytest.mark.parametrize("recipe", ["mxfp4", "nvfp4"])
def test_a_gemms_backward_derives_its_sr_streams_in_one_kernel(recipe):
  """The backward's stochastic operands' streams are one u32[n, 2] kernel (mxfp4: 4 operands,
  nvfp4: 2): no per-key kernel (u32[2], one per stream before) is left. The same values as
  deriving each alone: `test_rng` pins the streams, `test_gemm` the GEMMs' bits."""
  from lpjax.quant import recipes
  r = recipes.get(recipe)
  stochastic = sum(op is not None and getattr(op, "stochastic", False)
                   for g in ("dgrad", "wgrad") for op in getattr(r, g).operands())
  x = jax.random.normal(jax.random.key(0), (64, 96), jnp.float32)
  w = jax.random.normal(jax.random.key(1), (96, 128), jnp.float32)
  f = lambda x, w, k: jnp.sum(dot_general(x, w, (((1,), (0,)), ((), ())), recipe, key=k) ** 2)
  grad = jax.jit(jax.grad(f, argnums=(0, 1)))
  kernels = _entry_kernels(grad.lower(x, w, jax.random.key(5)).compile().as_text())
  assert stochastic >= 2
  assert ("u32", (2,)) not in kernels, kernels
  assert kernels.count(("u32", tuple(sorted((stochastic, 2))))) == 1, kernels
