"""Optimizer state stored in bfloat16 with stochastic rounding.

Adam-type moments kept in bfloat16 with round-to-nearest stagnate: with b2 = 0.999 the
update ``0.999 v + 0.001 g^2`` usually rounds back to ``v``. Stochastic rounding (SR) keeps the
stored value unbiased, ``E[store(x)] = x``, so the moments track their float32 values on average
while taking half the memory. The random bits are a hash of a ``jax.random`` key derived from
``(seed, step)`` and of each element's index (:func:`random_bits`), so a run is reproducible and
resuming from a checkpoint replays the same bits. Being elementwise, the hash fuses into the
update: no uint32 array the size of the state is ever materialized (``jax.random.bits`` runs a
loop on CPU whose outputs are, half a GiB per device for the 1B config's layer stacks).

The rounding is done with integer operations on the float32 bits (add 16 random bits below the
bfloat16 mantissa, then truncate), the same add-and-truncate convention as docs/numerics.md §6.
"""

from typing import Any

import jax
import jax.numpy as jnp

_LOW_HALF = 16  # float32 has 16 more mantissa bits than bfloat16


def float_dtype(dtype) -> jnp.dtype:
  """`dtype` if it is floating, else float32: integer params get float moments and float updates
  (as optax.adam gives them), not ones truncated to zero."""
  return jnp.dtype(dtype) if jnp.issubdtype(dtype, jnp.inexact) else jnp.dtype(jnp.float32)


def zero_moments(params, dtype=None):
  """Zeros shaped like `params`, in `dtype` (None: each param's `float_dtype`)."""
  return jax.tree.map(
      lambda p: jnp.zeros(jnp.shape(p), float_dtype(p.dtype) if dtype is None else dtype), params)


