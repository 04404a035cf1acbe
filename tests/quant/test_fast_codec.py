"""The fast element path (lpjax/quant/codec/fast_elements.py) on each edge its exactness argument names.

Each case states the expected bits by hand, then checks that the fast path and the integer
reference (`quant.reference_arithmetic`) agree bit for bit on codes, scales and values. The whole
oracle suite also runs on both paths (tests/quant/conftest.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax import quant
from lpjax.quant.codec import fast_elements as fast

F32 = np.float32
KEY = jax.random.key(7)


def _bits(a):
  a = np.asarray(a)
  return a.view(np.uint32) if a.dtype == np.float32 else a


def both(x, fmt, **kw):
  """(quantize, fake_quant, dequantize) on the fast path; asserts the reference gives the same bits."""
  x = jnp.asarray(np.asarray(x, F32))
  if kw.get("rounding") == "stochastic":
    kw["key"] = KEY
  outs = []
  for reference in (False, True):
    ctx = quant.reference_arithmetic() if reference else _null()
    with ctx:
      q = quant.quantize(x, fmt, **kw)
      outs.append((q.codes, q.scales, quant.fake_quant(x, fmt, **kw), quant.dequantize(q)))
  for name, a, b in zip(("codes", "scales", "fake_quant", "dequantize"), *outs):
    np.testing.assert_array_equal(_bits(a), _bits(b), err_msg=f"{name}: fast != reference")
  return outs[0]


class _null:
  def __enter__(self):
    return None

  def __exit__(self, *a):
    return False


def block(*values, n=32):
  """One block of n elements: the given values, then zeros."""
  out = np.zeros((1, n), F32)
  out[0, :len(values)] = values
  return out


def test_supported_and_reference_switch():
  fmt = quant.get_format
  assert fast.supports(fmt("mxfp4"), "toward_positive")
  assert fast.supports(fmt("nvfp4"), "stochastic")
  assert not fast.supports(fmt("nvfp4"), "toward_positive")  # fl32(x * S) may round to 0
  assert not fast.supports(fmt("int8_g128"), "nearest_even")
  assert fast.use_fast_path(fmt("mxfp4"), "nearest_even")
  with quant.reference_arithmetic():
    assert not fast.use_fast_path(fmt("mxfp4"), "nearest_even")
  assert fast.use_fast_path(fmt("mxfp4"), "nearest_even")


def test_subnormal_scale_k127_keeps_the_exact_codec():
  """S = 2**-127 is subnormal (only a fixed exponent of 127 gives it): the exact codec runs."""
  fmt = quant.QuantFormat(element="e2m1", granularity="tensor", block_size=None,
                          fixed_scale_exponent=127)
  assert not fast.supports(fmt, "nearest_even")
  x = np.array([[2.0 ** 127 * 1.5, 2.0 ** 126, -(2.0 ** 120), 0.0]], F32)
  codes, scales, values, _ = both(x, fmt)
  assert int(scales) == 254
  # 1.5 * 2**127 / 2**127 = 1.5 -> code 3; 2**126 / 2**127 = 0.5 -> 1; -2**-7 -> -0 (code 8).
  assert quant.unpack_fp4(codes, 4).tolist() == [[3, 1, 8, 0]]
  np.testing.assert_array_equal(np.asarray(values)[0, :2], [2.0 ** 127 * 1.5, 2.0 ** 126])


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "mxfp8_e4m3"])
def test_constant_inputs_under_jit(fmt):
  """A closed-over constant x lets XLA fold the scales into constants, and XLA reassociates
  (a * C1) * C2 for constants: the fast path must keep the contract's operation order anyway."""
  rng = np.random.default_rng(3)
  x = jnp.asarray((rng.standard_normal((64, 64)) * 3).astype(F32))
  jitted = jax.jit(lambda: quant.fake_quant(x, fmt))()
  with quant.reference_arithmetic():
    ref = quant.fake_quant(x, fmt)
  np.testing.assert_array_equal(_bits(jitted), _bits(ref))


@pytest.mark.parametrize("rounding", ["nearest_even", "toward_positive", "stochastic"])
def test_subnormal_inputs_with_a_large_multiplier(rounding):
  """A block of subnormals: k = -129 - 2 clamps to -127, S = 2**127 >= 2**23: exact float(mant) route."""
  x = block(3 * 2.0 ** -149, -(2.0 ** -130), 2.0 ** -128 * 1.25, 2.0 ** -140)
  codes, scales, values, _ = both(x, "mxfp4", rounding=rounding)
  assert int(scales[0, 0]) == 0  # k = -127
  got = quant.unpack_fp4(codes, 32)[0, :4].tolist()
  # m = x * 2**127: 3 * 2**-22 (-> 0 or min step), -0.125 (-> -0), 0.625 (-> 0.5), 2**-13.
  if rounding == "nearest_even":
    assert got == [0, 8, 1, 0]
    np.testing.assert_array_equal(np.asarray(values)[0, 2], F32(2.0 ** -128))  # subnormal output
  elif rounding == "toward_positive":
    assert got == [1, 8, 2, 1]  # every positive non-zero m rounds up; 0.625 -> 1.0


