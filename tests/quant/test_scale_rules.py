"""Scale and rounding rules on constructed inputs (docs/numerics.md §4-6, docs/quant.md).

Every case states its expected bytes / codes / values by hand (derivations in the comments) and
is also checked against the numpy oracle."""

import os
import sys

import jax
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import numpy_oracle as O  # noqa: E402

from lpjax import quant  # noqa: E402
from scale_rule_helpers import (CANON, F32, FLT_MAX, MX, NEG_ZERO_CODE, RAGGED, amax_blocks, canon,
                                check_oracle, nxt, run)  # noqa: E402

# Every case runs on the fast element path and on the integer reference (tests/quant/conftest.py).
pytestmark = pytest.mark.usefixtures("arithmetic")


# ------------------------------------------------------------------------------ e8m0 exponents

# amax, expected scale byte for (floor, ceil, even, rceil), e2m1 (emax_elem 2, max 6).
#   floor: E(amax) - 2;  ceil: ceil(log2 amax) - 2;  even: E(amax rounded half-up to 1 mantissa
#   bit) - 2;  rceil: ceil(log2 fl32(amax * fl32(1/6))).  fl32(1/6) = 0.16666667163...
E2M1_SCALES = [
    (F32(4), (127, 127, 127, 127)),
    (nxt(4, 0), (126, 127, 127, 127)),       # floor(log2) from the bits: 1, not 2
    (nxt(4, 9), (127, 128, 127, 127)),
    (F32(6), (127, 128, 127, 127)),          # 6 * fl32(1/6) = 1.0000000298 -> fl32 1.0 -> 0
    (nxt(6, 9), (127, 128, 127, 128)),       # product rounds to 1 + 2^-23 -> ceil gives 1
    (F32(7), (127, 128, 128, 128)),          # 1.75 rounds half-up to 2.0 -> E = 3
    (nxt(7, 0), (127, 128, 127, 128)),
    (F32(8), (128, 128, 128, 128)),
    (F32(12), (128, 129, 128, 128)),         # 12 * fl32(1/6) rounds to exactly 2.0
    (nxt(16, 0), (128, 129, 129, 129)),      # the float32 log2 trap (docs/numerics.md §4)
    (F32(2.0 ** -100), (25, 25, 25, 25)),
    (F32(FLT_MAX), (252, 253, 253, 253)),    # "even" carries past the top exponent: clamp
    (F32(2.0 ** -126), (0, 0, 0, 0)),        # k = -128 clamps to -127
    (F32(7.5 * 2.0 ** -127), (0, 1, 1, 1)),  # rceil: product is the fp32 subnormal 1.25*2^-127
    (nxt(2.0 ** -126, 0), (0, 0, 0, 0)),     # largest subnormal amax
    (F32(1e-40), (0, 0, 0, 0)),
    (F32(2.0 ** -149), (0, 0, 0, 0)),
    (F32(0), (0, 0, 0, 0)),
]
# e4m3 (emax_elem 8, max 448)
E4M3_SCALES = [
    (F32(448), (127, 128, 127, 127)),
    (F32(449), (127, 128, 127, 128)),
    (F32(480), (127, 128, 127, 128)),        # 480 = 1.875 * 2^8: "even" keeps 3 mantissa bits
    (F32(496), (127, 128, 128, 128)),        # 1.9375 rounds half-up to 2.0
    (F32(512), (128, 128, 128, 128)),
    (F32(448 * 2.0 ** -127), (0, 1, 0, 0)),
    (F32(560 * 2.0 ** -127), (1, 2, 1, 1)),
]


