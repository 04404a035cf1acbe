"""Scale rules of the two-level and fp32-scale formats on constructed inputs: NVFP4's ue4m3 block
scale with its fp32 tensor scale (docs/numerics.md §5), the fp32-scale int / uint4 / NF4 / fp8
formats, and their fp32 edge cases (docs/quant.md).

Every case states its expected bytes / codes / values by hand (derivations in the comments) and
is also checked against the numpy oracle; test_scale_rules.py has the E8M0 (MX) rules."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import numpy_oracle as O  # noqa: E402

from lpjax import quant  # noqa: E402
from scale_rule_helpers import (CANON, F32, FLT_MAX, MX, RAGGED, XFAIL_UINT4_SUBNORMAL, canon,
                                check_oracle, run)  # noqa: E402

# Every case runs on the fast element path and on the integer reference (tests/quant/conftest.py).
pytestmark = pytest.mark.usefixtures("arithmetic")


# ------------------------------------------------------------------------------ NVFP4 (§5)

def test_nvfp4_grid_block_by_hand():
  """amax_t = 6: S_enc = 448, s_b = e4m3(6 * fl32(448 * fl32(1/6))) = 448 (0x7E); the e2m1
  grid maps to its own codes; tensor_scale holds amax_t."""
  x = canon([[6, 4, 3, 2, 1.5, 1, .5, 0, -6, -4, -3, -2, -1.5, -1, -.5, -0.]], 16)
  q, codes, scales, vals = run(x, "nvfp4")
  O.assert_same_bits(codes[0, :16], np.array([7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8],
                                        np.uint8), "codes")
  assert scales[0, 0] == 0x7E and np.asarray(q.tensor_scale) == 6.0
  check_oracle(q, x, "nvfp4")


def test_nvfp4_scale_rounds_to_zero():
  """A block far below the tensor amax: s_b = 0, S_enc_b = FLT_MAX, so every normal non-zero
  element gets code +-6 (x * FLT_MAX overflows: saturate) and dequantizes to (signed) 0;
  a subnormal 1e-39 * FLT_MAX = 0.34 rounds to code 1 (0.5). Not special-cased (§5)."""
  x = canon([[1e4], [1e-8, -3e-8, 2e-8, -0.0, 0.0, 1e-39]], 16)
  q, codes, scales, vals = run(x, "nvfp4")
  O.assert_same_bits(scales[0, :2], np.array([0x7E, 0], np.uint8), "scales")
  O.assert_same_bits(codes[0, 16:22], np.array([7, 15, 7, 8, 0, 1], np.uint8), "codes")
  O.assert_same_bits(vals[0, 16:22], np.array([0, -0., 0, -0., 0, 0], np.float32), "values")
  check_oracle(q, x, "nvfp4")


def test_nvfp4_e4m3_subnormal_block_scale():
  """amax_t = 2688: S_enc = 1; block amax 6 * 2^-9 -> s_b = 2^-9 (byte 0x01);
  S_enc_b = 512, so 6, 3, -2, 1, 0.5 (x 2^-9) get codes 7, 5, 0xC, 2, 1."""
  x = canon([[2688], np.array([6, 3, -2, 1, .5]) * 2.0 ** -9], 16)
  q, codes, scales, vals = run(x, "nvfp4")
  O.assert_same_bits(scales[0, :2], np.array([0x7E, 0x01], np.uint8), "scales")
  O.assert_same_bits(codes[0, 16:21], np.array([7, 5, 12, 2, 1], np.uint8), "codes")
  O.assert_same_bits(vals[0, 16:21], x[0, 16:21], "values (exact here)")
  check_oracle(q, x, "nvfp4")


@pytest.mark.parametrize("tensor_amax", [10.0, 0.5])
def test_nvfp4_tensor_amax_option(tensor_amax):
  x = np.random.default_rng(2).standard_normal(CANON).astype(np.float32)
  q, codes, scales, vals = run(x, "nvfp4", tensor_amax=tensor_amax)
  assert np.asarray(q.tensor_scale) == np.float32(tensor_amax)
  if tensor_amax < np.abs(x).max():   # blocks beyond the given amax saturate at 448
    assert np.any(scales == 0x7E)
  check_oracle(q, x, "nvfp4", tensor_amax=tensor_amax)


def test_nvfp4_16x16_tiles_by_hand():
  """Tiles vs rows: one large element makes only its tile's (resp. its 1x16 block's) scale 448;
  the others get e4m3(1 * 26.88 * fl32(1/6)) = e4m3(4.48) = 4.5 = byte 0x49."""
  w = np.ones(CANON, np.float32)
  w[3, 20] = 100
  q, _, scales, _ = run(w, "nvfp4_16x16")
  want = np.full((1, 8), 0x49, np.uint8)
  want[0, 1] = 0x7E
  O.assert_same_bits(scales, want, "tile scales")
  check_oracle(q, w, "nvfp4_16x16")
  q, _, scales, _ = run(w, "nvfp4")
  want = np.full((16, 8), 0x49, np.uint8)
  want[3, 1] = 0x7E
  O.assert_same_bits(scales, want, "1x16 scales")


def test_nvfp4_16x16_transpose_commutes():
  """Q(W)^T == Q(W^T) for 16x16 tiles (docs/numerics.md §5), on a non-multiple-of-16 shape."""
  w = O.heavy_tailed(RAGGED, 9, exp_range=3)
  q1, c1, s1, v1 = run(w, "nvfp4_16x16")
  q2, c2, s2, v2 = run(np.ascontiguousarray(w.T), "nvfp4_16x16")
  assert s1.shape == (1, 8) and np.asarray(q1.codes).shape == (13, 59)
  O.assert_same_bits(s2, s1.T, "scales")
  O.assert_same_bits(c2, c1.T, "codes")
  O.assert_same_bits(v2, v1.T, "values")
  check_oracle(q1, w, "nvfp4_16x16")


def test_custom_e2m1_ue4m3_block32():
  """Without tensor_scale the ue4m3 scale is NVFP4's with amax_t = 2688 (S_enc = 1)."""
  fmt = quant.QuantFormat(element="e2m1", scale="ue4m3", block_size=32)
  x = np.zeros(CANON, np.float32)
  x[0, 0] = 6.0          # s_b = e4m3(6 * fl32(1/6)) = 1.0 -> byte 0x38
  x[0, 1] = -3.0
  x[1, 32] = 0.75        # s_b = e4m3(0.125) = 0x20; x * 8 = 6 -> code 7
  x[1, 33] = 0.25
  q = quant.quantize(jnp.asarray(x), fmt)
  assert q.tensor_scale is None and np.asarray(q.scales).shape == (16, 4)
  scales = np.asarray(q.scales)
  assert scales[0, 0] == 0x38 and scales[1, 1] == 0x20 and scales[0, 1] == 0
  codes = O.unpack_fp4(np.asarray(q.codes), 128)
  assert list(codes[0, :2]) == [7, 13] and list(codes[1, 32:34]) == [7, 4]
  ref = O.quantize(x, O.Fmt("e2m1", "ue4m3", 32))
  O.check_quantized(ref, q.codes, q.scales, quant.dequantize(q), what="custom")


