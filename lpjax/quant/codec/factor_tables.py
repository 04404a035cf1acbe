"""The fast path's per-group factors, looked up by scale byte: one gather per quantizer.

Once a group's scale byte is known (e8m0: k + 127; ue4m3: s_b; 0xFF / 0x7F for a group holding a
NaN or Inf), everything the element pass needs from the group is a function of that byte and of
per-tensor values: the encode factors (s, s_sub), the decode factors (m_c, shift) and the NaN
masks (keep, nan) of `fast_elements` / `group_codec._fast_elements`. So they are computed once
per tensor for all 256 bytes (a table of `COLUMNS` words per byte) and each group gathers its row.

The gather is the only per-group pass between the amax reduction and the element pass: it takes the
place of the chain of per-group arrays (amax, s_b, S_enc_b, the multiplier, each factor) that
`materialize` kept out of the element loop, with its conditional and one pass over the groups for
each of them. A gather is never duplicated into its consumers by XLA's fusion (it is "expensive"),
so it needs no `materialize` either. The rows are the same functions (`encode_factors`,
`decode_factors`, the NVFP4 tail of `scales_fast`) applied to the bytes, so the bits are those of
the per-group computation they replace.

Examples:
  >>> import jax.numpy as jnp
  >>> rows = e8m0_rows()                                   # k = byte - 127
  >>> rows.shape, hex(int(rows[127 + 2, S])), hex(int(rows[127 - 2, M_C]))  # 2**-2, 2**-2
  ((256, 6), '0x3e800000', '0x3e800000')
  >>> int(rows[255, KEEP]), hex(int(rows[255, NAN]))       # the NaN byte masks the group
  (0, '0x7fc00000')
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.quant.codec import fast_elements as fast
from lpjax.quant.codec import scales_exact as sc
from lpjax.quant.codec import scales_fast as fast_scales
from lpjax.quant.numerics import fp32_bits as fb
from lpjax.quant.numerics.materialize import materialize, opaque_zero

U32 = jnp.uint32

# Columns of a row (uint32 words): encode factors, decode factors, NaN-group masks.
S, S_SUB, M_C, SHIFT, KEEP, NAN = range(6)
COLUMNS = 6
_BYTES = 256


def _rows(s_bits, m_bits, bad):
  """(256, COLUMNS) uint32 rows from per-byte encode / decode multiplier bits and NaN flags."""
  s, s_sub = fast.encode_factors(s_bits)
  m_c, shift = fast.decode_factors(m_bits)
  keep = jnp.where(bad, U32(0), U32(0xFFFFFFFF))
  nan = jnp.where(bad, U32(sc.F32_NAN_BITS), U32(0))
  return jnp.stack([fb.to_bits(s), fb.to_bits(s_sub), fb.to_bits(m_c), shift, keep,
                    nan], axis=-1)


def _e8m0_rows_of(byte):
  """`_rows` of e8m0 bytes (int32): k = byte - 127, 0xFF the NaN group."""
  k = jnp.minimum(byte, 254) - 127
  return _rows(fast.pow2_bits(-k), fast.pow2_bits(k), byte == sc.E8M0_NAN)


def _ue4m3_unit_rows_of(byte):
  """`_rows` of ue4m3 bytes (uint32) without a tensor scale (S_enc = 1), 0x7F the NaN group."""
  s_b_val = fb.from_bits(sc.decode_bits(byte & U32(0x7F), "e4m3"))
  one = U32(sc.f32_const_bits(1.0))
  return _rows(*fast_scales._float_tail(s_b_val, one, U32(0), False), byte == sc.UE4M3_NAN)


def _table(rows_of, dtype) -> np.ndarray:
  """The rows of all 256 bytes as numpy, from one jitted call with the bytes as its argument (not
  a constant XLA could fold at compile time): one compile per process, where evaluating the ~26
  operations eagerly compiled and dispatched each of them (about 2 s of a process's first trace).
  The same bits: every operation is the same XLA:CPU kernel arithmetic (tests/quant/codec pin
  them against the eager evaluation)."""
  byte = np.arange(_BYTES, dtype=dtype)
  # lowered and run now, also when first needed inside a trace (a compiled program runs at once)
  return np.asarray(jax.jit(rows_of).lower(byte).compile()(byte))


@functools.lru_cache(maxsize=None)
def _e8m0_table() -> np.ndarray:
  return _table(_e8m0_rows_of, np.int32)  # once per process: every later trace reuses it


def e8m0_rows():
  """Rows of every e8m0 byte (k = byte - 127; 0xFF is the NaN group), a compile-time constant."""
  return jnp.asarray(_e8m0_table())


@functools.lru_cache(maxsize=None)
def _ue4m3_unit_table() -> np.ndarray:
  return _table(_ue4m3_unit_rows_of, np.uint32)  # once per process, as `_e8m0_table`


def ue4m3_rows(s_enc_bits, amax_t_bits, use_tensor_scale: bool, scale_bytes=None):
  """Rows of every ue4m3 byte s_b for this tensor (0x7F is the NaN group): S_enc_b and the decode
  multiplier of a block with that byte (`scales_fast`, module docstring).

  With a tensor scale they are the exact tail's tables (`scales_fast._tail_tables`, the same bits
  as the float tail wherever that one is exact), computed in the taken branch of a `lax.cond`
  whose predicate is always true but opaque to XLA: XLA keeps a conditional's results as buffers,
  while a gather's operands would otherwise be fused into the gather and recomputed for every word
  it reads. `scale_bytes` (a function of no arguments giving the per-group bytes) is evaluated in
  that branch for the same reason, and returned as the second result. One branch of real work per
  call (not a float and an exact one): an nvfp4 fake_quant compiles to ~16% fewer instructions,
  and a model with a tensor scale per operand traces and compiles one table builder per operand.
  Without a tensor scale (S_enc = 1) the rows are a compile-time constant.
  """
  if not use_tensor_scale:
    rows = jnp.asarray(_ue4m3_unit_table())
    return rows, None if scale_bytes is None else scale_bytes()
  amax_t_bits = jnp.reshape(amax_t_bits, ()).astype(U32)
  s_enc_bits = jnp.reshape(s_enc_bits, ()).astype(U32)
  per_group = (lambda: scale_bytes()) if scale_bytes is not None else (lambda: None)
  traced = []  # the taken branch's per-group results, seen as `cond` traces it (first)

  def exact_rows(s, a):
    byte = jnp.arange(_BYTES, dtype=U32)
    rows = _rows(*fast_scales._tail_tables(s, a), byte == sc.UE4M3_NAN)
    traced.append(per_group())
    return rows, traced[-1]

  def never(s, a):  # the branch never taken: zeros of the results' shapes (from the taken
    # branch's trace: tracing `scale_bytes` again only for its shapes doubled its trace time)
    shapes = traced[-1] if traced else jax.eval_shape(per_group)
    zeros = jax.tree.map(lambda t: jnp.zeros(t.shape, t.dtype), shapes)
    return jnp.zeros((_BYTES, COLUMNS), U32), zeros

  return jax.lax.cond(opaque_zero(amax_t_bits) == 0, exact_rows, never, s_enc_bits, amax_t_bits)


def look_up(rows, scale_byte):
  """Each group's row: (..., COLUMNS) for per-group scale bytes (keepdims shape)."""
  index = (scale_byte.astype(U32) & U32(_BYTES - 1)).astype(jnp.int32)
  return rows.at[index].get(mode="promise_in_bounds")


def column(looked_up, j, dtype=U32):
  """Column j of the looked-up rows, per group (keepdims), as uint32 or float32 bits."""
  word = looked_up[..., j]
  return fb.from_bits(word) if dtype == jnp.float32 else word
