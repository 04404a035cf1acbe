"""Quantized convolutions: the conv's three GEMMs against a numpy im2col / col2im computation."""

import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from gemm_reference import _assert_close, _c, ref_operand  # noqa: E402  (the GEMM operand reference)

from lpjax.quant import recipes  # noqa: E402
from lpjax.quant.gemm.conv import conv_general_dilated  # noqa: E402
from lpjax.quant.codec.qarray import fake_quant  # noqa: E402
from lpjax.quant.recipes.gemm_recipe import GemmRecipe, OperandQuant  # noqa: E402

NHWC = ("NHWC", "HWIO", "NHWC")


def _normal(seed, shape, scale=1.0):
  return np.asarray(jax.random.normal(jax.random.key(seed), shape), np.float32) * np.float32(scale)


# --- numpy im2col / col2im (NHWC input, HWIO kernel) --------------------------------------------


def np_padded(x, pads, lhs_dil):
  n, h, w, c = x.shape
  (lo_h, hi_h), (lo_w, hi_w) = pads
  hd, wd = (h - 1) * lhs_dil[0] + 1, (w - 1) * lhs_dil[1] + 1
  xp = np.zeros((n, lo_h + hd + hi_h, lo_w + wd + hi_w, c), x.dtype)
  xp[:, lo_h:lo_h + hd:lhs_dil[0], lo_w:lo_w + wd:lhs_dil[1]] = x
  return xp


