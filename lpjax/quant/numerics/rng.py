"""Counter-based random bits for stochastic rounding: a hash of (key, element index).

The bits of element i depend only on the key and i's row-major flat index in the array's shape,
never on how the work is split, so a Pallas kernel with any grid reproduces them exactly
(docs/quant.md, "Rounding"). Per element they cost one multiply-xorshift finalizer (`lowbias32`:
two multiplies, three xorshifts) of a Weyl sequence `index * m + a`, whose odd multiplier m and
offset a are derived from the key once (`stream_words`, docs/numerics.md §6 "Random bits"). The keys of a GEMM's
operands and RHT signs are derived from the layer's key with a counter hash too (`fold_in`,
docs/numerics.md §7 "Keys"): a handful of integer operations, where `jax.random.fold_in`'s
Threefry rounds compile to about ten XLA kernels per call, about a fifth of an FP4 train step's
compile time on XLA:CPU.

Examples:
  >>> import jax
  >>> bits = random_bits(jax.random.key(0), (2, 3))
  >>> bits.dtype, bits.shape
  (dtype('uint32'), (2, 3))
  >>> bool((random_bits(jax.random.key(0), (6,)) == bits.reshape(6)).all())
  True
  >>> a, m = stream_words(jax.random.key(0))
  >>> bool((hash_bits(jax.numpy.arange(6, dtype=jax.numpy.uint32), a, m) == bits.reshape(6)).all())
  True
  >>> a, b = (random_bits(fold_in(jax.random.key(0), tag), (8,)) for tag in (1, 2))
  >>> bool((a != b).all())   # another tag, another stream
  True
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lpjax.quant.numerics.materialize import materialize, opaque_zero

U32 = jnp.uint32


def fmix32(h):
  """MurmurHash3's 32-bit finalizer: a bijection with full avalanche."""
  h = h ^ (h >> 16)
  h = h * U32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * U32(0xC2B2AE35)
  return h ^ (h >> 16)


def key_words(key):
  """Two uint32 words from a jax.random key (typed or raw uint32 key data)."""
  if jax.dtypes.issubdtype(getattr(key, "dtype", None), jax.dtypes.prng_key):
    if key.shape != ():
      raise ValueError(f"key must be one jax.random key, got an array of keys of shape {key.shape}; "
                       "pass one (e.g. keys[0]), or jax.vmap over the keys.")
    data = jax.random.key_data(key)
  else:
    data = jnp.asarray(key)
    if data.dtype != jnp.uint32:
      raise TypeError(f"key must be a jax.random key or uint32 key data, got dtype {data.dtype}.")
    if data.ndim != 1 or data.shape[0] < 2:
      raise ValueError(f"raw uint32 key data must have shape (2,) (or (4,) for 'rbg' keys), got "
                       f"{data.shape}; use jax.random.key(seed).")
  data = data.reshape(-1)
  k0 = data[0]
  k1 = data[-1]
  for i in range(1, data.shape[0] - 1):  # keys with more than two words (e.g. rbg)
    k1 = fmix32(k1 ^ data[i])
  return k0, k1


# lowbias32 (C. Wellons' search-optimized 32-bit integer hash, the [16 21f0aaad 15 d35a2d97 15]
# variant): one multiply-xorshift finalizer with full avalanche.
_LOWBIAS_MUL = (0x21F0AAAD, 0xD35A2D97)
# stream_words' salts: the key's words are mixed with them before becoming (a, m).
_OFFSET_SALT = 0x3C6EF372
_MULTIPLIER_SALT = 0xA54FF53A


def lowbias32(h):
  """h ^= h >> 16; h *= 0x21F0AAAD; h ^= h >> 15; h *= 0xD35A2D97; h ^= h >> 15 (uint32): a
  bijection in which every output bit depends on every input bit."""
  h = h ^ (h >> 16)
  h = h * U32(_LOWBIAS_MUL[0])
  h = h ^ (h >> 15)
  h = h * U32(_LOWBIAS_MUL[1])
  return h ^ (h >> 15)


def hash_bits(flat_index, a, m):
  """uint32 random bits of the element at `flat_index` (uint32) for the stream words (a, m) of a
  key (`stream_words`): lowbias32(flat_index * m + a), all arithmetic mod 2**32."""
  return lowbias32(flat_index * m + a)


