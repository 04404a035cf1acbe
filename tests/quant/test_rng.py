"""The key derivation of the quantized GEMMs (lpjax.quant.numerics.rng.fold_in) and the RHT signs, against
the numpy re-derivation of docs/numerics.md §7 (gemm_reference.py), and their independence."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from gemm_reference import ref_fold_in, ref_key  # noqa: E402

from lpjax import quant  # noqa: E402
from lpjax.quant.gemm import operand as opq  # noqa: E402
from lpjax.quant.numerics import rng as _rng


@pytest.mark.parametrize("key", [jax.random.key(0), jax.random.key(12345), jax.random.PRNGKey(7),
                                 jax.random.key(3, impl="rbg")])
def test_fold_in_is_the_contract_hash(key):
  for tag in (0, 1, 2, 5, 10, 0xFFFFFFFF):
    words = np.asarray(jax.random.key_data(_rng.fold_in(key, tag)))
    if jax.random.key_data(key).shape[-1] == 4:  # rbg: key_words mixes the middle words in
      k0, k1 = (int(w) for w in _rng.key_words(key))
      words_ref = ref_fold_in(np.uint32([k0, k1]), tag)
    else:
      words_ref = ref_fold_in(key, tag)
    np.testing.assert_array_equal(words, words_ref, err_msg=f"tag {tag}")


def test_operand_keys_and_signs_follow_the_contract():
  key = jax.random.key(42)
  for gemm in ("fwd", "dgrad", "wgrad"):
    for side in (opq.LHS, opq.RHS):
      got = np.asarray(jax.random.key_data(opq.operand_key(key, gemm, side)))
      np.testing.assert_array_equal(got, ref_key(key, gemm, side))
    signs = np.asarray(opq.hadamard_signs(key, gemm, 64))
    bits = np.asarray(quant.random_bits(ref_key(key, gemm, 2), (64,)))
    np.testing.assert_array_equal(signs, np.where(bits >> 31, -1.0, 1.0).astype(np.float32))


def test_derived_keys_give_distinct_uncorrelated_bits():
  keys = [jax.random.key(s) for s in (0, 1, 2**31 + 5)]
  streams = []
  for key in keys:
    for tag in range(12):
      streams.append(np.asarray(quant.random_bits(_rng.fold_in(key, tag), (1 << 14,))))
  words = {tuple(np.asarray(jax.random.key_data(_rng.fold_in(k, t)))) for k in keys
           for t in range(12)}
  assert len(words) == 36
  bits = np.stack([(s >> 31).astype(np.float64) for s in streams])  # top bits (the RHT signs)
  assert np.all(np.abs(bits.mean(1) - 0.5) < 0.02)
  corr = np.corrcoef(np.stack([s.astype(np.float64) for s in streams]))
  off_diagonal = corr[~np.eye(len(streams), dtype=bool)]
  assert np.max(np.abs(off_diagonal)) < 0.05  # 4 sigma of 1 / sqrt(2**14) is 0.031


def test_fold_in_runs_under_jit_and_vmap_and_accepts_traced_tags():
  key = jax.random.key(9)
  eager = np.asarray(jax.random.key_data(_rng.fold_in(key, 3)))
  jitted = np.asarray(jax.random.key_data(jax.jit(_rng.fold_in)(key, 3)))
  mapped = jax.vmap(lambda t: jax.random.key_data(_rng.fold_in(key, t)))(jnp.arange(5, dtype=jnp.uint32))
  np.testing.assert_array_equal(eager, jitted)
  np.testing.assert_array_equal(np.asarray(mapped)[3], eager)
