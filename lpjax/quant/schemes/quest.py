"""QuEST, the forward quantizer of Quartet: MXFP4 with an RMS-based scale and a trust mask.

Quartet (Castro et al. 2025, arXiv 2505.14669, §4; IST-DASLab/Quartet
`src/models/quantization/quantizers/mxfp4_triton.py`, `quest=True`) quantizes each forward
operand after a Hadamard-32 transform (no random signs) with a scale set by the block's standard
deviation, not its amax, so a few outliers clip instead of coarsening the whole block; the
backward passes gradient only where the element was not clipped (the "trust mask") and undoes
the transform. docs/numerics.md §7b gives the exact float32 operations:

    std   = sqrt(max(tree(x^2) / 32 - (tree(x) / 32)^2, 0))      per block of 32
    e     = 2^floor(log2(float32(2.92247856 / 6) * std + float32(1e-8)))   (an E8M0 scale)
    t     = x / e;  q = round(t) onto e2m1, ties toward zero, clipped to +-6
    value = q * e;  trust mask = |t| < 6

Examples:
  >>> import jax.numpy as jnp
  >>> x = jnp.array([[0.1, -0.2, 0.3, 9.0] * 8])
  >>> v, mask = quest(x, 32)
  >>> v[0, :4].tolist(), mask[0, :4].tolist()   # std 3.87: e = 1, the 9.0 outlier clips to 6
  ([0.0, -0.0, 0.5, 6.0], [True, True, True, False])
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.quant.schemes.nvfp4 import round_e2m1, tree_sum

F32 = jnp.float32
GAUSSIAN_SCALE = np.float32(2.92247856 / 6.0)  # Quartet: the MSE-optimal RMS multiple for e2m1
EPS = np.float32(1e-8)


def quest(x, group: int = 32):
  """(values, trust mask) of QuEST along the last axis (a multiple of `group`), x rotated already.

  Args:
    x: float array, its last axis a multiple of `group`.
    group: elements per scale (MXFP4: 32).

  Returns:
    float32 values and a bool mask (True where |x / e| < 6, i.e. not clipped), both x's shape.
  """
  x = jnp.asarray(x, F32)
  if x.shape[-1] % group:
    raise ValueError(f"QuEST needs the last axis ({x.shape[-1]}) to be a multiple of {group}.")
  g = x.reshape(x.shape[:-1] + (x.shape[-1] // group, group))
  inv = F32(1.0 / group)  # a power of two: exact
  mean_sq = tree_sum(g * g) * inv
  mean = tree_sum(g) * inv
  std = jnp.sqrt(jnp.maximum(mean_sq - mean * mean, F32(0)))
  scale = GAUSSIAN_SCALE * std + EPS
  bits = jax.lax.bitcast_convert_type(scale, jnp.uint32) & jnp.uint32(0x7F800000)
  e = jax.lax.bitcast_convert_type(bits, F32)[..., None]  # 2^floor(log2 scale): scale >= 1e-8 is normal
  t = g / e
  return (round_e2m1(t, "nearest_toward_zero") * e).reshape(x.shape), (jnp.abs(t) < 6).reshape(x.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def quest_with_mask(x, group: int = 32):
  """`quest(x, group)` with a straight-through gradient for its values (the trust mask is the
  backward's business): the values and the mask of one QuEST pass, so that a GEMM's backward
  takes both the forward's Q(X) and its trust mask from one computation (bit for bit `quest`).

  Examples:
    >>> import jax.numpy as jnp
    >>> x = jnp.array([[0.1, -0.2, 0.3, 9.0] * 8])
    >>> [bool((a == b).all()) for a, b in zip(quest_with_mask(x, 32), quest(x, 32))]
    [True, True]
  """
  return quest(x, group)


def _quest_with_mask_fwd(x, group):
  return quest(x, group), jnp.zeros((), jnp.asarray(x).dtype)


def _quest_with_mask_bwd(group, like, g):
  return (g[0].astype(like.dtype),)


quest_with_mask.defvjp(_quest_with_mask_fwd, _quest_with_mask_bwd)
