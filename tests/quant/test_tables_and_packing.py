"""Decode tables (vs ml_dtypes), format registry, nibble packing, QArray layout and nbytes."""

import os
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import numpy_oracle as O  # noqa: E402

from lpjax import quant  # noqa: E402

ML_DTYPES = {
    "e2m1": ml_dtypes.float4_e2m1fn,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
}
BITS = {"e2m1": 4, "e2m3": 6, "e3m2": 6, "e4m3": 8, "e5m2": 8, "int8": 8, "int4": 4,
        "uint4": 4, "nf4": 4}


def _name(v):
  """QuantFormat fields may hold a name or an object with a .name."""
  return getattr(v, "name", v)


def _ml_table(dt, n):
  return np.arange(n, dtype=np.uint8).view(dt).astype(np.float32)


# ----------------------------------------------------------------------------- decode tables

@pytest.mark.parametrize("name", sorted(ML_DTYPES))
def test_decode_table_equals_ml_dtypes(name):
  table = np.asarray(quant.decode_table(name))
  assert table.dtype == np.float32 and table.shape == (1 << BITS[name],)
  O.assert_same_bits(table, _ml_table(ML_DTYPES[name], 1 << BITS[name]), f"{name} table")


@pytest.mark.parametrize("name", sorted(ML_DTYPES))
def test_oracle_decode_table_equals_ml_dtypes(name):
  O.assert_same_bits(O.decode_table(name), _ml_table(ML_DTYPES[name], 1 << BITS[name]), name)


def test_e2m1_code_points_from_contract():
  want = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
  O.assert_same_bits(np.asarray(quant.decode_table("e2m1")), want, "e2m1")


def test_e8m0_oracle_decode_equals_ml_dtypes():
  b = np.arange(256, dtype=np.uint8)
  want = b.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
  O.assert_same_bits(O.e8m0_value(b), want, "e8m0")


def test_special_codes():
  e4m3 = np.asarray(quant.decode_table("e4m3"))
  assert np.isnan(e4m3[[0x7F, 0xFF]]).all() and np.isfinite(np.delete(e4m3, [0x7F, 0xFF])).all()
  assert e4m3[0x7E] == 448 and e4m3[0x01] == 2.0 ** -9
  e5m2 = np.asarray(quant.decode_table("e5m2"))
  assert e5m2[0x7B] == 57344 and e5m2[0x7C] == np.inf and e5m2[0xFC] == -np.inf
  assert e5m2[0x01] == 2.0 ** -16
  assert np.asarray(quant.decode_table("e3m2"))[0x1F] == 28.0
  assert np.asarray(quant.decode_table("e2m3"))[0x1F] == 7.5


@pytest.mark.parametrize("name,want", [
    ("int8", np.where(np.arange(256) >= 128, np.arange(256) - 256, np.arange(256))),
    ("int4", np.array([0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1])),
    ("uint4", np.arange(16)),
    ("nf4", O.NF4_GRID),
])
def test_integer_and_nf4_tables(name, want):
  table = np.asarray(quant.decode_table(name))
  assert table.dtype == np.float32
  O.assert_same_bits(table, np.asarray(want, np.float32), name)


def test_nf4_grid_is_bitsandbytes():
  grid = np.asarray(quant.NF4_GRID)
  O.assert_same_bits(grid.astype(np.float32), O.NF4_GRID, "NF4_GRID")


# ----------------------------------------------------------------------------- oracle self-checks

@pytest.mark.parametrize("name", sorted(ML_DTYPES))
def test_oracle_rne_matches_ml_dtypes_cast(name):
  """The oracle's element rounding (scale 1) equals ml_dtypes' RNE cast on in-range values,
  including every exact tie between neighbouring code points and subnormals."""
  e = O.ELEMENTS[name]
  rng = np.random.default_rng(3)
  x = rng.standard_normal(20000) * np.exp2(rng.integers(e.emin - e.mbits - 3, e.emax + 1, 20000))
  fin = np.unique(np.abs(O.decode_table(name)[np.isfinite(O.decode_table(name))]))
  mids = (fin[1:].astype(np.float64) + fin[:-1]) / 2
  x = np.concatenate([x, mids, -mids, fin, -fin, [0.0, -0.0]])
  x = np.clip(x, -e.max, e.max).astype(np.float32)
  mag, neg = O.round_float_elem(e, x.astype(np.float64), "nearest_even")
  codes = O.encode_float_elem(e, mag, neg)
  ref = x.astype(ML_DTYPES[name]).view(np.uint8) & ((1 << e.bits) - 1)
  O.assert_same_bits(codes, ref.astype(np.uint8), f"{name} RNE codes")


