"""The key derivation of the quantized GEMMs (lpjax.quant.numerics.rng.fold_in) and the RHT signs, against
the numpy re-derivation of docs/numerics.md §7 (gemm_reference.py), and their independence."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from gemm_reference import M32, fmix32, ref_fold_in, ref_key  # noqa: E402

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


# ----------------------------------------------------------------------------- the SR bits' hash

def _ref_random_bits(k0, k1, n):
  """docs/numerics.md §6 "Random bits", in numpy uint64 arithmetic mod 2**32."""
  a = fmix32(k0 ^ 0x3C6EF372)
  m = fmix32(k1 ^ a ^ 0xA54FF53A) | 1
  h = (np.arange(n, dtype=np.uint64) * np.uint64(m) + np.uint64(a)) & np.uint64(M32)
  h ^= h >> np.uint64(16)
  h = (h * np.uint64(0x21F0AAAD)) & np.uint64(M32)
  h ^= h >> np.uint64(15)
  h = (h * np.uint64(0xD35A2D97)) & np.uint64(M32)
  return (h ^ (h >> np.uint64(15))).astype(np.uint32)


@pytest.mark.parametrize("key", [jax.random.key(0), jax.random.key(12345), jax.random.PRNGKey(7),
                                 jax.random.key(3, impl="rbg")])
def test_random_bits_are_the_contract_hash(key):
  k0, k1 = (int(w) for w in _rng.key_words(key))
  ref = _ref_random_bits(k0, k1, 3 * 700)
  np.testing.assert_array_equal(np.asarray(quant.random_bits(key, (3, 700))).ravel(), ref)
  a, m = (int(w) for w in _rng.stream_words(key))
  assert m % 2 == 1 and (a, m) == (fmix32(k0 ^ 0x3C6EF372), fmix32(k1 ^ a ^ 0xA54FF53A) | 1)
  if k0 == 0 and k1 == 0:  # key(0): the words are zero, the stream is not a bare counter
    assert a != 0 and m != 1


@pytest.mark.parametrize("key", [jax.random.key(0), jax.random.key(77), jax.random.PRNGKey(7)])
def test_derived_streams_are_those_of_each_key_alone(key):
  """A GEMM pass derives its operands' streams at once (`rng.derived_streams`,
  `operand.operand_streams`): the contract's words and bits, as when each key is derived alone
  (jitted and eager alike)."""
  tags = [4, 5, 8, 9, 0xFFFFFFFF]
  for i, stream in enumerate(_rng.derived_streams(key, tags)):
    k0, k1 = (int(w) for w in ref_fold_in(key, tags[i]))
    a = fmix32(k0 ^ 0x3C6EF372)
    assert [int(w) for w in stream.words] == [a, fmix32(k1 ^ a ^ 0xA54FF53A) | 1]
    np.testing.assert_array_equal(np.asarray(quant.random_bits(stream, (3, 50))).ravel(),
                                  _ref_random_bits(k0, k1, 150))
  places = [("dgrad", opq.LHS), ("dgrad", opq.RHS), ("wgrad", opq.LHS), ("wgrad", opq.RHS)]
  streams = jax.jit(lambda k: opq.operand_streams(k, places))(key)
  for place, stream in zip(places, streams):
    alone = quant.random_bits(opq.operand_key(key, *place), (64,))
    np.testing.assert_array_equal(np.asarray(quant.random_bits(stream, (64,))), np.asarray(alone))


def _entry_fusions(f, *args):
  """(shapes of the kernels of the compiled f's entry computation, {fused computation: text})."""
  txt = jax.jit(f).lower(*args).compile().as_text()
  entry = txt[txt.index("ENTRY"):]
  kernels = [(line.split("=")[1].split("fusion(")[0].strip(), line.split("calls=")[1].split(",")[0])
             for line in entry.splitlines() if " fusion(" in line]
  bodies = {name: txt[txt.index(name + " "):].split("\n}\n")[0] for _, name in kernels}
  return [shape for shape, _ in kernels], [bodies[name] for _, name in kernels]


def test_a_derived_keys_bits_are_two_kernels_and_its_signs_one():
  """A GEMM operand's SR bits: the key derivation and the stream words are one scalar kernel
  (before, four: the fold and the words each materialized apart), the bits one per-element kernel
  with the per-element hash only (3 multiplies: the Weyl step and lowbias32's two; the key's
  hashes folded into it would add 10). The RHT signs: one kernel, words and signs together."""
  key = jax.random.key(11)
  shapes, bodies = _entry_fusions(lambda k: _rng.random_bits(_rng.fold_in(k, 5), (4096,)), key)
  assert shapes == ["u32[2]{0}", "u32[4096]{0}"], shapes
  assert bodies[1].count(" multiply(") == 3, bodies[1]
  shapes, _ = _entry_fusions(lambda k: opq.hadamard_signs(k, "dgrad", 32), key)
  assert shapes == ["f32[32]{0}"], shapes
  # the same bits as the contract's (and the eager path's)
  k0, k1 = (int(w) for w in _rng.key_words(_rng.fold_in(key, 5)))
  np.testing.assert_array_equal(
      np.asarray(jax.jit(lambda k: _rng.random_bits(_rng.fold_in(k, 5), (4096,)))(key)),
      _ref_random_bits(k0, k1, 4096))
  signs = np.asarray(jax.jit(lambda k: opq.hadamard_signs(k, "dgrad", 32))(key))
  np.testing.assert_array_equal(signs, np.asarray(opq.hadamard_signs(key, "dgrad", 32)))


def _weak_spots(bits, z=5.5):
  """Failures of 1-bit statistics of a uint32 stream, each against its binomial bound (z standard
  errors): every bit balanced; every bit independent of the same bit of the next element and of
  the element a block (32) and a row (1024) further on; the sign bit of element i and the low
  bit of element i + 1 independent."""
  n = bits.size
  b = [((bits >> np.uint32(i)) & np.uint32(1)).astype(np.int8) for i in range(32)]
  out = []
  for i, bit in enumerate(b):
    if abs(bit.mean() - 0.5) > z * np.sqrt(0.25 / n):
      out.append(f"bit {i} balance {bit.mean():.4f}")
    for lag in (1, 32, 1024):
      same = np.mean(bit[lag:] == bit[:-lag])
      if abs(same - 0.5) > z * np.sqrt(0.25 / (n - lag)):
        out.append(f"bit {i} lag {lag} agreement {same:.4f}")
  same = np.mean(b[31][:-1] == b[0][1:])
  if abs(same - 0.5) > z * np.sqrt(0.25 / (n - 1)):
    out.append(f"sign/low bit agreement {same:.4f}")
  return out


def test_random_bits_pass_bit_balance_and_neighbour_independence():
  """1M elements of three keys' streams (a raw key, a derived key, key(0)'s zero words): no bit
  is biased or predicts its neighbours', within 5.5 binomial standard errors (about 1e-7 per
  check: 200 checks per stream). A weak counter hash fails the same checks: the bare Weyl
  sequence (no finalizer) and one xorshift-multiply round, whose low bits see only low bits."""
  n = 1 << 20
  for key in (jax.random.key(1), _rng.fold_in(jax.random.key(0), 6), jax.random.key(0)):
    bits = np.asarray(quant.random_bits(key, (n,)))
    assert not _weak_spots(bits), _weak_spots(bits)
  a, m = (np.uint64(int(w)) for w in _rng.stream_words(jax.random.key(1)))
  weyl = (np.arange(n, dtype=np.uint64) * m + a) & np.uint64(M32)
  one_round = ((weyl ^ (weyl >> np.uint64(16))) * np.uint64(0x21F0AAAD)) & np.uint64(M32)
  for weak in (weyl, one_round):
    assert _weak_spots(weak.astype(np.uint32))