# ------------------------------------------------------------------------------ fp32 scales

def test_fp8_per_tensor_by_hand():
  """amax 2: enc = 224; 0.3 * 224 = 67.2 -> e4m3 64; stored scale fl32(1/224)."""
  x = canon([[2, 1, -0.5, 0, 0.3, -0.0]])
  q, codes, scales, vals = run(x, "fp8_e4m3")
  O.assert_same_bits(codes[0, :6], np.array([0x7E, 0x76, 0xEE, 0, 0x68, 0x80], np.uint8), "codes")
  O.assert_same_bits(scales, np.array(F32(1) / F32(224)), "scale")
  want = (O.decode_table("e4m3")[codes] * (F32(1) / F32(224))).astype(np.float32)
  O.assert_same_bits(vals, want, "values = element * stored scale")
  check_oracle(q, x, "fp8_e4m3")


def test_int_codes_twos_complement():
  x = canon([[7, -7, -1, 1, -0.0, 3.4, -3.6, -7.0]], 128)
  q, codes, scales, vals = run(x, "int4_g128")            # amax 7: enc = 1
  O.assert_same_bits(codes[0, :8], np.array([7, 9, 15, 1, 0, 3, 12, 9], np.uint8), "int4")
  O.assert_same_bits(np.asarray(q.codes)[0, :4], np.array([0x97, 0x1F, 0x30, 0x9C], np.uint8),
                     "packed int4")
  assert scales[0, 0] == 1.0
  x8 = x * F32(127 / 7)
  q, codes, scales, vals = run(x8, "int8_g128")
  assert codes[0, 0] == 127 and codes[0, 1] == 0x81 and codes[0, 4] == 0
  check_oracle(q, x8, "int8_g128")