@pytest.mark.parametrize("mode_index,mode", list(enumerate(O.SCALE_MODES)))
@pytest.mark.parametrize("fmt,table", [("mxfp4", E2M1_SCALES), ("mxfp8_e4m3", E4M3_SCALES)])
def test_e8m0_scale_byte_table(fmt, table, mode_index, mode):
  amaxes = [a for a, _ in table]
  want = np.array([w[mode_index] for _, w in table], np.uint8)
  x = canon(amax_blocks(amaxes))
  n = len(amaxes)
  ref = O.quantize(x, fmt, scale_mode=mode)
  O.assert_same_bits(ref["scales"].ravel()[:n], want, "oracle vs hand table")
  q, _, scales, _ = run(x, fmt, scale_mode=mode)
  O.assert_same_bits(scales.ravel()[:n], want, f"{fmt} {mode} scale bytes")
  O.assert_same_bits(np.asarray(q.codes), ref["codes"], "codes")


# ------------------------------------------------------------------------------ rounding modes

TIE_X = np.array([4, .25, .75, 1.25, 1.75, 2.5, 3.5, 5, -.25, -.75, -1.25, -2.5, -5, .1, -.1,
                  5.9, -0., 0.], np.float32)
TIE_WANT = {  # block amax 5.9 -> k = 0: the e2m1 grid itself
    "nearest_even": [4, 0, 1, 1, 2, 2, 4, 4, -0., -1, -1, -2, -4, 0, -0., 6, -0., 0],
    "nearest_away": [4, .5, 1, 1.5, 2, 3, 4, 6, -.5, -1, -1.5, -3, -6, 0, -0., 6, -0., 0],
    "toward_zero": [4, 0, .5, 1, 1.5, 2, 3, 4, -0., -.5, -1, -2, -4, 0, -0., 4, -0., 0],
    "toward_positive": [4, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -2, -4, .5, -0., 6, -0., 0],
    "toward_negative": [4, 0, .5, 1, 1.5, 2, 3, 4, -.5, -1, -1.5, -3, -6, 0, -.5, 4, -0., 0],
}
AWAY_FROM_ZERO = [4, .5, 1, 1.5, 2, 3, 4, 6, -.5, -1, -1.5, -3, -6, .5, -.5, 6, -0., 0]
SAT_X = np.array([7.5, 6.5, 7.0, -7.9, 6.0, -6.0, float(nxt(8, 0))], np.float32)


def _tie_input():
  return canon([TIE_X, SAT_X])


@pytest.mark.parametrize("rounding", sorted(TIE_WANT))
def test_mxfp4_rounding_modes_by_hand(rounding):
  x = _tie_input()
  q, codes, scales, vals = run(x, "mxfp4", rounding=rounding)
  O.assert_same_bits(scales[0, :2], np.array([127, 127], np.uint8), "scales")
  want = canon([TIE_WANT[rounding], np.sign(SAT_X) * 6])   # [6, 8) saturates to 6 in every mode
  O.assert_same_bits(vals, want, f"{rounding} values")
  table = O.decode_table("e2m1")
  O.assert_same_bits(table[codes], want, "codes decode to the values")
  check_oracle(q, x, "mxfp4", rounding=rounding)


def test_mxfp4_stochastic_picks_a_neighbour():
  x = _tie_input()
  for seed in range(3):
    key = jax.random.key(seed)
    q, _, _, vals = run(x, "mxfp4", rounding="stochastic", key=key)
    lo = np.array(TIE_WANT["toward_zero"], np.float32)
    hi = np.array(AWAY_FROM_ZERO, np.float32)
    got = vals[0, :len(TIE_X)]
    assert np.all((got == lo) | (got == hi)), got
    O.assert_same_bits(vals[0, 32:32 + len(SAT_X)], (np.sign(SAT_X) * 6).astype(np.float32),
                       "sat")
    bits = np.asarray(quant.random_bits(key, x.shape))
    check_oracle(q, x, "mxfp4", rounding="stochastic", rbits=bits)


# ------------------------------------------------------------------------------ above max normal