def test_oracle_numpy_keeps_subnormals():
  """The oracle relies on numpy float32 arithmetic with gradual underflow on this host."""
  jnp.ones(3).block_until_ready()  # after XLA has run something in this process
  a = np.float32(1e-40) * np.float32(1.0)
  assert a != 0 and np.float32(2.0 ** -126) / np.float32(4) == np.float32(2.0 ** -128)


# ----------------------------------------------------------------------------- registry

PRESETS = {  # name: (element, scale, block_size)
    "mxfp4": ("e2m1", "e8m0", 32), "mxfp6_e2m3": ("e2m3", "e8m0", 32),
    "mxfp6_e3m2": ("e3m2", "e8m0", 32), "mxfp8_e4m3": ("e4m3", "e8m0", 32),
    "mxfp8_e5m2": ("e5m2", "e8m0", 32), "nvfp4": ("e2m1", "ue4m3", 16),
    "nvfp4_16x16": ("e2m1", "ue4m3", 16), "int8_g128": ("int8", "fp32", 128),
    "int4_g128": ("int4", "fp32", 128), "uint4_g128": ("uint4", "fp32", 128),
    "nf4": ("nf4", "fp32", 64),
}
OTHER_PRESETS = {"fp8_e4m3": ("e4m3", "fp32"), "fp8_e5m2": ("e5m2", "fp32"),
                 "int8_channel": ("int8", "fp32"), "int4_channel": ("int4", "fp32")}