def np_out_size(xp, window, strides, rhs_dil):
  return [(xp.shape[1 + i] - (window[i] - 1) * rhs_dil[i] - 1) // strides[i] + 1 for i in range(2)]


def np_im2col(x, window, strides, pads, lhs_dil=(1, 1), rhs_dil=(1, 1)):
  """(N*OH*OW, KH*KW*C): rows = output positions, columns tap-major, channel-minor."""
  xp = np_padded(x, pads, lhs_dil)
  oh, ow = np_out_size(xp, window, strides, rhs_dil)
  cols = []
  for i in range(window[0]):
    for j in range(window[1]):
      r0, c0 = i * rhs_dil[0], j * rhs_dil[1]
      cols.append(xp[:, r0:r0 + (oh - 1) * strides[0] + 1:strides[0],
                     c0:c0 + (ow - 1) * strides[1] + 1:strides[1]])
  p = np.stack(cols, axis=3)  # (N, OH, OW, T, C)
  return p.reshape(-1, p.shape[3] * p.shape[4]), (oh, ow)


def np_col2im(dp, x_shape, window, strides, pads, lhs_dil=(1, 1), rhs_dil=(1, 1)):
  """The transpose of np_im2col: scatter-add patch gradients back onto the input."""
  n, h, w, c = x_shape
  xp = np.zeros(np_padded(np.zeros(x_shape), pads, lhs_dil).shape)
  oh, ow = np_out_size(xp, window, strides, rhs_dil)
  dp = dp.reshape(n, oh, ow, window[0] * window[1], c)
  t = 0
  for i in range(window[0]):
    for j in range(window[1]):
      r0, c0 = i * rhs_dil[0], j * rhs_dil[1]
      xp[:, r0:r0 + (oh - 1) * strides[0] + 1:strides[0],
         c0:c0 + (ow - 1) * strides[1] + 1:strides[1]] += dp[:, :, :, t]
      t += 1
  (lo_h, _), (lo_w, _) = pads
  return xp[:, lo_h:lo_h + (h - 1) * lhs_dil[0] + 1:lhs_dil[0], lo_w:lo_w + (w - 1) * lhs_dil[1] + 1:lhs_dil[1]]


def ref_conv(x, w, dy, recipe, key, strides, pads):
  """(Y, dX, dW) of the conv's three GEMMs per the recipe, in numpy."""
  window = w.shape[:2]
  p, (oh, ow) = np_im2col(x, window, strides, pads)
  wm = w.reshape(-1, w.shape[-1])  # (T*C, O), same tap-major order
  dym = dy.reshape(-1, dy.shape[-1])
  r = recipe
  y = _c(ref_operand(p, r.fwd.lhs, key, "fwd", 0, r.fwd.hadamard_block), r) @ _c(
      ref_operand(wm.T, r.fwd.rhs, key, "fwd", 1, r.fwd.hadamard_block), r).T
  b = r.dgrad.hadamard_block
  dp = _c(ref_operand(dym, r.dgrad.lhs, key, "dgrad", 0, b), r) @ _c(
      ref_operand(wm, r.dgrad.rhs, key, "dgrad", 1, b), r).T
  b = r.wgrad.hadamard_block
  dw = _c(ref_operand(p.T, r.wgrad.lhs, key, "wgrad", 0, b), r) @ _c(
      ref_operand(dym.T, r.wgrad.rhs, key, "wgrad", 1, b), r).T
  dx = np_col2im(dp[:, :p.shape[1]], x.shape, window, strides, pads)
  return y.reshape(dy.shape), dx, dw.reshape(w.shape)


def _vjp(recipe, strides, pads, dn=NHWC, **kw):
  @jax.jit
  def f(x, w, dy, key):
    fn = lambda x, w: conv_general_dilated(x, w, strides, pads, dimension_numbers=dn, recipe=recipe,
                                           key=key, **kw)
    y, vjp = jax.vjp(fn, x, w)
    return (y,) + vjp(dy)
  return f


# --- tests -------------------------------------------------------------------------------------

CONFIGS = {
    "same_s1": dict(x=(2, 7, 7, 8), w=(3, 3, 8, 6), strides=(1, 1), padding="SAME", dn=NHWC),
    "valid_s2_nchw_dilated": dict(x=(2, 8, 9, 9), w=(6, 8, 3, 3), strides=(2, 1), padding="VALID",
                                  dn=("NCHW", "OIHW", "NCHW"), rhs_dilation=(1, 2)),
    "grouped_explicit": dict(x=(2, 6, 6, 8), w=(3, 3, 4, 6), strides=(1, 1),
                             padding=((2, 0), (1, 1)), dn=NHWC, feature_group_count=2),
    "transposed_1d": dict(x=(2, 5, 8), w=(3, 8, 4), strides=(1,), padding=((2, 2),),
                          dn=("NWC", "WIO", "NWC"), lhs_dilation=(2,)),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_high_precision_conv_equals_lax(name):
  cfg = dict(CONFIGS[name])
  x, w = _normal(0, cfg.pop("x")), _normal(1, cfg.pop("w"))
  strides, padding, dn = cfg.pop("strides"), cfg.pop("padding"), cfg.pop("dn")

  def run(conv):
    y, vjp = jax.vjp(lambda x, w: conv(x, w, strides, padding, dimension_numbers=dn, **cfg), x, w)
    return (y,) + vjp(jnp.cos(y))

  got = jax.jit(lambda: run(lambda *a, **k: conv_general_dilated(*a, **k, recipe="fp32")))()
  lax_conv = lambda *a, **k: jax.lax.conv_general_dilated(*a, **k, precision=jax.lax.Precision.HIGHEST)
  want = jax.jit(lambda: run(lax_conv))()
  for g, r in zip(got, want):  # different summation orders: tolerance relative to the scale
    assert g.shape == r.shape
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5,
                               atol=1e-5 * float(jnp.abs(r).max()))


@pytest.mark.parametrize("name", ["mxfp4"])  # SR + RHT (the GEMM tests cover every preset)
def test_conv_gemms_use_the_recipe_operands(name):
  """Forward, dgrad (then col2im) and wgrad of a quantized conv equal the numpy computation."""
  recipe = recipes.get(name)
  x, w = _normal(2, (2, 7, 7, 16)), _normal(3, (3, 3, 16, 24), 0.1)
  dy = _normal(4, (2, 4, 4, 24), 1e-3)
  strides, pads = (2, 2), ((1, 1), (1, 1))
  key = jax.random.key(11)
  y, dx, dw = _vjp(recipe, strides, pads)(x, w, dy, key)
  ry, rdx, rdw = ref_conv(x, w, dy, recipe, key, strides, pads)
  _assert_close(y, ry, f"{name} fwd")
  _assert_close(dx, rdx, f"{name} dgrad")
  _assert_close(dw, rdw, f"{name} wgrad")
  if name == "mxfp4":  # the memory-saving residuals give the same gradients
    q = _vjp(dataclasses.replace(recipe, residuals="quantized"), strides, pads)(x, w, dy, key)
    for a, b in zip(q, (y, dx, dw)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_blocks_are_input_channels_at_one_tap():
  """With C % 32 == 0, quantizing the patches = quantizing the NHWC input along its channels."""
  x, w = _normal(5, (2, 6, 6, 32)), _normal(6, (3, 3, 32, 8))
  recipe = GemmRecipe(fwd=(OperandQuant("mxfp4"), None), compute_dtype=jnp.float32)

  @jax.jit
  def both(x, w):
    got = conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC, recipe=recipe)
    xq = fake_quant(x, "mxfp4", axis=-1)
    want = jax.lax.conv_general_dilated(xq, w, (1, 1), "SAME", dimension_numbers=NHWC,
                                        precision=jax.lax.Precision.HIGHEST)
    return got, want, xq

  got, want, xq = both(x, w)
  assert np.abs(np.asarray(xq) - x).max() > 0.01
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-4)


def test_conv_errors():
  x, w = jnp.ones((1, 4, 4, 4)), jnp.ones((3, 3, 4, 4))
  with pytest.raises(NotImplementedError):
    conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC, batch_group_count=2,
                         recipe="bf16")
  with pytest.raises(ValueError, match="String padding"):
    conv_general_dilated(x, w, (1, 1), "SAME", lhs_dilation=(2, 2), dimension_numbers=NHWC,
                         recipe="bf16")
  with pytest.raises(ValueError, match="feature_group_count"):
    conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC, feature_group_count=3,
                         recipe="bf16")