def test_int8_channel_groups():
  x = canon([[3, 1.5, -3, -1.5, 0.01, -0.0, -1e-3], [1, 2, 3, 4, 5, 6, 7]], 128)
  q, codes, scales, vals = run(x, "int8_channel")
  O.assert_same_bits(scales[:2, 0], np.array([F32(1) / (F32(127) / F32(3)),
                                              F32(1) / (F32(127) / F32(7))]), "scales")
  assert np.all(scales[2:] == 1.0)
  assert codes.view(np.int8)[0, 0] == 127 and codes.view(np.int8)[0, 2] == -127
  check_oracle(q, x, "int8_channel")
  xt = np.ascontiguousarray(x.T)          # channels along axis 0 now
  q, codes, scales, vals = run(xt, "int8_channel", axis=0)
  assert scales.shape == (1, 16)
  O.assert_same_bits(scales[0, :2], np.array([F32(1) / (F32(127) / F32(3)),
                                              F32(1) / (F32(127) / F32(7))]), "axis-0 scales")
  check_oracle(q, xt, "int8_channel", axis=0)


@pytest.mark.parametrize("rounding,want", [("nearest_even", [0, 5, 8, 15]),
                                           ("toward_zero", [0, 5, 7, 15]),
                                           ("nearest_away", [0, 5, 8, 15])])
def test_uint4_by_hand(rounding, want):
  """lo = -1, hi = 2: enc = 15 / 3 = 5; (x - lo) * 5 = 0, 5, 7.5, 15; scale fl32(1/5);
  value = fl32(code * scale) + lo; zeros = lo."""
  x = np.tile(np.array([-1, 0, 0.5, 2], np.float32), (16, 32))
  q, codes, scales, vals = run(x, "uint4_g128", rounding=rounding)
  O.assert_same_bits(codes[0, :4], np.array(want, np.uint8), "codes")
  O.assert_same_bits(scales, np.full((16, 1), F32(1) / F32(5)), "scale")
  O.assert_same_bits(np.asarray(q.zeros), np.full((16, 1), -1.0, np.float32), "zeros")
  w = ((np.array(want, np.float32) * (F32(1) / F32(5))).astype(np.float32) + F32(-1))
  O.assert_same_bits(vals[0, :4], w.astype(np.float32), "values")
  check_oracle(q, x, "uint4_g128", rounding=rounding)