def test_format_names_and_elements():
  assert set(PRESETS) | set(OTHER_PRESETS) <= set(quant.FORMAT_NAMES)
  assert set(quant.ELEMENT_FORMATS) == set(BITS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_block_presets(name):
  f = quant.get_format(name)
  assert (_name(f.element), _name(f.scale), f.block_size) == PRESETS[name]
  assert bool(f.tile) == (name == "nvfp4_16x16")
  assert bool(f.tensor_scale) == name.startswith("nvfp4")
  assert quant.get_format(f) == f


@pytest.mark.parametrize("name", sorted(OTHER_PRESETS))
def test_tensor_and_channel_presets(name):
  f = quant.get_format(name)
  assert (_name(f.element), _name(f.scale)) == OTHER_PRESETS[name]
  assert f.granularity == ("tensor" if name.startswith("fp8") else "channel")


def test_custom_format():
  f = quant.QuantFormat(element="e2m1", scale="ue4m3", block_size=32)
  assert (_name(f.element), _name(f.scale), f.block_size, f.granularity, bool(f.tile),
          bool(f.tensor_scale)) == ("e2m1", "ue4m3", 32, "block", False, False)
  assert quant.get_format(f) == f


# ----------------------------------------------------------------------------- packing

def test_pack_known_bytes():
  codes = jnp.array([1, 2, 3, 4, 5], jnp.uint8)
  packed = np.asarray(quant.pack_fp4(codes))
  O.assert_same_bits(packed, np.array([0x21, 0x43, 0x05], np.uint8), "packed")
  O.assert_same_bits(np.asarray(quant.unpack_fp4(jnp.asarray(packed), 5)),
                     np.asarray(codes), "unpacked")


@pytest.mark.parametrize("shape,axis", [((5, 37), -1), ((5, 38), 1), ((9, 4), 0), ((3, 7, 2), 1)])
def test_pack_roundtrip(shape, axis):
  rng = np.random.default_rng(sum(shape))
  codes = rng.integers(0, 16, size=shape, dtype=np.uint8)
  packed = np.asarray(quant.pack_fp4(jnp.asarray(codes), axis=axis))
  O.assert_same_bits(packed, O.pack_fp4(codes, axis=axis), "packed")
  n = shape[axis]
  out = np.asarray(quant.unpack_fp4(jnp.asarray(packed), n, axis=axis))
  O.assert_same_bits(out, codes, "round trip")
  lo = np.take(packed, np.arange(packed.shape[axis]), axis=axis) & 0xF
  O.assert_same_bits(lo, np.take(codes, np.arange(0, n, 2), axis=axis), "low nibble = even")
  if n % 2:
    last = np.take(packed, [packed.shape[axis] - 1], axis=axis)
    assert not np.any(last >> 4), "odd length must leave a zero high nibble"


def test_oracle_pack_matches_definition():
  c = np.array([[3, 12, 7]], np.uint8)
  O.assert_same_bits(O.pack_fp4(c), np.array([[0xC3, 0x07]], np.uint8), "oracle pack")


# ----------------------------------------------------------------------------- QArray

CANON = (16, 128)   # the shape shared by most quant tests (fewer XLA compilations)
X = np.random.default_rng(0).standard_normal(CANON).astype(np.float32)

LAYOUT = [  # fmt, axis, codes shape, scales shape, scales dtype, tensor_scale?, zeros?
    ("mxfp4", -1, (16, 64), (16, 4), np.uint8, False, False),
    ("mxfp4", 0, (64, 16), (4, 16), np.uint8, False, False),       # on X.T (128, 16)
    ("mxfp8_e4m3", -1, (16, 128), (16, 4), np.uint8, False, False),
    ("mxfp6_e3m2", 0, (128, 16), (4, 16), np.uint8, False, False),
    ("nvfp4", -1, (16, 64), (16, 8), np.uint8, True, False),
    ("nvfp4_16x16", -1, (16, 64), (1, 8), np.uint8, True, False),
    ("fp8_e4m3", -1, (16, 128), (), np.float32, False, False),
    ("int8_channel", -1, (16, 128), (16, 1), np.float32, False, False),
    ("int4_channel", 0, (64, 16), (1, 16), np.float32, False, False),
    ("int4_g128", -1, (16, 64), (16, 1), np.float32, False, False),
    ("uint4_g128", -1, (16, 64), (16, 1), np.float32, False, True),
    ("nf4", -1, (16, 64), (16, 2), np.float32, False, False),
]


@pytest.mark.parametrize("fmt,axis,cshape,sshape,sdtype,has_ts,has_zeros", LAYOUT)
def test_qarray_layout_and_nbytes(fmt, axis, cshape, sshape, sdtype, has_ts, has_zeros):
  x = X if axis == -1 else np.ascontiguousarray(X.T)
  q = quant.quantize(jnp.asarray(x), fmt, axis=axis)
  assert q.codes.dtype == jnp.uint8 and q.codes.shape == cshape
  assert q.scales.shape == sshape and q.scales.dtype == sdtype
  assert (q.tensor_scale is not None) == has_ts
  assert (q.zeros is not None) == has_zeros
  if has_zeros:
    assert q.zeros.shape == sshape and q.zeros.dtype == jnp.float32
  if has_ts:
    assert q.tensor_scale.dtype == jnp.float32 and q.tensor_scale.shape == ()
  assert q.shape == x.shape and q.axis == axis % 2 and np.dtype(q.dtype) == np.float32
  assert q.fmt == quant.get_format(fmt)
  want = q.codes.size + q.scales.size * np.dtype(sdtype).itemsize + 4 * has_ts \
      + 4 * has_zeros * q.scales.size
  assert q.nbytes == want
  assert np.asarray(quant.dequantize(q)).shape == x.shape


def test_storage_bits_per_element():
  x = jnp.zeros(CANON, jnp.float32)
  n = x.size
  assert quant.quantize(x, "mxfp4").nbytes * 8 / n == 4.25
  assert (quant.quantize(x, "nvfp4").nbytes - 4) * 8 / n == 4.5
  # FP6 codes are stored one per byte (docs/quant.md), so 8 + 0.25 bits, not the packed 6.25
  assert quant.quantize(x, "mxfp6_e2m3").nbytes * 8 / n == 8.25
  assert quant.quantize(x, "mxfp8_e5m2").nbytes * 8 / n == 8.25


def test_qarray_is_a_pytree():
  q = quant.quantize(jnp.asarray(X), "nvfp4")
  leaves, treedef = jax.tree_util.tree_flatten(q)
  assert any(leaf is q.codes for leaf in leaves) and any(leaf is q.scales for leaf in leaves)
  q2 = jax.tree_util.tree_unflatten(treedef, leaves)
  O.assert_same_bits(np.asarray(quant.dequantize(q2)), np.asarray(quant.dequantize(q)), "deq")
  # a QArray crosses a jit boundary as an argument and as a result
  deq = jax.jit(quant.dequantize)(q)
  O.assert_same_bits(np.asarray(deq), np.asarray(quant.dequantize(q)), "jit deq")


def test_dequantize_dtype():
  q = quant.quantize(jnp.asarray(X), "mxfp4")
  d32 = np.asarray(quant.dequantize(q))
  d16 = quant.dequantize(q, dtype=jnp.bfloat16)
  assert d16.dtype == jnp.bfloat16
  O.assert_same_bits(np.asarray(d16), d32.astype(ml_dtypes.bfloat16), "bf16 dequantize")


def test_e8m0_scale_bytes_decode_like_ml_dtypes():
  """Rows whose block amax is 4 * 2^(b-127) get scale byte b (floor mode, e2m1); dequantize
  multiplies the e2m1 value by the ml_dtypes e8m0 value of that byte, exactly, down to 2^-127."""
  grid = np.array([4, -3, 2, 1.5, -1, .5, 0, -6, 6, 0.5] + [1] * 22, np.float64)
  for start in range(0, 253, 64):          # 64 blocks of 32 per (16, 128) array
    b = np.minimum(np.arange(start, start + 64), 252)
    x64 = grid[None, :] * np.exp2(b - 127.0)[:, None]          # (64 blocks, 32)
    x = x64.astype(np.float32).reshape(CANON)
    assert np.all(x.reshape(64, 32).astype(np.float64) == x64)
    q = quant.quantize(jnp.asarray(x), "mxfp4")
    O.assert_same_bits(np.asarray(q.scales).reshape(-1), b.astype(np.uint8), "scale bytes")
    sval = b.astype(np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    codes = O.unpack_fp4(np.asarray(q.codes), 128).reshape(64, 32)
    want = (O.decode_table("e2m1")[codes].astype(np.float64) * sval[:, None]).astype(np.float32)
    O.assert_same_bits(np.asarray(quant.dequantize(q)), want.reshape(CANON), "dequantized")
    O.assert_same_bits(want.reshape(CANON), x, "exactly representable input")


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2",
                                 "fp8_e4m3", "fp8_e5m2", "nvfp4"])
