"""bfloat16 optimizer state with stochastic rounding."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax

from lpjax import optim
from lpjax.optim import _low_precision_state as low_precision_state


def bf16_neighbours(x):
  """The bfloat16 values just below and above |x| (with x's sign), from numpy bits."""
  bits = np.asarray(x, np.float32).view(np.uint32)
  down = (bits & 0xFFFF0000).view(np.float32)
  up = ((bits & 0xFFFF0000) + 0x10000).view(np.float32)
  exact = (bits & 0xFFFF) == 0
  return down, np.where(exact, down, up)


def test_sr_returns_bf16_neighbours_and_keeps_exact_values():
  x = np.concatenate([
      np.random.default_rng(0).normal(size=1000).astype(np.float32) * 10.0 ** np.arange(
          -20, 20, 0.04, dtype=np.float32)[:1000],
      np.array([0.0, -0.0, 1.0, -2.5, 3.0e38, 1e-40, -3e-40], np.float32),  # incl. subnormals
  ])
  y = np.asarray(optim.stochastic_round_to_bf16(jnp.asarray(x), jax.random.key(1)))
  assert y.dtype == ml_dtypes.bfloat16
  down, up = bf16_neighbours(x)
  y32 = y.astype(np.float32)
  assert np.all((y32.view(np.uint32) == down.view(np.uint32)) |
                (y32.view(np.uint32) == up.view(np.uint32)))
  # Exactly representable values come back unchanged, including the signs of zeros.
  exact = x.astype(ml_dtypes.bfloat16).astype(np.float32) == x
  assert np.array_equal(y32[exact].view(np.uint32), x[exact].view(np.uint32))
  # The subnormals were not flushed to zero.
  assert y32[-2] != 0 and y32[-1] != 0


def test_sr_is_unbiased_and_round_to_nearest_is_not():
  n = 200_000
  x = jnp.full((n,), 1.0 + 2.0**-10 + 2.0**-12, jnp.float32)  # 0.3125 of a bf16 ulp above 1
  y = optim.stochastic_round_to_bf16(x, jax.random.key(0)).astype(jnp.float32)
  ulp = 2.0**-7
  frac = 0.3125
  sigma = ulp * np.sqrt(frac * (1 - frac) / n)
  assert abs(float(y.mean()) - float(x[0])) < 5 * sigma
  # Round to nearest always gives 1.0: an error of 0.31 ulp, about 1000 sigma.
  assert abs(float(x.astype(jnp.bfloat16).astype(jnp.float32).mean()) - float(x[0])) > 100 * sigma
  # Negative values too.
  y_neg = optim.stochastic_round_to_bf16(-x, jax.random.key(1)).astype(jnp.float32)
  assert abs(float(y_neg.mean()) + float(x[0])) < 5 * sigma


def test_sr_keeps_inf_nan_and_depends_on_the_key():
  x = jnp.array([jnp.inf, -jnp.inf, jnp.nan, 1.0 + 2.0**-9], jnp.float32)
  y = optim.stochastic_round_to_bf16(x, jax.random.key(0))
  assert np.isposinf(float(y[0])) and np.isneginf(float(y[1])) and np.isnan(float(y[2]))
  big = jnp.full((4096,), 1.0 + 2.0**-9, jnp.float32)
  a = optim.stochastic_round_to_bf16(big, jax.random.key(0))
  b = optim.stochastic_round_to_bf16(big, jax.random.key(0))
  c = optim.stochastic_round_to_bf16(big, jax.random.key(1))
  assert np.array_equal(np.asarray(a), np.asarray(b))
  assert not np.array_equal(np.asarray(a), np.asarray(c))


def test_sr_ema_tracks_float32_where_round_to_nearest_stagnates():
  """The second-moment EMA of Adam (b2 = 0.999) stored in bf16, 3000 steps."""
  b2, steps, width = 0.999, 3000, 256
  exact = 1 - 0.5 * b2**steps

  def body(carry, t):
    rtn, sr = carry
    rtn = (b2 * rtn.astype(jnp.float32) + (1 - b2)).astype(jnp.bfloat16)
    key = low_precision_state.step_key(0, t)
    sr = low_precision_state.store(b2 * sr.astype(jnp.float32) + (1 - b2), jnp.bfloat16, key)
    return (rtn, sr), None

  init = jnp.full((width,), 0.5, jnp.bfloat16)
  (rtn, sr), _ = jax.lax.scan(body, (init, init), jnp.arange(steps))
  assert float(rtn.astype(jnp.float32).mean()) == 0.5  # stuck: each increment < half an ulp
  assert abs(float(sr.astype(jnp.float32).mean()) - exact) < 0.01


def test_stable_spam_bf16_state_halves_memory_and_tracks_fp32_state():
  params = {"w": jax.random.normal(jax.random.key(0), (64, 32)), "b": jnp.zeros(32)}
  target = jax.tree.map(lambda p: jnp.full_like(p, 0.3), params)
  loss = lambda p: sum(jnp.sum((a - b) ** 2) for a, b in
                       zip(jax.tree.leaves(p), jax.tree.leaves(target)))

  def train(tx, steps=150):
    @jax.jit
    def step(p, s):
      updates, s = tx.update(jax.grad(loss)(p), s, p)
      return optax.apply_updates(p, updates), s
    p, s = params, tx.init(params)
    for _ in range(steps):
      p, s = step(p, s)
    return p, s

  p32, s32 = train(optim.stable_spam(5e-2, reset_interval=60))
  p16, s16 = train(optim.stable_spam(5e-2, reset_interval=60, mu_dtype=jnp.bfloat16,
                                     nu_dtype=jnp.bfloat16, seed=3))
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves((s16[0].mu, s16[0].nu)))
  nbytes = lambda t: sum(x.nbytes for x in jax.tree.leaves(t))
  assert nbytes((s16[0].mu, s16[0].nu)) * 2 == nbytes((s32[0].mu, s32[0].nu))
  # Both converge (from a loss of ~2300) and stay within one step size (lr) of each other.
  assert float(loss(p16)) < 1e-4 * float(loss(params))
  assert float(loss(p32)) < 1e-4 * float(loss(params))
  diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
             zip(jax.tree.leaves(p16), jax.tree.leaves(p32)))
  assert diff < 5e-2