@pytest.mark.parametrize("rounding", ["nearest_even", "toward_positive", "toward_negative"])
def test_tiny_products_in_a_normal_block(rounding):
  """m = 2**-140 / 2**8 is far below float32's normal range; directed modes still give the min step."""
  x = block(1000.0, 2.0 ** -140, -(2.0 ** -130), 2.0 ** -149, -0.0)
  codes, _, values, _ = both(x, "mxfp4", rounding=rounding)
  got = quant.unpack_fp4(codes, 32)[0, 1:5].tolist()
  want = {"nearest_even": [0, 8, 0, 8], "toward_positive": [1, 8, 1, 8],
          "toward_negative": [0, 9, 0, 8]}[rounding]
  assert got == want


def test_subnormal_inputs_with_a_small_multiplier():
  """S < 2**23 (k > -23): a subnormal x gives m < 2**-103, which rounds to 0 (RTN) or F = 0 (SR)."""
  x = block(1.0, 2.0 ** -140, -(2.0 ** -149))
  for rounding in ("nearest_even", "stochastic"):
    codes, _, values, _ = both(x, "mxfp4", rounding=rounding)
    assert quant.unpack_fp4(codes, 32)[0, 1:3].tolist() == [0, 8]


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2"])
def test_saturation_and_binade_carry(fmt):
  """Values rounding past the top binade saturate; a carry (1.75 -> 2.0 in e2m1) moves binades."""
  f = quant.get_format(fmt)
  top = f.element.max_value
  # With amax = top * 1.1 (below the next power of two) the block scale is 2**0; it saturates.
  x = block(top * 1.1, top, 1.75, 1.9375, 3.5)
  codes, scales, values, _ = both(x, fmt, rounding="nearest_even")
  v = np.asarray(values)[0]
  assert v[0] == top and v[1] == top
  if fmt == "mxfp4":
    assert v[2:5].tolist() == [2.0, 2.0, 4.0]  # ties to even: 1.75 -> 2, 3.5 -> 4


def test_stochastic_fraction_is_exact_near_half():
  """x = 0.25 - 2**-26 in steps of 0.5: t = 0.5 - 2**-25, F = floor(t * 2**32) = 2**31 - 2**7 exactly."""
  x = np.tile(block(6.0, 0.25 - 2.0 ** -26, 1.0 + 2.0 ** -23), (256, 1))
  codes, _, _, _ = both(x, "mxfp4", rounding="stochastic")
  ups = (quant.unpack_fp4(codes, 32)[:, 1] == 1).mean()
  assert 0.4 < float(ups) < 0.6  # up with probability t, just below one half


def test_nvfp4_tiny_tensor_subnormal_outputs():
  """amax_t = 2**-120: decode multipliers below 2**-100 take the shifted route; outputs subnormal."""
  rng = np.random.default_rng(0)
  x = (rng.standard_normal((4, 64)) * 2.0 ** -122).astype(F32)
  for rounding in ("nearest_even", "stochastic"):
    _, _, values, _ = both(x, "nvfp4", rounding=rounding)
    v = np.abs(np.asarray(values))
    assert ((v > 0) & (v < 2.0 ** -126)).any()  # subnormal outputs exist and matched the reference


@pytest.mark.parametrize("log2_amax_t", [-95, -100, -101, -110, -114, -115, -116, -117, -120,
                                         -126, -127, -135, -149])
def test_nvfp4_block_scales_across_the_tensor_range_boundary(log2_amax_t):
  """amax_t on both sides of 2**-100 (where the tail was float32 per block before the tail
  tables), where 1 / S_enc turns subnormal (2688 * 2**-126) and where S_enc saturates at FLT_MAX
  (below 2688 / FLT_MAX): s_b comes from float32 products for every tensor, t, S_enc_b and the
  multiplier from the tensor's tail tables; each block spans amax_t down to subnormal elements,
  with quantized and given amax_t."""
  amax_t = np.float32(2.0 ** log2_amax_t)
  rng = np.random.default_rng(-log2_amax_t)
  rows = []
  for shrink in (0, 3, 9, 20, 40):  # block amax amax_t * 2**-shrink (subnormal or 0 near the end)
    row = rng.uniform(-1, 1, 16) * np.float32(amax_t * np.float32(2.0 ** -shrink))
    row[0] = amax_t * np.float32(2.0 ** -shrink)
    rows.append(row)
  x = np.asarray(rows, F32)
  for rounding in ("nearest_even", "stochastic"):
    both(x, "nvfp4", rounding=rounding)
    both(x, "nvfp4", rounding=rounding, tensor_amax=float(amax_t) * 4.0)


