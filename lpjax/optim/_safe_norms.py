"""Norms and thresholds of the optimizers without float32 overflow (docs/reliability.md).

A finite gradient can still have a norm above the largest float (|g| > 1.8e19 already squares to
inf in float32), and its statistics (``||g||^2``, ``theta * v``) overflow even sooner. These
helpers compute the same bits as the plain formulas wherever those are finite, and finite values
where they are not:

* `scaled_norm` scales the tensor by an exact power of two before squaring (so the rounding of
  every square and partial sum is the plain formula's, shifted), and returns the scaled norm
  beside the true one, so that ``g / ||g||`` never divides by inf;
* `saturate` clamps a statistic's input at `stat_limit`, the largest value whose square is
  finite (``2**64 (1 - 2**-23)`` in float32), so EMAs of norms and second moments stay finite;
  below it (where the plain formulas are finite) it changes nothing.

Examples:
  >>> import jax.numpy as jnp
  >>> g = jnp.array([3e30, 4e30], jnp.float32)
  >>> float(jnp.sqrt(jnp.sum(jnp.square(g))))  # the plain norm overflows
  inf
  >>> norm, scaled, down = scaled_norm(g)
  >>> round(float(norm) / 5e30, 6), [round(float(u), 6) for u in g * down / scaled]
  (1.0, [0.6, 0.8])
"""

from __future__ import annotations

import jax.numpy as jnp

_SCALE_EXPONENT_LIMIT = 100  # 2**+-100 is a normal float32 and float64: the scaling is exact


def power_of_two(exponent, dtype):
  """2**exponent in `dtype`, exactly (an integer exponent within the normal range)."""
  return jnp.ldexp(jnp.ones([], dtype), exponent.astype(jnp.int32))


def scaled_norm(x, x_max=None):
  """(||x||, ||x|| * 2**-e, 2**-e) with 2**e about max|x|: the norm may be inf (a true norm above
  the largest float), the scaled norm is finite; ``x * 2**-e / scaled`` is ``x / ||x||`` exactly
  wherever the latter is finite. `x_max`: max|x| if known (an upper bound works too)."""
  if x_max is None:
    x_max = jnp.max(jnp.abs(x), initial=0)
  exponent = jnp.clip(jnp.frexp(x_max)[1], -_SCALE_EXPONENT_LIMIT, _SCALE_EXPONENT_LIMIT)
  down = power_of_two(-exponent, x.dtype)
  scaled = jnp.sqrt(jnp.sum(jnp.square(x * down)))
  return scaled * power_of_two(exponent, x.dtype), scaled, down


def stat_limit(dtype) -> float:
  """The largest power-of-two-grid value of `dtype` whose square is finite: 2**(maxexp / 2) times
  (1 - eps) (float32: 2**64 - 2**41, squaring to below FLT_MAX)."""
  info = jnp.finfo(dtype)
  return float(2.0 ** (info.maxexp // 2) * (1 - float(info.eps)))


def saturate(x):
  """x clamped to +-`stat_limit`: the input of a statistic whose square must stay finite."""
  limit = stat_limit(x.dtype)
  return jnp.clip(x, -limit, limit)


def finite_max(dtype):
  return jnp.finfo(dtype).max
