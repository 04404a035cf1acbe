"""Block-scaled FP4 GEMM on integer tensor cores: two QArrays in, float32 / bf16 out (issue 39).

Every E2M1 value times 2 is an integer in [-12, 12], so a scale block of FP4 codes is a block of
int8 values. For two operands quantized along the contraction axis (MXFP4: blocks of 32 with E8M0
scales; NVFP4: blocks of 16 with UE4M3 scales and a per-tensor scale), the kernel computes, for
each pair of matching blocks j,

    P_j = sum_{k in block j} (2 a_k) (2 b_k)      an int32 tensor-core dot; |P_j| <= 32 * 144
    p_j = P_j * min(f_a,j f_b,j, FLT_MAX)          f = s / 2 in float32: f_a f_b = s_a s_b / 4
    acc = (...((0 + p_0) + p_1) + ...) + p_{n-1}   float32, in block order
    out = acc                     (MXFP4)          out = acc * fl32(g_a g_b)   (NVFP4, g = amax_t / 2688)

P_j is exact (13 bits); f_a f_b and P_j f_a f_b are exact wherever they are normal float32 numbers
(an E8M0 scale is a power of two; two UE4M3 scales have 4 significant bits each, so P_j s_a s_b
needs at most 12 + 8 bits). Only the float32 sum across blocks rounds, in a
fixed order, so the result is deterministic and equals a numpy float32 loop over exact int64
partial sums bit for bit (tests/pallas/test_fp4_gemm.py). No dequantized copy of either operand
is written: the kernel reads the packed codes (4 bits per element) and one scale byte per block.

The kernel is a Pallas `pallas_call` with the Triton backend (`interpret=None`: compiled on a GPU,
Pallas interpret mode elsewhere). Grid: (batch, M / tile_m, N / tile_n); each program loops over
the scale blocks of K, loading one block of packed codes of each operand, unpacking the nibbles
to int8 and issuing one dot per block. docs/gemm.md, "FP4 GEMM on integer tensor cores".

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lpjax import quant
  >>> a = quant.quantize(jax.random.normal(jax.random.key(0), (8, 64)), "mxfp4")
  >>> b = quant.quantize(jax.random.normal(jax.random.key(1), (16, 64)), "mxfp4")
  >>> y = fp4_matmul(a, b)                              # a @ b^T, K = 64: two blocks
  >>> ref = quant.dequantize(a) @ quant.dequantize(b).T
  >>> y.shape, bool(jnp.allclose(y, ref, rtol=1e-6, atol=1e-6))
  ((8, 16), True)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from lpjax.pallas import _fp4_gemm_sharded as gemm_sharded, _support as sp
from lpjax.pallas._fp4_gemm_kernels import gemm_kernel, partials_kernel
from lpjax.quant.formats import specs as formats
from lpjax.quant.codec.qarray import QArray

I32 = jnp.int32
F32 = jnp.float32
DOT_DTYPES = ("int8", "bfloat16", "float8_e4m3fn")
NVFP4_DECODE = 1.0 / 2688.0  # amax_t / (448 * 6): NVFP4's per-tensor decode factor (numerics §5)
TILE_CAP = (64, 64)  # default caps of (tile_m, tile_n); powers of two >= 16 (Triton's dot minimum)


def gemm_format_reason(fmt) -> str | None:
  """None when the kernel multiplies operands of `fmt`; otherwise why not (for messages)."""
  fmt = formats.get_format(fmt)
  name = fmt.name or "this format"
  if fmt.element.name != "e2m1" or fmt.granularity != "block":
    return f"{name} (the FP4 GEMM needs e2m1 elements with block scales)"
  if getattr(fmt, "fixed_scale_exponent", None) is not None:
    return f"{name} (a fixed scale exponent)"
  if fmt.scale not in ("e8m0", "ue4m3"):
    return f"{name} ({fmt.scale} scales; the FP4 GEMM takes e8m0 or ue4m3)"
  b = fmt.block_size
  if b < 16 or b & (b - 1):
    return f"{name} (block size {b}: the FP4 GEMM needs a power of two >= 16)"
  return None


def compatible(fmt_a, fmt_b) -> bool:
  """Whether two kernel formats pair block for block: the same block, scale and element format.

  1-D blocks and 16x16 tiles pair (NVFP4's weights are tiled): a tile's scale is the scale of each
  of its 16 rows' blocks.
  """
  a, b = formats.get_format(fmt_a), formats.get_format(fmt_b)
  return (a.element, a.scale, a.block_size) == (b.element, b.scale, b.block_size)


def default_dot_dtype(fmt) -> str:
  """int8 dots where a scale block fills Triton's 8-bit minimum dot depth (32); else bf16.

  Both are exact: the operands are integers in [-12, 12] and a block's dot is below 2^13, so a
  bf16 dot accumulating in float32 gives the same integer as the int8 dot accumulating in int32.
  """
  return "int8" if formats.get_format(fmt).block_size >= 32 else "bfloat16"


# --------------------------------------------------------------------------- host side


def _next_pow2(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


def _tile(n: int, cap: int) -> int:
  return max(16, min(cap, _next_pow2(n)))


def _compiler_params(tm, tn, interpret):
  if interpret:
    return None
  from jax.experimental.pallas import triton as pltriton  # noqa: PLC0415 (GPU only)
  return pltriton.CompilerParams(num_warps=4 if tm * tn <= 4096 else 8, num_stages=3)


def untile(q: QArray) -> QArray:
  """A 16x16-tiled QArray as 1-D blocks along its last axis: each tile's scale byte repeated for
  its 16 rows (a few bytes; the codes are untouched). Other QArrays are returned as they are."""
  if not isinstance(q, QArray) or not q.fmt.tile:
    return q
  if len(q.shape) < 2 or q.axis != len(q.shape) - 1:
    raise ValueError(f"fp4_matmul: a tiled operand must be contracted along its last axis; got "
                     f"shape {q.shape}, axis {q.axis}.")
  rows = q.shape[-2]
  scales = jnp.repeat(q.scales, q.fmt.block_size, axis=-2)[..., :rows, :]
  fmt = dataclasses.replace(q.fmt, tile=False, name=f"{q.fmt.name}_rows" if q.fmt.name else "")
  return dataclasses.replace(q, scales=scales, fmt=fmt)


def _check_pair(lhs, rhs):
  for side, q in (("lhs", lhs), ("rhs", rhs)):
    if not isinstance(q, QArray):
      raise TypeError(f"fp4_matmul: {side} must be a QArray, got {type(q).__name__}.")
    reason = gemm_format_reason(q.fmt)
    if reason is not None:
      raise NotImplementedError(f"fp4_matmul does not handle {reason}: it multiplies MXFP4 or "
                                "NVFP4 (e2m1 with e8m0 / ue4m3 block scales) QArrays.")
    if len(q.shape) < 2 or q.axis != len(q.shape) - 1:
      raise ValueError(f"fp4_matmul: {side} must be quantized along its last (contraction) axis, "
                       f"rank >= 2; got shape {q.shape}, axis {q.axis}.")
  if not compatible(lhs.fmt, rhs.fmt):
    raise ValueError(f"fp4_matmul needs operands with the same element, block and scale formats, "
                     f"got {lhs.fmt} and {rhs.fmt}.")
  if lhs.shape[-1] != rhs.shape[-1] or lhs.shape[:-2] != rhs.shape[:-2]:
    raise ValueError(f"fp4_matmul: shapes {lhs.shape} and {rhs.shape} do not match as "
                     "(..., M, K) x (..., N, K).")


def tensor_factor(lhs: QArray, rhs: QArray):
  """fl32(g_a g_b) with g = fl32(amax_t * fl32(1/2688)), or 1 where amax_t is 0 or absent."""
  def g(q):
    if q.tensor_scale is None:
      return F32(1.0)
    amax = jnp.asarray(q.tensor_scale, F32)
    return jnp.where(amax == 0, F32(1.0), amax * F32(NVFP4_DECODE))
  return (g(lhs) * g(rhs)).astype(F32)


def fp4_matmul(lhs: QArray, rhs: QArray, *, out_dtype=jnp.float32, interpret=None, tile=None,
               dot_dtype: str | None = None) -> jax.Array:
  """lhs @ rhs^T of two FP4 QArrays quantized along their last (contraction) axes.

  Args:
    lhs: QArray (..., M, K), MXFP4 or NVFP4 (any e2m1 format with e8m0 / ue4m3 1-D blocks).
    rhs: QArray (..., N, K) of the same format and batch shape.
    out_dtype: float32 (default) or bfloat16 (rounded once, from the float32 result).
    interpret: None (compile with Triton on a GPU, interpret elsewhere), True or False.
    tile: caps (tile_m, tile_n) of the output tile, powers of two >= 16.
    dot_dtype: "int8", "bfloat16" or "float8_e4m3fn" tensor-core dots (None:
      `default_dot_dtype`); the same integers wherever the dot accumulates them exactly.

  Returns:
    (..., M, N) in out_dtype: per block an exact integer dot, scaled exactly in float32, summed
    in float32 in block order (module docstring).
  """
  lhs, rhs = untile(lhs), untile(rhs)
  _check_pair(lhs, rhs)
  dot_dtype = default_dot_dtype(lhs.fmt) if dot_dtype is None else dot_dtype
  if dot_dtype not in DOT_DTYPES:
    raise ValueError(f"dot_dtype must be one of {DOT_DTYPES}, got {dot_dtype!r}.")
  *batch, m = lhs.codes.shape[:-1]  # the arrays' own shapes: per device inside shard_map
  n = rhs.codes.shape[-2]
  static = LocalGemm(block=lhs.fmt.block_size, scale=lhs.fmt.scale, dot_dtype=dot_dtype,
                     tensor_scale=lhs.tensor_scale is not None or rhs.tensor_scale is not None,
                     tile=_check_tile(tile), out_dtype=jnp.dtype(out_dtype),
                     interpret=sp.resolve_interpret(interpret))
  args = (jnp.broadcast_to(tensor_factor(lhs, rhs), (1, 1)),) + _as_3d(lhs) + _as_3d(rhs)
  if gemm_sharded.use_partitioning():
    out = gemm_sharded.partitioned(local_matmul, static)(*args)
  else:
    out = local_matmul(*args, static)
  return out.reshape(*batch, m, n)


@dataclasses.dataclass(frozen=True)
class LocalGemm:
  """The static arguments of one kernel GEMM (hashable: a jit / partitioning cache key)."""

  block: int
  scale: str  # "e8m0" or "ue4m3"
  dot_dtype: str
  tensor_scale: bool  # multiply by the NVFP4 per-tensor factor g
  tile: tuple[int, int]  # caps of (tile_m, tile_n)
  out_dtype: Any
  interpret: bool


def _check_tile(tile):
  tile = TILE_CAP if tile is None else tuple(tile)
  if len(tile) != 2 or any(c < 16 or c & (c - 1) for c in tile):
    raise ValueError(f"fp4_matmul: tile caps must be two powers of two >= 16, got {tile}.")
  return tile


def _as_3d(q: QArray):
  """(codes (B, rows, K/2 bytes), scales (B, rows, n_blocks)) of a QArray (..., rows, K)."""
  *batch, rows, _ = q.codes.shape
  b = math.prod(batch)
  return (q.codes.reshape(b, rows, q.codes.shape[-1]),
          q.scales.reshape(b, rows, q.scales.shape[-1]))


def _pad3(x, rows: int, cols: int):
  """Zero-pads (B, r, c) to (B, rows, cols)."""
  return jnp.pad(x, ((0, 0), (0, rows - x.shape[1]), (0, cols - x.shape[2])))


def local_matmul(g, a, sa, b, sb, static: LocalGemm):
  """The kernel GEMM of (B, M, K/2)-byte codes and (B, M, n_blocks) scales against the rhs's
  (B, N, ...): pads M and N to whole tiles and K to whole blocks, returns (B, M, N)."""
  _, m, _ = a.shape
  n, n_blocks = b.shape[1], sa.shape[-1]
  tm, tn = _tile(m, static.tile[0]), _tile(n, static.tile[1])
  nbytes = n_blocks * static.block // 2
  m_pad, n_pad = -(-m // tm) * tm, -(-n // tn) * tn
  a, sa = _pad3(a, m_pad, nbytes), _pad3(sa, m_pad, n_blocks)  # zero codes add nothing
  b, sb = _pad3(b, n_pad, nbytes), _pad3(sb, n_pad, n_blocks)
  sbt = jnp.swapaxes(sb, 1, 2)  # (B, n_blocks, N): one row of scale bytes per block
  out = _call(g, a, sa, b, sbt, block=static.block, scale=static.scale,
              dot_dtype=static.dot_dtype, tensor_scale=static.tensor_scale, tm=tm, tn=tn,
              out_dtype=static.out_dtype, interpret=static.interpret)
  return out[:, :m, :n]


@functools.partial(jax.jit, static_argnames=("block", "scale", "dot_dtype", "tensor_scale", "tm",
                                             "tn", "out_dtype", "interpret"))
def _call(g, a, sa, b, sbt, *, block, scale, dot_dtype, tensor_scale, tm, tn, out_dtype,
          interpret):
  nb, m_pad, kc = a.shape
  n_pad = b.shape[1]
  n_blocks = sa.shape[-1]
  kernel = functools.partial(gemm_kernel, n_blocks=n_blocks, block=block, scale=scale,
                             dot_dtype=dot_dtype, tensor_scale=tensor_scale)
  return pl.pallas_call(
      kernel,
      grid=(nb, m_pad // tm, n_pad // tn),
      in_specs=[pl.BlockSpec((1, 1), lambda z, i, j: (0, 0)),
                pl.BlockSpec((None, tm, kc), lambda z, i, j: (z, i, 0)),
                pl.BlockSpec((None, tm, n_blocks), lambda z, i, j: (z, i, 0)),
                pl.BlockSpec((None, tn, kc), lambda z, i, j: (z, j, 0)),
                pl.BlockSpec((None, n_blocks, tn), lambda z, i, j: (z, 0, j))],
      out_specs=pl.BlockSpec((None, tm, tn), lambda z, i, j: (z, i, j)),
      out_shape=jax.ShapeDtypeStruct((nb, m_pad, n_pad), out_dtype),
      interpret=interpret,
      compiler_params=_compiler_params(tm, tn, interpret),
      name="lpjax_fp4_gemm",
  )(g, a, sa, b, sbt)


def block_partials(lhs: QArray, rhs: QArray, *, interpret=None, dot_dtype: str | None = None):
  """The int32 partial sums P_j (n_blocks, ..., M, N) that `fp4_matmul` scales and adds.

  The same in-kernel `block_dot`, one program per (block, tile) writing its integers out: the
  handle the exactness tests check against numpy int64.
  """
  lhs, rhs = untile(lhs), untile(rhs)
  _check_pair(lhs, rhs)
  dot_dtype = default_dot_dtype(lhs.fmt) if dot_dtype is None else dot_dtype
  (a, sa), (b, _) = _as_3d(lhs), _as_3d(rhs)
  (_, m, _), n, n_blocks = a.shape, b.shape[1], sa.shape[-1]
  batch = lhs.codes.shape[:-2]
  tm, tn = _tile(m, TILE_CAP[0]), _tile(n, TILE_CAP[1])
  m_pad, n_pad = -(-m // tm) * tm, -(-n // tn) * tn
  a = _pad3(a, m_pad, n_blocks * lhs.fmt.block_size // 2)
  b = _pad3(b, n_pad, n_blocks * lhs.fmt.block_size // 2)
  nbytes = lhs.fmt.block_size // 2
  interpret = sp.resolve_interpret(interpret)
  out = pl.pallas_call(
      functools.partial(partials_kernel, dot_dtype=dot_dtype),
      grid=(a.shape[0], n_blocks, m_pad // tm, n_pad // tn),
      in_specs=[pl.BlockSpec((None, tm, nbytes), lambda z, k, i, j: (z, i, k)),
                pl.BlockSpec((None, tn, nbytes), lambda z, k, i, j: (z, j, k))],
      out_specs=pl.BlockSpec((None, None, tm, tn), lambda z, k, i, j: (k, z, i, j)),
      out_shape=jax.ShapeDtypeStruct((n_blocks, a.shape[0], m_pad, n_pad), I32),
      interpret=interpret,
      compiler_params=_compiler_params(tm, tn, interpret),
      name="lpjax_fp4_block_partials",
  )(a, b)
  return out[:, :, :m, :n].reshape(n_blocks, *batch, m, n)


def fp4_dot_general(lhs: QArray, rhs: QArray, dimension_numbers, *, preferred_element_type=None,
                    interpret=None, tile=None, dot_dtype=None) -> jax.Array:
  """`lax.dot_general` of two FP4 QArrays, each contracted along its own blocked axis.

  Any batch and free dims; exactly one contracting dim per operand, which must be the operand's
  quantized axis (`q.axis`): blocks run along the contraction (docs/numerics.md §7). Codes and
  scales are transposed as packed bytes (the blocked axis last), never dequantized. The result is
  laid out as `lax.dot_general`'s: (batch, lhs free, rhs free); dtype preferred_element_type
  (default float32).
  """
  (lc, rc), (lb, rb) = dimension_numbers
  if len(lc) != 1 or len(rc) != 1:
    raise ValueError("fp4_dot_general contracts exactly one (blocked) axis of each operand, got "
                     f"{dimension_numbers!r}.")
  ops = []
  for q, c, bdims, side in ((untile(lhs), lc[0], lb, "lhs"), (untile(rhs), rc[0], rb, "rhs")):
    c = c % len(q.shape)
    if c != q.axis:
      raise ValueError(f"fp4_dot_general: the {side} is quantized along axis {q.axis} but "
                       f"contracted along axis {c}; blocks must run along the contraction.")
    bdims = [d % len(q.shape) for d in bdims]
    free = [d for d in range(len(q.shape)) if d != c and d not in bdims]
    ops.append(_canonical(q, bdims, free, c))
  (a, a_free), (b, b_free) = ops
  out = fp4_matmul(a, b, out_dtype=preferred_element_type or jnp.float32, interpret=interpret,
                   tile=tile, dot_dtype=dot_dtype)
  batch = [lhs.shape[d % len(lhs.shape)] for d in lb]
  return out.reshape(*batch, *a_free, *b_free)


def _canonical(q: QArray, bdims, free, c):
  """q as a QArray (B, F, K) blocked along its last axis (codes and scales moved as bytes)."""
  perm = list(bdims) + list(free) + [c]
  shape = [q.shape[d] for d in perm]
  bsz, fsz = math.prod(shape[:len(bdims)]), math.prod(shape[len(bdims):-1])
  codes = jnp.transpose(q.codes, perm)
  scales = jnp.transpose(q.scales, perm)
  codes = codes.reshape(bsz, fsz, codes.shape[-1])
  scales = scales.reshape(bsz, fsz, scales.shape[-1])
  out = QArray(codes=codes, scales=scales, tensor_scale=q.tensor_scale, zeros=None, fmt=q.fmt,
               shape=(bsz, fsz, shape[-1]), axis=2, dtype=q.dtype)
  return out, [q.shape[d] for d in free]