def test_nvfp4_given_infinite_or_nan_tensor_amax_matches_the_reference():
  """A tensor_amax of inf (S_enc = 0, so c = 0) or NaN (S_enc = FLT_MAX) takes the exact tail."""
  x = block(3.0, -1.0, 0.5, 2.0 ** -130, n=16)
  for amax in (np.inf, np.nan):
    both(x, "nvfp4", tensor_amax=amax)


@pytest.mark.parametrize("element", ["e2m1", "e3m2", "e4m3", "e5m2"])
def test_rceil_clamped_from_bounds_equals_the_unclamped_integer_product(element):
  """The monitor's clamped_scales test of an rceil block (`scales_fast.rceil_clamped`: two host
  bounds) against `scales_exact.e8m0_exponent(clamp=False)` out of [-127, 127], on a stride
  through every finite float32 amax and windows around the low bound and the subnormals."""
  from lpjax.quant.codec import scales_exact as scales
  from lpjax.quant.codec import scales_fast as fast_scales
  from lpjax.quant.formats import specs as formats
  el = formats.ELEMENT_FORMATS[element]
  lo, _ = fast_scales._rceil_clamp_bounds(el.max_value)
  bits = np.unique(np.concatenate([np.arange(0, 0x7F800000, 4099), np.arange(lo - 900, lo + 900),
                                   np.arange(0, 1 << 12), np.arange(0x7F7FFF00, 0x7F800000)])
                   ).astype(np.uint32)
  k = jax.jit(lambda b: scales.e8m0_exponent(b, el, "rceil", clamp=False))(jnp.asarray(bits))
  want = np.asarray((k < -127) | (k > 127))
  got = np.asarray(jax.jit(lambda b: fast_scales.rceil_clamped(b, el))(jnp.asarray(bits)))
  assert want.any() and not want.all()
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("element", ["e2m1", "e2m3", "e4m3", "e5m2"])
def test_rceil_exponent_from_thresholds_equals_the_integer_product(element):
  """The fast rceil k (two host thresholds, then a shift of the bits) against `scales_exact`' integer
  product and against numpy (float64 product, one rounding to float32 with gradual underflow), on
  a stride through every float32 amax and on windows around each threshold and binade."""
  from lpjax.quant.codec import scales_fast as fast_scales
  from lpjax.quant.formats import specs as formats
  from lpjax.quant.codec import scales_exact as scales
  el = formats.ELEMENT_FORMATS[element]
  f126, f125 = fast_scales._rceil_bounds(el.max_value)
  windows = [np.arange(f - 600, f + 600) for f in (f126, f125, f125 + (1 << 23), f125 + (40 << 23),
                                                  0x3F800000, 0x7F800000 - 300)]
  bits = np.unique(np.clip(np.concatenate([np.arange(0, 0x7FFFFFFF, 4099)] + windows),
                           0, 0x7FFFFFFF)).astype(np.uint32)
  fast_k = np.asarray(jax.jit(lambda b: fast_scales.rceil_exponent(b, el))(jnp.asarray(bits)))
  exact_k = np.asarray(jax.jit(lambda b: scales.e8m0_exponent(b, el, "rceil"))(jnp.asarray(bits)))
  np.testing.assert_array_equal(fast_k, exact_k)
  finite = bits < 0x7F800000
  ratio = (bits[finite].view(F32).astype(np.float64)
           * np.float64(np.float32(1.0 / el.max_value))).astype(F32)  # exact product, one rounding
  with np.errstate(divide="ignore"):
    _, e = np.frexp(ratio)  # ratio = m 2**e, m in [0.5, 1): ceil(log2) is e, or e - 1 at m = 0.5
  k = np.where(np.frexp(ratio)[0] == 0.5, e - 1, e)
  np.testing.assert_array_equal(fast_k[finite], np.clip(np.where(ratio == 0, -127, k), -127, 127))
  assert (fast_k[~finite] == 127).all()