def _numpy_bits(key_words, shape):
  """The hash of random_bits re-derived in numpy (uint64 arithmetic, reduced mod 2**32)."""
  def avalanche(h):
    h = h ^ (h >> 16)
    h = (h * 0x21F0AAAD) & 0xFFFFFFFF
    h = h ^ (h >> 15)
    h = (h * 0xD35A2D97) & 0xFFFFFFFF
    return h ^ (h >> 15)
  k0, k1 = (int(w) for w in key_words)
  index = np.arange(int(np.prod(shape)), dtype=np.uint64).reshape(shape)
  return avalanche(avalanche((index + k0) & 0xFFFFFFFF) ^ k1).astype(np.uint32)


def test_random_bits_are_the_hash_of_key_and_flat_index():
  key = jax.random.fold_in(jax.random.key(3), 7)
  words = np.asarray(jax.random.key_data(key))
  got = np.asarray(low_precision_state.random_bits(key, (3, 5, 7)))
  np.testing.assert_array_equal(got, _numpy_bits(words, (3, 5, 7)))
  # raw uint32 key data gives the same bits as the typed key
  np.testing.assert_array_equal(got, np.asarray(low_precision_state.random_bits(
      jnp.asarray(words), (3, 5, 7))))


def test_random_bits_are_uniform_and_independent_of_the_neighbours():
  bits = np.asarray(low_precision_state.random_bits(jax.random.key(11), (1 << 18,)))
  high, low = (bits >> 16).astype(np.float64), (bits & 0xFFFF).astype(np.float64)
  n = bits.size
  # each of the 32 bits is set half the time (5 sigma of a binomial)
  ones = np.array([((bits >> i) & 1).mean() for i in range(32)])
  assert np.all(np.abs(ones - 0.5) < 5 * 0.5 / np.sqrt(n)), ones
  # the two 16-bit halves (first / second moment) and neighbouring elements are uncorrelated
  for a, b in ((high, low), (high[:-1], high[1:]), (low[:-1], low[1:])):
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / np.sqrt(n)
  # 256 equal bins of the top byte: chi-square with 255 degrees of freedom, far tail at 400
  counts = np.bincount((bits >> 24).astype(np.int64), minlength=256)
  assert ((counts - n / 256) ** 2 / (n / 256)).sum() < 400


def test_random_bits_do_not_depend_on_the_sharding():
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(8), ("x",))
  x = jnp.full((64, 40), 1.0 + 2.0**-9, jnp.float32)
  key = jax.random.key(5)
  single = low_precision_state.stochastic_round_to_bf16(x, key)
  sharded = jax.jit(low_precision_state.stochastic_round_to_bf16)(
      jax.device_put(x, NamedSharding(mesh, P("x"))), key)
  np.testing.assert_array_equal(np.asarray(single), np.asarray(sharded))


def test_bf16_moments_need_no_state_sized_random_array():
  """The SR bits fuse into the update. A bf16-state Stable-SPAM step on a 4M-element tensor keeps
  4 bytes per element of temporaries (the clipped float32 gradient, between its max and norm
  reductions); with jax.random.bits, whose CPU loop materializes uint32 bits and the float32
  moments they round, it kept 20."""
  n = 1 << 22
  tx = optim.stable_spam(learning_rate=1e-3, mu_dtype=jnp.bfloat16, nu_dtype=jnp.bfloat16)
  params = jax.ShapeDtypeStruct((n,), jnp.float32)
  state = jax.eval_shape(tx.init, params)
  compiled = jax.jit(tx.update).lower(params, state, params).compile()
  # XLA:CPU's buffer plan differs between releases: jax 0.10 keeps 4 bytes per element, jax 0.12.1
  # 8 (two float32 temporaries) + 512 bytes; both far below the 20 of materialized random bits
  per_element = 8 if tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 11) else 12
  assert compiled.memory_analysis().temp_size_in_bytes < per_element * n