SAT_CASES = [  # fmt, inputs (block amax sets k = 0), expected code of every input
    ("mxfp8_e4m3", [500, 479, 464, -500, 448, 449, -464], [0x7E] * 3 + [0xFE, 0x7E, 0x7E, 0xFE]),
    ("mxfp8_e5m2", [60000, 63000, 65000, 57344, -61440, 61439], [0x7B] * 4 + [0xFB, 0x7B]),
    ("mxfp6_e3m2", [31, 30, 29, 28, -31], [0x1F] * 4 + [0x3F]),
    ("mxfp6_e2m3", [7.99, 7.9, 7.75, 7.5, -7.99], [0x1F] * 4 + [0x3F]),
]


@pytest.mark.parametrize("rounding", ["nearest_even", "nearest_away", "toward_positive"])
@pytest.mark.parametrize("fmt,xs,want", SAT_CASES)
def test_saturation_above_max_normal(fmt, xs, want, rounding):
  x = canon([xs])
  q, codes, scales, vals = run(x, fmt, rounding=rounding)
  assert scales[0, 0] == 127
  # (negative inputs under toward_positive truncate, but to a value that still saturates)
  O.assert_same_bits(codes[0, :len(xs)], np.array(want, np.uint8), "codes")
  assert np.all(np.isfinite(vals)), "saturation must never produce NaN or Inf"
  check_oracle(q, x, fmt, rounding=rounding)


# ------------------------------------------------------------------------------ NaN / Inf

def _nonfinite_input():
  rng = np.random.default_rng(7)
  x = rng.standard_normal(CANON).astype(np.float32)
  x[0, 5] = np.nan
  x[1, 40] = np.inf
  x[2, 70] = -np.inf
  x[2, 96:] = 0.0
  return x


# fmt, blocked-group size along the last axis, scale byte/value of a non-finite group
NONFINITE_FMTS = [(f, 32, np.uint8(0xFF)) for f in MX] + [
    ("nvfp4", 16, np.uint8(0x7F)), ("int8_g128", 128, F32(np.nan)),
    ("int4_channel", 128, F32(np.nan)), ("nf4", 64, F32(np.nan)),
    ("uint4_g128", 128, F32(np.nan))]