def stream_words(key, *, materialized: bool = True):
  """The (offset a, odd multiplier m) uint32 words of a key's stream, computed once per key:
  a = fmix32(k0 ^ 0x3C6EF372), m = fmix32(k1 ^ a ^ 0xA54FF53A) | 1 for the key's words (k0, k1)
  (`key_words`). Distinct keys get distinct multipliers, so their streams are different Weyl
  sequences, not shifted copies of one.

  materialized=False leaves the (same) words to XLA's fusion: for a caller that materializes what
  it computes from them (the RHT signs), so that the words and its values are one kernel.
  """
  if isinstance(key, Stream):  # derived already (`derived_streams`)
    return key.words[0], key.words[1]
  k0, k1 = key_words(key)
  words = (_stream_words if materialized else _stream_words_fused)(k0, k1)
  return words[0], words[1]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Stream:
  """The stream of a derived key, its words computed already: `stream_words` and `random_bits`
  take it where they take a key, with the same bits as the key's (`derived_streams`)."""
  words: jax.Array  # uint32[2]: (a, m) of `stream_words`


def derived_streams(key, tags) -> list:
  """[Stream of fold_in(key, t) for each t of `tags`]: the same words as
  `stream_words(fold_in(key, t))`, every tag's fold and words computed as one small kernel (a
  GEMM's backward derives its stochastic operands' streams at once: one kernel, not one each).

  Examples:
    >>> import jax
    >>> k = jax.random.key(4)
    >>> s = derived_streams(k, [1, 5])[1]
    >>> bool((random_bits(s, (8,)) == random_bits(fold_in(k, 5), (8,))).all())
    True
  """
  k0, k1 = key_words(key)
  words = _derived_words(k0, k1, jnp.asarray(list(tags), U32))
  return [Stream(words[i]) for i in range(len(tags))]


@jax.jit
def _derived_words(k0, k1, tags):
  b, a = _fold_words(k0, k1, tags)
  (words,) = materialize((_words(b, a).T,), opaque_zero(k0))  # one (a, m) row per tag
  return words


def _words(k0, k1):
  a = fmix32(k0 ^ U32(_OFFSET_SALT))
  return jnp.stack([a, fmix32(k1 ^ a ^ U32(_MULTIPLIER_SALT)) | U32(1)])


@jax.jit
def _stream_words(k0, k1):
  # Computed once: XLA would otherwise fuse these scalar hashes into every element's bits. The
  # opaque zero comes from the key's word, not the result: the hashes, the stack and the division
  # are then one small kernel (from the result, they were two).
  (words,) = materialize((_words(k0, k1),), opaque_zero(k0))
  return words


_stream_words_fused = jax.jit(_words)


def flat_index(shape):
  """Row-major flat index of every element of `shape`, as uint32 (wraps past 2**32 elements)."""
  index = jnp.zeros(shape, U32)
  stride = 1
  for dim in reversed(range(len(shape))):
    index = index + jax.lax.broadcasted_iota(U32, shape, dim) * U32(stride % 2**32)
    stride *= shape[dim]
  return index


def random_bits(key, shape) -> jax.Array:
  """uint32 random bits of `shape`, a pure function of the key and each element's flat index."""
  shape = tuple(int(d) for d in shape) if isinstance(shape, (tuple, list)) else (int(shape),)
  a, m = stream_words(key)
  return hash_bits(flat_index(shape), a, m)


_TAG_MULTIPLIER = 0x9E3779B1  # odd: distinct tags below 2**32 give distinct words
_TAG_OFFSET = 0x632BE5AB
_WORD_SALT = 0x2545F491


def fold_in(key, data: int):
  """A new key from `key` and the integer `data` (a GEMM or operand tag), by a counter hash:
  t = fmix32(data * 0x9E3779B1 + 0x632BE5AB), a = fmix32(k0 ^ t), b = fmix32(k1 ^ a ^ 0x2545F491)
  for the key's words (k0, k1) (`key_words`); the new key's words are (b, a). Returns a typed
  threefry2x32 key, usable wherever a jax.random key is (`random_bits`, jax.random.*).
  """
  k0, k1 = key_words(key)
  return jax.random.wrap_key_data(_fold_words(k0, k1, jnp.asarray(data, U32)), impl="threefry2x32")


@jax.jit
def _fold_words(k0, k1, tag):
  """fold_in's words; jitted, so that each of a model's many derivations reuses one trace."""
  t = fmix32(tag * U32(_TAG_MULTIPLIER) + U32(_TAG_OFFSET))
  a = fmix32(k0 ^ t)
  b = fmix32(k1 ^ a ^ U32(_WORD_SALT))
  # Not materialized: every consumer of a derived key computes its stream words once
  # (`_stream_words` materializes them), into which XLA fuses these scalar hashes.
  return jnp.stack([b, a])