def test_oracle_pipeline_matches_ml_dtypes_cast(fmt):
  """Oracle self-check on a whole format: with its own scales, the RNE codes equal ml_dtypes'
  cast of the scaled value (x / 2^k, or fl32(x * S)) after clipping to +-max."""
  f = O.PRESETS[fmt]
  e = O.ELEMENTS[f.element]
  x = O.heavy_tailed((16, 128), 17, exp_range=20)
  ref = O.quantize(x, fmt)
  if f.scale == "e8m0":
    k = ref["scales"].astype(np.float64) - 127
    v = x.astype(np.float64) * np.exp2(-np.repeat(k, 32, axis=-1))
  elif f.scale == "fp32":
    enc = np.float32(e.max) / np.abs(x).max()
    v = (x * enc).astype(np.float64)
  else:
    amax_t = np.float32(np.abs(x).max())
    blocks = np.abs(x).reshape(16, 8, 16).max(-1)
    _, _, s_enc_b = O._nv_scale(blocks, amax_t)
    with np.errstate(over="ignore"):    # s_b = 0 blocks: x * FLT_MAX may be inf (saturates)
      v = (x * np.repeat(s_enc_b, 16, axis=-1)).astype(np.float64)
  cast = np.clip(v, -e.max, e.max).astype(ML_DTYPES[f.element]).view(np.uint8)
  cast = cast & ((1 << e.bits) - 1)
  O.assert_same_bits(ref["codes_unpacked"], cast.astype(np.uint8), f"{fmt} oracle vs ml_dtypes")