@pytest.mark.parametrize("fmt,bsz,bad_scale", NONFINITE_FMTS)
def test_nonfinite_blocks(fmt, bsz, bad_scale):
  x = _nonfinite_input()
  q, codes, scales, vals = run(x, fmt)
  bad = np.zeros((16, 128 // bsz), bool)
  bad[0, 5 // bsz] = bad[1, 40 // bsz] = bad[2, 70 // bsz] = True
  O.assert_same_bits(scales[bad], np.full(bad.sum(), bad_scale), "non-finite block scales")
  assert np.all(np.isfinite(scales[~bad].astype(np.float32)))
  if scales.dtype == np.uint8:
    assert not np.any(scales[~bad] == bad_scale)
  badel = np.repeat(bad, bsz, axis=1)
  assert np.all(codes[badel] == 0), "codes of a non-finite block are 0"
  assert np.all(np.isnan(vals[badel])), "a non-finite block dequantizes to NaN"
  assert np.all(np.isfinite(vals[~badel]))
  if fmt == "nvfp4":
    assert np.asarray(q.tensor_scale) == np.max(np.abs(x[np.isfinite(x)]))
  check_oracle(q, x, fmt)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_nonfinite_per_tensor(fmt):
  x = _nonfinite_input()
  q, codes, scales, vals = run(x, fmt)
  assert scales.shape == () and np.isnan(scales)
  assert np.all(codes == 0) and np.all(np.isnan(vals))
  fin = np.nan_to_num(x, nan=0, posinf=0, neginf=0)
  q2, _, s2, v2 = run(fin, fmt)
  assert np.isfinite(s2) and np.all(np.isfinite(v2))
  check_oracle(q2, fin, fmt)


# ------------------------------------------------------------------------------ zeros and signs

def _zero_sign_input():
  x = np.zeros(CANON, np.float32)
  x[1] = -0.0
  x[2, :6] = [1.0, -0.0, -1e-12, 0.0, -0.1, -1e-40]
  x[3, :3] = [-0.0, -2.0 ** -149, 0.0]
  return x


@pytest.mark.parametrize("fmt", MX + ["nvfp4"])
def test_zero_blocks_and_negative_zero(fmt):
  x = _zero_sign_input()
  q, codes, scales, vals = run(x, fmt)
  nz = NEG_ZERO_CODE[fmt]
  if fmt == "nvfp4":
    # amax_t = 1: blocks of zeros get s_b = 0 (byte 0); the row-2 block has s_b = 448.
    O.assert_same_bits(scales[:4, 0], np.array([0, 0, 0x7E, 0], np.uint8), "scales")
  else:
    # amax = 0 -> 0x00; row 2: amax 1 -> k = -emax
    assert scales[0, 0] == 0 and scales[1, 0] == 0
    assert scales[2, 0] == 127 - O.ELEMENTS[O.PRESETS[fmt].element].emax
  assert np.all(codes[0] == 0) and np.all(codes[1] == nz)
  O.assert_same_bits(vals[1], np.full(128, -0.0, np.float32), "-0 block")
  O.assert_same_bits(vals[0], np.zeros(128, np.float32), "+0 block")
  assert codes[2, 1] == nz and codes[2, 2] == nz and codes[2, 5] == nz and codes[2, 3] == 0
  assert np.signbit(vals[2, 2]) and vals[2, 2] == 0
  assert codes[3, 0] == nz and codes[3, 1] == nz and codes[3, 2] == 0
  check_oracle(q, x, fmt)


@pytest.mark.parametrize("fmt", ["int8_g128", "int4_channel", "fp8_e4m3"])
def test_zero_and_negative_zero_fp32_scale(fmt):
  x = np.zeros(CANON, np.float32)
  x[1::2] = -0.0
  q, codes, scales, vals = run(x, fmt)
  assert np.all(scales == 1.0), "amax = 0 gives enc = 1, stored scale 1"
  assert np.all(codes[0] == 0)
  assert np.all(codes[1] == (0x80 if fmt == "fp8_e4m3" else 0)), "ints have no -0"
  check_oracle(q, x, fmt)


def test_all_zero_nvfp4_tensor():
  x = np.zeros(CANON, np.float32)
  x[1::2] = -0.0
  q, codes, scales, vals = run(x, "nvfp4")
  assert np.asarray(q.tensor_scale) == 0 and np.all(scales == 0)
  assert np.all(codes[0::2] == 0) and np.all(codes[1::2] == 8)
  O.assert_same_bits(vals, x, "values")
  check_oracle(q, x, "nvfp4")


# ------------------------------------------------------------------------------ fp32 subnormals

def test_mx_subnormal_block_is_exact():
  """Blocks whose amax is an fp32 subnormal: scale 2^-127 (byte 0), and the subnormal inputs
  that are grid values times 2^-127 come back bit-exactly (no flush to zero anywhere)."""
  x = np.zeros(CANON, np.float32)
  x[0, :7] = np.ldexp(np.array([1.5, 1, -1.5, .5, -.5, -1, 0]), -127)              # mxfp4
  x[1, :8] = np.ldexp(np.array([1, 2, 3, 5, 7, 12, -1, -3.]), -140)                # e5m2
  x[2, :4] = np.ldexp(np.array([1, -1, 3, 0.]), -149)
  assert np.all(np.abs(x) < 2.0 ** -126)
  q, codes, scales, vals = run(x, "mxfp4")
  assert scales[0, 0] == 0
  O.assert_same_bits(vals[0], x[0], "mxfp4 subnormal round trip")
  q, codes, scales, vals = run(x, "mxfp8_e5m2")
  assert np.all(scales[:3, 0] == 0)
  O.assert_same_bits(vals[1], x[1], "e5m2 subnormal round trip")
  # 2^-149 * 2^127 = 2^-22 is below e5m2's smallest subnormal 2^-16 / 2: it rounds to +-0
  O.assert_same_bits(vals[2], np.where(np.signbit(x[2]), -0.0, 0.0).astype(np.float32), "tiny")
  check_oracle(q, x, "mxfp8_e5m2")


@pytest.mark.parametrize("mode", O.SCALE_MODES)
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3", "mxfp6_e3m2"])
def test_mx_subnormal_amax_all_modes(fmt, mode):
  rng = np.random.default_rng(11)
  x = (rng.standard_normal(CANON) * np.array([1e-39, 1e-41, 1e-44, 3e-38] * 4)[:, None])
  x = x.astype(np.float32)
  q, codes, scales, vals = run(x, fmt, scale_mode=mode)
  ref = check_oracle(q, x, fmt, scale_mode=mode)
  assert np.all(scales[0:3] == 0)
  if fmt == "mxfp8_e4m3":
    assert np.any(vals[0] != 0), "1e-39 * 2^127 is well inside e4m3: must not flush"
    assert np.all(np.abs(ref["values"][0][vals[0] != 0]) < 2.0 ** -126)


def test_normal_block_with_subnormal_elements():
  x = canon([[1.0, 1e-40, -1e-40, 2.0 ** -149, -2.0 ** -149]])
  q, codes, scales, vals = run(x, "mxfp8_e4m3")
  assert scales[0, 0] == 127 - 8
  O.assert_same_bits(codes[0, :5], np.array([0x78, 0, 0x80, 0, 0x80], np.uint8), "codes")
  check_oracle(q, x, "mxfp8_e4m3")


def test_fp8_per_tensor_all_subnormal():
  """amax subnormal: enc = min(448 / amax, FLT_MAX) = FLT_MAX; stored scale fl32(1/FLT_MAX) is
  the subnormal 2^-128; 1e-40 * FLT_MAX = 0.0340.. -> e4m3 9 * 2^-8; value 9 * 2^-136."""
  x = canon([[1e-40, -3e-41, 2.0 ** -149, 0.0]])
  q, codes, scales, vals = run(x, "fp8_e4m3")
  O.assert_same_bits(scales, np.array(2.0 ** -128, np.float32), "scale")
  assert vals[0, 0] == np.float32(9 * 2.0 ** -136) and vals[0, 1] < 0
  check_oracle(q, x, "fp8_e4m3")


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4_16x16"])
def test_nvfp4_all_subnormal_tensor(fmt):
  rng = np.random.default_rng(5)
  x = (rng.standard_normal(CANON) * 1e-39).astype(np.float32)
  x[0, 0] = 2.0 ** -149
  q, codes, scales, vals = run(x, fmt)
  assert np.asarray(q.tensor_scale) == np.max(np.abs(x)) and np.max(np.abs(x)) < 2.0 ** -126
  assert np.all(scales > 0), "block scales are non-zero e4m3 subnormals here"
  check_oracle(q, x, fmt)


# ------------------------------------------------------------------------------ padding

@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3", "nvfp4", "nvfp4_16x16", "int4_g128",
                                 "nf4", "uint4_g128"])
def test_zero_padding_is_invisible(fmt):
  """A ragged length behaves exactly like the zero-padded array, with the padding dropped."""
  shape = RAGGED
  x = O.heavy_tailed(shape, 1, exp_range=4)
  xp = np.zeros(CANON, np.float32)
  xp[:shape[0], :shape[1]] = x
  q, codes, scales, vals = run(x, fmt)
  qp, codesp, scalesp, valsp = run(xp, fmt)
  O.assert_same_bits(scales, scalesp[tuple(slice(0, s) for s in scales.shape)], "scales")
  O.assert_same_bits(codes, codesp[:shape[0], :shape[1]], "codes")
  O.assert_same_bits(vals, valsp[:shape[0], :shape[1]], "values")
  if O.elem_bits(fmt) == 4:
    assert np.asarray(q.codes).shape == (shape[0], (shape[1] + 1) // 2)
    assert not np.any(np.asarray(q.codes)[:, -1] >> 4), "odd length: zero high nibble"
  check_oracle(q, x, fmt)