def _avalanche(h: jax.Array) -> jax.Array:
  """A bijection of uint32 in which every output bit depends on every input bit (xorshift-multiply
  rounds with the constants of Wellons' "lowbias32", a search-optimized 32-bit integer hash)."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x21F0AAAD)
  h = h ^ (h >> 15)
  h = h * jnp.uint32(0xD35A2D97)
  return h ^ (h >> 15)


def random_bits(key: jax.Array, shape) -> jax.Array:
  """uint32 bits for every element of ``shape``: a hash of ``key`` and the element's row-major
  index, so the bits do not depend on how an array is sharded or fused, and XLA computes them
  inside the fusion that uses them.

  Args:
    key: a ``jax.random`` key (typed, or raw uint32 key data).
    shape: the array's shape.

  Returns:
    A uint32 array of ``shape``.

  Examples:
    >>> import jax
    >>> from lpjax.optim._low_precision_state import random_bits
    >>> a = random_bits(jax.random.key(0), (2, 3))
    >>> bool((a.reshape(6) == random_bits(jax.random.key(0), (6,))).all())
    True
    >>> bool((a == random_bits(jax.random.key(1), (2, 3))).any())
    False
  """
  typed = jax.dtypes.issubdtype(getattr(key, "dtype", None), jax.dtypes.prng_key)
  data = jax.random.key_data(key) if typed else key
  words = jnp.asarray(data, jnp.uint32).reshape(-1)
  k0, k1 = words[0], words[-1]
  for w in words[1:-1]:  # keys of more than two words (rbg) fold the middle ones in
    k1 = _avalanche(k1 ^ w)
  shape = tuple(int(d) for d in shape)
  index = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for dim in reversed(range(len(shape))):  # row-major flat index (wraps past 2**32 elements)
    index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, dim) * jnp.uint32(stride % 2**32)
    stride *= shape[dim]
  return _avalanche(_avalanche(index + k0) ^ k1)


def stochastic_round_to_bf16(x: jax.Array, key: jax.Array) -> jax.Array:
  """Rounds ``x`` to bfloat16, up with probability equal to the discarded fraction of an ulp.

  Args:
    x: a float array; float64 is first rounded to float32 (to nearest).
    key: a ``jax.random`` key.

  Returns:
    A bfloat16 array of ``x``'s shape. Each element is one of the two bfloat16 neighbours of
    ``x`` (exact values stay exact), chosen so that the expectation equals ``x``. NaN and
    +-inf are kept; a finite value within one bfloat16 ulp of float32 max may round to inf.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from lpjax.optim import stochastic_round_to_bf16
    >>> x = jnp.full((10000,), 1.0 + 2.0**-9)  # a quarter of the way from 1 to the next bf16
    >>> y = stochastic_round_to_bf16(x, jax.random.key(0))
    >>> y.dtype, sorted(set(y.astype(float).tolist()))
    (dtype(bfloat16), [1.0, 1.0078125])
    >>> bool(abs(y.astype(jnp.float32).mean() - x.mean()) < 2e-4)
    True
  """
  x = jnp.asarray(x)
  noise = random_bits(key, x.shape) >> _LOW_HALF  # uniform in [0, 2^16)
  return round_with_noise(x, noise)


def round_with_noise(x: jax.Array, noise: jax.Array) -> jax.Array:
  """SR of ``x`` to bfloat16 with ``noise``: uint32 values uniform in [0, 2^16)."""
  x32 = x.astype(jnp.float32)
  bits = jax.lax.bitcast_convert_type(x32, jnp.uint32)
  # Sign-magnitude: adding to the magnitude bits rounds |x| up with probability frac, then
  # truncating keeps the high half. Integer ops keep subnormals exact on every backend.
  high = ((bits + noise) >> _LOW_HALF).astype(jnp.uint16)
  rounded = jax.lax.bitcast_convert_type(high, jnp.bfloat16)
  # Inf/NaN bit patterns must not be perturbed (inf + noise would become NaN).
  return jnp.where(jnp.isfinite(x32), rounded, x32.astype(jnp.bfloat16))


def store(x: jax.Array, dtype: Any, key: jax.Array) -> jax.Array:
  """Casts a freshly computed state value to its storage dtype.

  Narrowing float32/float64 to bfloat16 uses :func:`stochastic_round_to_bf16`; every other cast
  is a plain ``astype``.

  Args:
    x: the value in its computation dtype.
    dtype: the storage dtype.
    key: a ``jax.random`` key (only used for bfloat16 storage).

  Returns:
    ``x`` in ``dtype``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from lpjax.optim._low_precision_state import store
    >>> store(jnp.ones(3), jnp.bfloat16, jax.random.key(0)).dtype
    dtype(bfloat16)
    >>> store(jnp.ones(3), jnp.float32, jax.random.key(0)).dtype
    dtype('float32')
  """
  if _is_sr(x, dtype):
    return stochastic_round_to_bf16(x, key)
  return x.astype(dtype)


def _is_sr(x: jax.Array, dtype: Any) -> bool:
  return jnp.dtype(dtype) == jnp.bfloat16 and jnp.dtype(x.dtype) in (jnp.float32, jnp.float64)


def store_moments(
    firsts: list[jax.Array],
    seconds: list[jax.Array],
    first_dtypes: list[Any],
    second_dtypes: list[Any],
    key: jax.Array,
) -> tuple[list[jax.Array], list[jax.Array]]:
  """Stores the two moments of every tensor, as :func:`store` does, from one draw per tensor.

  Where both moments of a tensor are rounded stochastically, one 32-bit draw gives 16 bits to
  each (the high half to the first moment, the low half to the second): half the random
  numbers of two :func:`store` calls, and half the compile time on CPU.

  Args:
    firsts: the first moments of the tensors, in their computation dtype.
    seconds: the second moments, the same shapes.
    first_dtypes: storage dtypes of ``firsts``.
    second_dtypes: storage dtypes of ``seconds``.
    key: the step's key (:func:`step_key`); tensor ``i`` uses ``fold_in(key, i)``.

  Returns:
    The two lists, cast to their storage dtypes.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from lpjax.optim._low_precision_state import store_moments
    >>> m, v = store_moments([jnp.ones(2)], [jnp.ones(2)], [jnp.bfloat16], [jnp.float32],
    ...                      jax.random.key(0))
    >>> m[0].dtype, v[0].dtype
    (dtype(bfloat16), dtype('float32'))
  """
  new_firsts, new_seconds = [], []
  for i, (m, v, m_dtype, v_dtype) in enumerate(
      zip(firsts, seconds, first_dtypes, second_dtypes)):
    # fold_in per tensor: cheaper to compile than one split into many keys
    m, v = store_pair(m, v, m_dtype, v_dtype, jax.random.fold_in(key, i))
    new_firsts.append(m)
    new_seconds.append(v)
  return new_firsts, new_seconds


def store_pair(m: jax.Array, v: jax.Array, m_dtype: Any, v_dtype: Any,
               key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The two moments of one tensor, stored as :func:`store_moments` stores tensor ``i`` when
  given ``key = fold_in(step_key, i)``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from lpjax.optim._low_precision_state import store_pair
    >>> m, v = store_pair(jnp.ones(2), jnp.ones(2), jnp.bfloat16, jnp.bfloat16, jax.random.key(0))
    >>> m.dtype, v.dtype
    (dtype(bfloat16), dtype(bfloat16))
  """
  if _is_sr(m, m_dtype) and _is_sr(v, v_dtype) and m.shape == v.shape:
    bits = random_bits(key, m.shape)
    return round_with_noise(m, bits >> _LOW_HALF), round_with_noise(v, bits & 0xFFFF)
  if not (_is_sr(m, m_dtype) or _is_sr(v, v_dtype)):
    return m.astype(m_dtype), v.astype(v_dtype)
  return store(m, m_dtype, jax.random.fold_in(key, 0)), store(v, v_dtype, jax.random.fold_in(key, 1))


def step_key(seed: jax.typing.ArrayLike, count: jax.Array) -> jax.Array:
  """The key of one optimizer step: ``fold_in(key(seed), count)``.

  Args:
    seed: an integer seed (a Python int or an integer array, e.g. injected by
      ``optax.inject_hyperparams``).
    count: the step number.

  Returns:
    A ``jax.random`` key, the same for the same ``(seed, count)``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from lpjax.optim._low_precision_state import step_key
    >>> step_key(0, jnp.int32(3)).shape
    ()
  """
  return jax.random.fold_in(jax.random.key(jnp.asarray(seed, jnp.uint32)), count)