def test_nvfp4_decode_multiplier_near_flt_max_is_rescaled_on_both_paths():
  """amax_t near FLT_MAX: fl32(s_b * amax_t) would overflow (and 0 * inf give NaN); both paths
  form it at amax_t * 2**-64 (§5), so a zero decodes to +0 and the others stay finite."""
  x = block(3.0e38, -2.0e38, 0.0, 1.0e38, n=16)
  _, _, values, _ = both(x, "nvfp4")
  v = _bits(values)[0]
  assert v[2] == 0  # +0, not NaN
  assert np.isfinite(np.asarray(values)).all()


@pytest.mark.parametrize("fmt", ["fp8_e5m2", "fp8_e4m3", "mxfp6_e2m3:ue4m3"])
@pytest.mark.parametrize("scale_exp", [-128, -120, -100, -95, -60])
def test_wide_elements_decode_subnormal_products_exactly(fmt, scale_exp):
  """e5m2 / e4m3 / e2m3 values times a tiny multiplier: a subnormal output can need up to 28
  bits of the product, which fl32(value * M * 2**149) may already have rounded (double rounding).
  The fast path rounds it from two exact halves; the reference multiplies as integers."""
  if ":" in fmt:  # e2m3 elements with NVFP4-style ue4m3 scales and a tensor scale
    fmt = quant.QuantFormat(element="e2m3", scale="ue4m3", block_size=16, tensor_scale=True)
  assert fast.decodes(quant.get_format(fmt))
  rng = np.random.default_rng(-scale_exp)
  x = rng.standard_normal((16, 64)) * np.exp2(rng.integers(-6, 6, (16, 64)))
  x = (x * 2.0 ** scale_exp).astype(F32)
  _, _, values, _ = both(x, fmt)
  assert np.count_nonzero(np.asarray(values)) > x.size // 2


def test_round_even_of_sum_settles_ties_that_float32_rounding_made():
  """value * m_c = k + 5/8 or k + 3/8 in [2**22, 2**23), where float32 steps are 1/2: fl32 gives
  the tie k + 1/2, whose half-to-even rounding is wrong in one of the two; the exact product's
  rounding is k + 1 and k. Also exact ties and plain cases, against float64 (exact here)."""
  value = 1.125  # 9 / 8: e4m3 1.001b
  cases = []
  for frac, parity in ((5, 0), (3, 1)):  # k + 5/8 with k even, k + 3/8 with k odd
    m = next(m for m in range(3728270, 3728270 + 64)
             if (9 * m) % 8 == frac and ((9 * m) // 8) % 2 == parity)
    cases.append(m)
  round_sum = jax.jit(fast._round_even_of_sum)
  for m in cases + [2**22 + 3, 2**21 + 1, 7 * 2**19 + 5]:
    exact = np.float64(value) * np.float64(m)
    assert exact < 2**23
    got = float(round_sum(jnp.float32(value), jnp.float32(m)))
    assert got == np.round(exact), (m, exact, got)
  naive = [float(np.round(np.float32(value) * np.float32(m))) for m in cases]
  assert naive != [float(np.round(np.float64(value) * m)) for m in cases]  # the double rounding


def test_pack_fp4_is_little_endian_pairs():
  codes = jnp.asarray(np.array([[0x1, 0xF, 0x7, 0x8, 0x3]], np.uint8))
  assert [hex(int(b)) for b in quant.pack_fp4(codes)[0]] == ["0xf1", "0x87", "0x3"]
  assert quant.pack_fp4(codes.T, axis=0)[:, 0].tolist() == [0xF1, 0x87, 0x3]


@pytest.mark.parametrize("amax_t", [0.0, 2.0**-120, 2.0**-100, 1.0, 3.0e38, np.inf])
def test_nvfp4_decode_of_every_scale_byte_matches_the_reference(amax_t):
  """The tail is a per-tensor table indexed by the scale byte: every unsigned e4m3 byte, the NaN
  code 0x7F included, decodes every code as the integer reference does, for tensors whose tail
  was float32 per block before (amax_t >= 2**-100) and for those that took the exact routines.
  (Bytes with the sign bit set are no ue4m3 scale; the paths differ on them, as they did before.)"""
  from lpjax.quant.codec import group_codec as codec
  fmt = quant.get_format("nvfp4")
  scales = jnp.arange(128, dtype=jnp.uint32).reshape(128, 1)
  codes = jnp.tile(jnp.arange(16, dtype=jnp.uint32), (128, 1))
  t = jnp.uint32(np.float32(amax_t).view(np.uint32))
  outs = [jax.jit(lambda c, s, t, f=f: codec.decode(c, s, fmt, tensor_amax_bits=t, fast_path=f))(
      codes, scales, t) for f in (True, False)]
  np.testing.assert_array_equal(np.asarray(outs[0]), np.asarray(outs[1]))
  assert np.isnan(np.asarray(outs[0])[0x7F].view(F32)).all()  # the NaN scale byte
