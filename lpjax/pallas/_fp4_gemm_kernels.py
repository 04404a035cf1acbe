"""The Pallas kernel bodies of the FP4 GEMM (lpjax/pallas/_fp4_gemm.py): the in-kernel unpacking of
E2M1 codes to the integers 2 * value, the exact per-block partial sums on integer (or bf16 / e4m3)
tensor cores, the scale bytes as float32 factors, and the block loop that accumulates in float32.

Everything here runs inside `pallas_call` (Triton on a GPU, interpret mode elsewhere); the host
side (tiling, padding, sharding, dimension numbers) is in _fp4_gemm.py.

Examples:
  >>> import jax.numpy as jnp
  >>> e2m1_times_two(jnp.arange(16, dtype=jnp.uint32)).tolist()   # codes 0..15
  [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

U32 = jnp.uint32
I32 = jnp.int32
F32 = jnp.float32
FLT_MAX = float(np.finfo(np.float32).max)


def e2m1_times_two(nibbles):
  """uint32 E2M1 codes (0..15) -> int32 2 * value, in [-12, 12] (codes 0..7: 0,1,2,3,4,6,8,12)."""
  code = nibbles.astype(I32)
  mag = code & 7
  big = (2 + (mag & 1)) << jnp.maximum((mag >> 1) - 1, 0)  # 4, 6, 8, 12 for mag = 4..7
  v = jnp.where(mag < 4, mag, big)
  return jnp.where(code >= 8, -v, v)


def unpack_block(packed):
  """(rows, block / 2) packed bytes -> (rows, block) int32 2*E2M1 values in element order."""
  rows, nbytes = packed.shape
  pairs = jnp.broadcast_to(packed.astype(U32)[:, :, None], (rows, nbytes, 2))
  shift = jax.lax.broadcasted_iota(U32, (rows, nbytes, 2), 2) * U32(4)
  return e2m1_times_two(((pairs >> shift) & U32(0xF)).reshape(rows, 2 * nbytes))


def block_dot(a_packed, b_packed, dot_dtype: str):
  """The exact int32 partial sum P (rows_a, rows_b) of one scale block of each operand."""
  a, b = unpack_block(a_packed), unpack_block(b_packed)
  if dot_dtype == "int8":
    return jax.lax.dot_general(a.astype(jnp.int8), b.astype(jnp.int8), (((1,), (1,)), ((), ())),
                               preferred_element_type=I32)
  dtype = jnp.dtype(dot_dtype)  # bf16 / e4m3 hold the integers 0..12 exactly
  p = jax.lax.dot_general(a.astype(F32).astype(dtype), b.astype(F32).astype(dtype),
                          (((1,), (1,)), ((), ())), preferred_element_type=F32)
  return p.astype(I32)  # an integer below 2^13: exact in float32


def _pow2(e):
  """2^e in float32 for int32 e, built from bits: normal, subnormal, or 0 below 2^-149."""
  normal = (jnp.maximum(e, -126) + 127) << 23
  sub = jnp.where(e >= -149, I32(1) << jnp.clip(e + 149, 0, 22), 0)
  return jax.lax.bitcast_convert_type(jnp.where(e >= -126, normal, sub), F32)


def scale_factor(scale_bytes, scale: str):
  """Scale bytes -> float32 s / 2 (two of them make the 1/4 of (2a)(2b)); NaN for a NaN byte.

  Normal for every E8M0 byte >= 1 and every UE4M3 byte, so the outer product of two factors is
  exact wherever it is a normal float32 number.
  """
  b = scale_bytes.astype(I32)
  shift = 1
  if scale == "e8m0":
    f = _pow2(b - 127 - shift)
    return jnp.where(b == 255, F32(jnp.nan), f)
  exp, man = (b >> 3) & 15, b & 7  # ue4m3: (8 + m) 2^(e - 10), subnormal m 2^-9
  normal = jax.lax.bitcast_convert_type(((exp - 7 - shift + 127) << 23) | (man << 20), F32)
  sub = man.astype(F32) * F32(2.0 ** (-9 - shift))
  f = jnp.where(exp == 0, sub, normal)
  return jnp.where((b & 0x7F) == 0x7F, F32(jnp.nan), f)


def gemm_kernel(g_ref, a_ref, sa_ref, b_ref, sbt_ref, out_ref, *, n_blocks, block, scale,
                 dot_dtype, tensor_scale):
  nbytes = block // 2
  tm, tn = out_ref.shape

  def body(j, acc):
    p = block_dot(a_ref[:, pl.ds(j * nbytes, nbytes)], b_ref[:, pl.ds(j * nbytes, nbytes)],
                  dot_dtype)
    fa = scale_factor(sa_ref[:, pl.ds(j, 1)], scale)  # (tm, 1)
    fb = scale_factor(sbt_ref[pl.ds(j, 1), :], scale)  # (1, tn)
    # s_a s_b / 4, exact; past FLT_MAX every non-zero block product overflows anyway, and the cap
    # keeps a zero one zero (0 x inf would be NaN).
    fab = jnp.minimum(fa * fb, F32(FLT_MAX))
    return acc + p.astype(F32) * fab  # an exact product (module docstring)

  acc = jax.lax.fori_loop(0, n_blocks, body, jnp.zeros((tm, tn), F32))
  if tensor_scale:
    acc = acc * g_ref[...]
  out_ref[...] = acc.astype(out_ref.dtype)


def partials_kernel(a_ref, b_ref, out_ref, *, dot_dtype):
  out_ref[...] = block_dot(a_ref[...], b_ref[...], dot_dtype)
