"""`jax.random.fold_in` of a Threefry key in plain integer operations: the same bits, no loop.

XLA:CPU lowers each Threefry-2x32 hash of `jax.random.fold_in` to a rolled `while` loop (5 trip
counts of 4 rounds), with its own body, condition and tuple copies to compile; an FP4 train step
derives two such keys per GEMM site (`QuantPolicy.site_key`), and they were about half of the
copies and every while loop but the scans of its compiled program. `fold_in` here computes the
same 20 rounds as straight-line uint32 arithmetic on two scalars (the Threefry-2x32 of Salmon et
al. 2011, as `jax.random`'s unrolled GPU lowering writes it): the key it returns is bit-identical
to `jax.random.fold_in(key, data)`, so every bit drawn from it is unchanged.

Examples:
  >>> import jax
  >>> k = jax.random.key(7)
  >>> mine, theirs = fold_in(k, 12345), jax.random.fold_in(k, 12345)
  >>> bool((jax.random.key_data(mine) == jax.random.key_data(theirs)).all())
  True
  >>> jaxpr = str(jax.make_jaxpr(lambda k: fold_in(k, 3))(k))
  >>> "random_fold_in" in jaxpr, "threefry2x32" in jaxpr, "while" in jaxpr
  (False, False, False)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lpjax.quant.numerics.materialize import materialize, opaque_zero

U32 = jnp.uint32
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))  # Threefry-2x32's rotation constants
_PARITY = 0x1BD11BDA  # the key schedule's third word: k0 ^ k1 ^ this


def _rotl(v, d: int):
  return (v << U32(d)) | (v >> U32(32 - d))


def threefry2x32(k0, k1, x0, x1):
  """Threefry-2x32 (20 rounds) of the counter words (x0, x1) under key words (k0, k1), uint32."""
  ks = (k0, k1, k0 ^ k1 ^ U32(_PARITY))
  x0, x1 = x0 + ks[0], x1 + ks[1]
  for i in range(5):
    for r in _ROTATIONS[i % 2]:
      x0 = x0 + x1
      x1 = x0 ^ _rotl(x1, r)
    x0 = x0 + ks[(i + 1) % 3]
    x1 = x1 + ks[(i + 2) % 3] + U32(i + 1)
  return x0, x1


def is_threefry_key(key) -> bool:
  """True for one typed `jax.random` key of the threefry2x32 implementation (the default)."""
  return (jax.dtypes.issubdtype(getattr(key, "dtype", None), jax.dtypes.prng_key)
          and key.shape == () and str(jax.random.key_impl(key)) == "threefry2x32")


def fold_in(key, data):
  """`jax.random.fold_in(key, data)` for a typed threefry2x32 `key` and an integer `data` (a
  Python int or a traced integer scalar), bit for bit; any other key goes to `jax.random.fold_in`.
  """
  if not is_threefry_key(key):
    return jax.random.fold_in(key, data)
  return jax.random.wrap_key_data(_threefry_words(jax.random.key_data(key), jnp.asarray(data)),
                                  impl="threefry2x32")


def fold_in_each(keys, data) -> list:
  """[`fold_in(k, d)` for each key k of `keys` (one key, or a list of keys) and each integer d of
  `data` (a list of Python ints or traced integer scalars)], bit for bit, as one vectorized hash:
  one set of 20 rounds over vectors, whatever the number of keys.

  Examples:
    >>> import jax
    >>> k = jax.random.key(3)
    >>> each = fold_in_each(k, [5, 6])
    >>> [bool((jax.random.key_data(a) == jax.random.key_data(jax.random.fold_in(k, d))).all())
    ...  for a, d in zip(each, [5, 6])]
    [True, True]
  """
  data = list(data)
  one_key = not isinstance(keys, (list, tuple))
  if not data:
    return []
  words = (jax.random.key_data(keys)[None] if one_key
           else jnp.stack([jax.random.key_data(k) for k in keys]))
  folded = _threefry_words(words, jnp.stack([jnp.asarray(d).astype(U32) for d in data]))
  return [jax.random.wrap_key_data(folded[i], impl="threefry2x32") for i in range(len(data))]


@jax.jit
def _threefry_words(words, data):
  """The new key's two words: Threefry of the counter (0, data) (jax's 32-bit seed of `data`).

  Jitted, so that a model's many derivations reuse one trace; the two words are materialized, so
  that XLA does not fuse these scalar rounds into (and compile them again in) every consumer,
  with an opaque zero from the input words (from the output, the rounds and the division were two
  kernels).
  """
  x0, x1 = threefry2x32(words[..., 0], words[..., 1], U32(0), data.astype(U32))
  out = jnp.stack([x0, x1], axis=-1)
  (out,) = materialize((out,), opaque_zero(words))
  return out
