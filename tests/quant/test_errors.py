"""Errors (docs/quant.md "Errors"): the exception type and, for unknown names, a message that
lists every valid name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax import quant

X = jnp.ones((16, 128), jnp.float32)   # the shape the other quant tests use
ROUNDINGS = ["nearest_even", "nearest_away", "toward_zero", "toward_positive", "toward_negative",
             "stochastic"]
SCALE_MODES = ["floor", "ceil", "even", "rceil"]
ELEMENTS = ["e2m1", "e2m3", "e3m2", "e4m3", "e5m2", "int8", "int4", "uint4", "nf4"]
SCALES = ["e8m0", "ue4m3", "fp32"]


def _presets():
  return list(quant.FORMAT_NAMES)


# (call, names that the message must list)
UNKNOWN_NAME_CASES = {
    "format": (lambda: quant.quantize(X, "mxfp5"), _presets),
    "format (fake_quant)": (lambda: quant.fake_quant(X, "nvfp8"), _presets),
    "format (get_format)": (lambda: quant.get_format("MXFP4 "), _presets),
    "rounding": (lambda: quant.quantize(X, "mxfp4", rounding="nearest"), lambda: ROUNDINGS),
    "rounding (fake_quant)": (lambda: quant.fake_quant(X, "nvfp4", rounding="floor"),
                              lambda: ROUNDINGS),
    "rounding (fp32 scale)": (lambda: quant.quantize(X, "int8_g128", rounding="rtn"),
                              lambda: ROUNDINGS),
    "scale_mode": (lambda: quant.quantize(X, "mxfp4", scale_mode="round"),
                   lambda: SCALE_MODES),
    "scale_mode (fake_quant)": (lambda: quant.fake_quant(X, "mxfp8_e4m3", scale_mode="nearest"),
                                lambda: SCALE_MODES),
    "element": (lambda: quant.quantize(X, quant.QuantFormat(element="e3m3", scale="e8m0",
                                                            block_size=32)),
                lambda: ELEMENTS),
    "scale format": (lambda: quant.quantize(X, quant.QuantFormat(element="e2m1", scale="e5m0",
                                                                 block_size=32)),
                     lambda: SCALES),
}


@pytest.mark.parametrize("case", sorted(UNKNOWN_NAME_CASES))
def test_unknown_name_raises_value_error_listing_valid_names(case):
  call, names = UNKNOWN_NAME_CASES[case]
  with pytest.raises(ValueError) as info:
    call()
  msg = str(info.value)
  missing = [n for n in names() if n not in msg]
  assert not missing, f"message {msg!r} does not list {missing}"


BAD_DTYPES = [np.int32, np.int8, np.uint8, np.int16, np.complex64]


@pytest.mark.parametrize("dtype", BAD_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fn", ["quantize", "fake_quant"])
def test_integer_or_complex_input_raises_type_error(fn, dtype):
  x = np.ones((16, 128), dtype)
  with pytest.raises(TypeError):
    getattr(quant, fn)(jnp.asarray(x), "mxfp4")
  with pytest.raises(TypeError):
    getattr(quant, fn)(x, "nvfp4")


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "int4_g128", "fp8_e4m3"])
@pytest.mark.parametrize("fn", ["quantize", "fake_quant"])
def test_stochastic_without_key_raises_value_error(fn, fmt):
  with pytest.raises(ValueError):
    getattr(quant, fn)(X, fmt, rounding="stochastic")
  with pytest.raises(ValueError):
    getattr(quant, fn)(X, fmt, rounding="stochastic", key=None)


@pytest.mark.parametrize("axis", [2, -3, 17])
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "int8_channel"])
@pytest.mark.parametrize("fn", ["quantize", "fake_quant"])
def test_bad_axis_raises_value_error(fn, fmt, axis):
  with pytest.raises(ValueError):
    getattr(quant, fn)(X, fmt, axis=axis)


def test_valid_calls_do_not_raise():
  """The error cases above differ from valid calls only in the faulty argument."""
  quant.quantize(X, "mxfp4", rounding="stochastic", key=jax.random.key(0), axis=-2)
  quant.fake_quant(X, "nvfp4", scale_mode=None, axis=1)
  quant.quantize(X, "mxfp4", scale_mode="rceil", rounding="toward_zero")
  quant.quantize(X, quant.QuantFormat(element="e2m1", scale="ue4m3", block_size=32))
  quant.quantize(np.ones((16, 128), np.float64), "int8_channel")


def test_nf4_rejects_other_roundings():
  """docs/quant.md: nf4 supports nearest_even only."""
  with pytest.raises((ValueError, NotImplementedError)):
    quant.quantize(X, "nf4", rounding="stochastic", key=jax.random.key(0))
  with pytest.raises((ValueError, NotImplementedError)):
    quant.quantize(X, "nf4", rounding="toward_zero")
