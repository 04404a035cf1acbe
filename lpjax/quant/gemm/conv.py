"""Quantized convolution: `conv_general_dilated` as im2col patches times the kernel, via `dot_general`.

A convolution is a GEMM whose contraction axis is (kernel window x input channels). Building the
patch matrix explicitly (im2col: one strided slice of the padded, dilated input per kernel tap)
and running the product through `lpjax.quant.gemm.dot_general.dot_general` makes all three of the conv's
GEMMs follow the recipe exactly as a linear layer's do:

    fwd:   Y  = Q(P along taps x C) Q(W along taps x C)
    dgrad: dP = Q(dY along O) Q(W along O)^T, then dX = col2im(dP) (the transpose of the slicing)
    wgrad: dW = Q(P along tokens)^T Q(dY along tokens)       (tokens = batch x output positions)

The contraction axis is ordered tap-major, channel-minor, so a block of 32 covers 32 input
channels at one kernel tap whenever C % 32 == 0: quantizing the patches then equals quantizing
the NHWC input along its channels (what an implicit-GEMM FP4 convolution does). The cost of
this emulation is the patch matrix: kernel-size times the input's memory (and, with
residuals="quantized", the packed patches are what the backward pass keeps).

Examples:
  >>> import jax, jax.numpy as jnp
  >>> x = jax.random.normal(jax.random.key(0), (2, 8, 8, 32))     # NHWC
  >>> w = jax.random.normal(jax.random.key(1), (3, 3, 32, 16))    # HWIO
  >>> conv = lambda x, w, recipe: conv_general_dilated(
  ...     x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), recipe=recipe)
  >>> jax.jit(conv, static_argnums=2)(x, w, "mxfp4_naive").shape
  (2, 8, 8, 16)
  >>> ref = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
  >>> bool(jnp.allclose(jax.jit(conv, static_argnums=2)(x, w, "fp32"), ref, atol=1e-4))
  True
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp

from lpjax.quant.gemm.dot_general import dot_general, operand_stats


def conv_padding(padding, in_spatial, window, strides, rhs_dilation, lhs_dilation):
  if isinstance(padding, str):
    if any(d != 1 for d in lhs_dilation):
      raise ValueError("String padding is not supported with lhs_dilation (transposed convolution); "
                       "give explicit (low, high) pairs, as jax.lax.conv_general_dilated requires.")
    eff = [(k - 1) * r + 1 for k, r in zip(window, rhs_dilation)]
    return [tuple(p) for p in jax.lax.padtype_to_pads(in_spatial, eff, strides, padding)]
  pads = [tuple(int(v) for v in p) for p in padding]
  if len(pads) != len(window):
    raise ValueError(f"padding needs one (low, high) pair per spatial dimension, got {padding}.")
  return pads


def patches(x, window, strides, pads, lhs_dilation, rhs_dilation):
  """im2col of canonical x (N, *spatial, C): (N, *out_spatial, taps, C), taps in row-major order."""
  nsp = len(window)
  config = [(0, 0, 0)] + [(lo, hi, d - 1) for (lo, hi), d in zip(pads, lhs_dilation)] + [(0, 0, 0)]
  xp = jax.lax.pad(x, jnp.zeros((), x.dtype), config)
  out = [(xp.shape[1 + i] - (window[i] - 1) * rhs_dilation[i] - 1) // strides[i] + 1 for i in range(nsp)]
  if any(o <= 0 for o in out):
    raise ValueError(f"The kernel window {window} (dilation {rhs_dilation}) does not fit the padded "
                     f"input {xp.shape[1:-1]}.")
  taps = []
  for tap in itertools.product(*(range(k) for k in window)):
    start = (0,) + tuple(t * r for t, r in zip(tap, rhs_dilation)) + (0,)
    limit = ((xp.shape[0],) + tuple(s + (o - 1) * st + 1 for s, o, st in zip(start[1:], out, strides))
             + (xp.shape[-1],))
    taps.append(jax.lax.slice(xp, start, limit, (1,) + tuple(strides) + (1,)))
  return jnp.stack(taps, axis=-2)


def conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
                         dimension_numbers=None, feature_group_count: int = 1,
                         batch_group_count: int = 1, *, recipe, key=None,
                         preferred_element_type=None):
  """`jax.lax.conv_general_dilated` with its three GEMMs quantized by `recipe` (im2col, see above).

  Takes lax's arguments (strings or explicit padding, dilations, any dimension_numbers,
  feature groups) plus the recipe (a GemmRecipe or preset name) and the SR key.
  `batch_group_count` > 1 is not supported.
  """
  if batch_group_count != 1:
    raise NotImplementedError("batch_group_count > 1 is not supported by the quantized convolution.")
  lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
  nsp = lhs.ndim - 2
  dn = jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
  lhs_spec, rhs_spec, out_spec = dn
  x = jnp.transpose(lhs, (lhs_spec[0], *lhs_spec[2:], lhs_spec[1]))  # (N, *S, C)
  w = jnp.transpose(rhs, (*rhs_spec[2:], rhs_spec[1], rhs_spec[0]))  # (*window, I, O)
  window = w.shape[:nsp]
  strides = tuple(window_strides)
  lhs_dilation = tuple(lhs_dilation or (1,) * nsp)
  rhs_dilation = tuple(rhs_dilation or (1,) * nsp)
  pads = conv_padding(padding, x.shape[1:-1], window, strides, rhs_dilation, lhs_dilation)
  g = feature_group_count
  c, (cg, o) = x.shape[-1], w.shape[-2:]
  if c != g * cg or o % g:
    raise ValueError(f"Input features {c} and kernel (I={cg}, O={o}) do not fit "
                     f"feature_group_count={g}.")
  p = patches(x, window, strides, pads, lhs_dilation, rhs_dilation)  # (N, *out, T, C)
  taps = math.prod(window)
  t_ax, c_ax = nsp + 1, nsp + 2
  if g == 1:
    y = dot_general(p, w.reshape(taps, c, o), (((t_ax, c_ax), (0, 1)), ((), ())), recipe,
                    key=key, preferred_element_type=preferred_element_type)
  else:
    p = p.reshape(p.shape[:-1] + (g, cg))  # (N, *out, T, G, Cg)
    wg = w.reshape(taps, cg, g, o // g)  # (T, Cg, G, Og)
    y = dot_general(p, wg, (((t_ax, c_ax + 1), (0, 1)), ((c_ax,), (2,))), recipe,
                    key=key, preferred_element_type=preferred_element_type)  # (G, N, *out, Og)
    y = jnp.moveaxis(y, 0, -2).reshape(y.shape[1:-1] + (o,))
  perm = [0] * lhs.ndim
  perm[out_spec[0]], perm[out_spec[1]] = 0, nsp + 1
  for i in range(nsp):
    perm[out_spec[2 + i]] = 1 + i
  return jnp.transpose(y, perm)


def conv_operand_stats(x, kernel, window_strides, padding, *, lhs_dilation=None,
                       rhs_dilation=None, feature_group_count: int = 1, recipe, key=None):
  """`operand_stats` of the forward im2col GEMM of a channels-last convolution (x (N, *spatial,
  C), kernel (*window, C / groups, out)); grouped convolutions report their first group's GEMM."""
  n = kernel.ndim - 2
  window = kernel.shape[:n]
  lhs_dilation = tuple(lhs_dilation or (1,) * n)
  rhs_dilation = tuple(rhs_dilation or (1,) * n)
  pads = conv_padding(padding, x.shape[1:-1], window, window_strides, rhs_dilation, lhs_dilation)
  p = patches(x, window, window_strides, pads, lhs_dilation, rhs_dilation)
  if feature_group_count == 1:
    k = kernel.reshape((-1,) + kernel.shape[-1:])
  else:
    out_per_group = kernel.shape[-1] // feature_group_count
    p = p[..., :kernel.shape[-2]]
    k = kernel[..., :out_per_group].reshape(-1, out_per_group)
  p = p.reshape(p.shape[:-2] + (-1,))
  return operand_stats(p, k, (((p.ndim - 1,), (0,)), ((), ())), recipe, key=key)