def test_nf4_by_hand():
  """absmax 2: enc = 0.5; values near 2 * grid[i] get code i; scale 2; value grid * 2."""
  rng = np.random.default_rng(4)
  idx = np.concatenate([np.arange(16), rng.integers(0, 16, 48)])
  gaps = np.diff(O.NF4_GRID).min()
  x = (2 * (O.NF4_GRID[idx] + rng.uniform(-0.3, 0.3, 64) * gaps)).clip(-1.99, 1.99)
  x = x.astype(np.float32)
  x[15] = 2.0
  x[0] = -1.9
  x = canon([x], 64)
  q, codes, scales, vals = run(x, "nf4")
  O.assert_same_bits(codes[0, :64], idx.astype(np.uint8), "codes")
  O.assert_same_bits(scales[0, 0], np.float32(2.0), "scale")
  O.assert_same_bits(vals[0, :64], (O.NF4_GRID[idx] * F32(2)).astype(np.float32), "values")
  check_oracle(q, x, "nf4")


# ------------------------------------------------------------------------------ fp32 edges

def test_nf4_stored_scale_overflow_follows_the_formula():
  """amax = FLT_MAX: enc = fl32(1 / FLT_MAX) = 2^-128 (an fp32 subnormal), so the stored scale
  fl32(1 / enc) = 2^128 overflows to inf, and value = element * stored scale (one fp32 product)
  is +-inf, and NaN for the 0.0 code (docs/quant.md, fp32 scales)."""
  x = canon([[FLT_MAX, 1e38, -1e38, 0.0]], 64)
  q, codes, scales, vals = run(x, "nf4")
  O.assert_same_bits(codes[0, :4], np.array([15, 11, 4, 7], np.uint8), "codes")
  assert scales[0, 0] == np.inf
  with np.errstate(invalid="ignore"):
    want = (O.NF4_GRID[[15, 11, 4, 7]] * np.float32(np.inf)).astype(np.float32)
  O.assert_same_bits(vals[0, :4], want, "values = element * stored scale")
  check_oracle(q, x, "nf4")


@XFAIL_UINT4_SUBNORMAL
def test_uint4_subnormal_group_minimum():
  """zeros holds the exact group minimum, also when it is an fp32 subnormal, and a code 0
  dequantizes to fl32(0 * scale) + lo = lo (§4: exact for subnormal inputs on every backend).
  lo = -2e-40, hi = 1: hi - lo = 1, enc = 15, scale fl32(1/15)."""
  x = canon([[-2e-40, 1.0, 0.5, 3e-39]], 128)
  x[1:] = 1.0
  x[1:, 0] = -1.0
  q, codes, scales, vals = run(x, "uint4_g128")
  O.assert_same_bits(codes[0, :4], np.array([0, 15, 8, 0], np.uint8), "codes")
  O.assert_same_bits(np.asarray(q.zeros)[0, 0], np.float32(-2e-40), "zeros = group minimum")
  assert scales[0, 0] == F32(1) / F32(15)
  O.assert_same_bits(vals[0, [0, 3]], np.full(2, np.float32(-2e-40)), "code 0 -> lo")
  check_oracle(q, x, "uint4_g128")


@pytest.mark.parametrize("fmt,big", [("nvfp4", 1e35), ("int8_g128", 1e38), ("fp8_e4m3", 1e38),
                                     ("fp8_e5m2", 1e38)])
@pytest.mark.parametrize("rounding", ["toward_positive", "toward_negative"])
def test_directed_rounding_of_an_underflowing_fp32_product(fmt, big, rounding):
  """v is the fp32 product x * S (docs/quant.md "Rounding"): with S ~ 6e-35 (nvfp4) or
  127 / 1e38 (int8), +-1e-20 * S underflows to +-0 in fp32, so nothing rounds away from zero:
  the codes are the (signed, for floats) zero codes, not the smallest non-zero step."""
  x = canon([[big, 1e-20, -1e-20]], 128)
  q, codes, _, _ = run(x, fmt, rounding=rounding)
  zero_neg = {"nvfp4": 8, "int8_g128": 0, "fp8_e4m3": 0x80, "fp8_e5m2": 0x80}[fmt]
  O.assert_same_bits(codes[0, 1:3], np.array([0, zero_neg], np.uint8), "codes of +-1e-20")
  check_oracle(q, x, fmt, rounding=rounding)
