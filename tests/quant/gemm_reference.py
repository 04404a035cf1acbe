"""The numpy reference of the quantized GEMMs (used by test_gemm.py and test_conv.py).

`ref_operand` and `ref_gemms` re-derive the recipe contract independently: operand layout
(contraction axis last), key derivation (lpjax's counter-hash fold_in by GEMM and operand, in
numpy), RHT signs, zero padding, the 3/4 SR pre-scale, the quantizers of the numpy oracles
(numpy_oracle.py, nvfp4_scheme_oracle.py), QuEST's trust mask; the GEMMs are float64 numpy
products of the compute-dtype operands.
"""

import os
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import numpy_oracle as O  # noqa: E402
import nvfp4_scheme_oracle as S  # noqa: E402

from lpjax.quant.schemes import ssp  # noqa: E402
from lpjax.quant.schemes.hadamard import hadamard  # noqa: E402
from lpjax.quant.codec.qarray import random_bits  # noqa: E402
from lpjax.quant.recipes.gemm_recipe import REUSE_FWD  # noqa: E402

GEMM_ID = {"fwd": 0, "dgrad": 1, "wgrad": 2}


def _oracle_fmt(fmt):
  if isinstance(fmt, str):
    return fmt
  return O.Fmt(fmt.element.name, fmt.scale, fmt.block_size or 0, fmt.granularity, fmt.tile,
               fmt.tensor_scale)


def _sylvester(n):
  h = np.ones((1, 1))
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  return h


M32 = 0xFFFFFFFF


def fmix32(h):
  """MurmurHash3's 32-bit finalizer on Python ints."""
  h ^= h >> 16
  h = (h * 0x85EBCA6B) & M32
  h ^= h >> 13
  h = (h * 0xC2B2AE35) & M32
  return h ^ (h >> 16)


def ref_fold_in(key, tag):
  """Raw uint32 key data of lpjax's counter-hash fold_in(key, tag) (docs/numerics.md §7)."""
  data = np.asarray(jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
                    else key, np.uint32).reshape(-1)
  k0, k1 = int(data[0]), int(data[-1])
  t = fmix32((tag * 0x9E3779B1 + 0x632BE5AB) & M32)
  a = fmix32(k0 ^ t)
  b = fmix32(k1 ^ a ^ 0x2545F491)
  return np.uint32([b, a])


def ref_key(key, gemm, slot):
  """Key data of operand `slot` (0 lhs, 1 rhs) or the RHT signs (2) of `gemm`: fold_in(key, 4g + slot)."""
  return ref_fold_in(key, 4 * GEMM_ID[gemm] + slot)


def ref_signs(key, gemm, block):
  base = jax.random.key(0x5EED) if key is None else key
  top = np.asarray(random_bits(ref_key(base, gemm, 2), (block,))) >> 31
  return np.where(top != 0, -1.0, 1.0).astype(np.float32)


def ref_rotate(x, block, signs):
  """RHT along the last axis of x (zero-padded to a multiple of block), float64 numpy."""
  x = np.asarray(x, np.float64)
  pad = (-x.shape[-1]) % block
  x = np.concatenate([x, np.zeros(x.shape[:-1] + (pad,))], -1) if pad else x
  xb = x.reshape(x.shape[:-1] + (-1, block)) * signs
  return (xb @ _sylvester(block).T / np.sqrt(block)).reshape(x.shape)


def ref_operand(x, op, key, gemm, side, block):
  """Values a GEMM operand takes (float32), x's contraction axis last."""
  x = np.asarray(x, np.float32)
  if block:
    # The transform itself is the core's (tested in float64 in test_rht_*); the quantization
    # must see its exact float32 result.
    pad = (-x.shape[-1]) % block
    xp = np.concatenate([x, np.zeros(x.shape[:-1] + (pad,), np.float32)], -1) if pad else x
    quest = gemm == "fwd" and getattr(op, "scheme", None) == "quest"  # Quartet: no random signs
    signs = np.ones(block, np.float32) if quest else ref_signs(key, gemm, block)
    x = np.asarray(hadamard(jnp.asarray(xp), block, signs=jnp.asarray(signs)))
  if op is None:
    return x
  if op.scheme == "quest":
    return S.quest(x, op.format.block_size)[0]
  if op.scheme:
    k = ref_key(key, gemm, side) if key is not None else None
    if op.scheme == "four_over_six":
      return S.four_over_six(x, tile=op.format.tile, rounding=op.rounding, key=k)
    return S.ms_eden(x, group=op.hadamard_block, key=k)
  if op.sr_prescale is not None:
    x = x * np.float32(op.sr_prescale)
  if op.is_ssp:
    q = np.asarray(ssp.quantize_ssp(jnp.asarray(x), op.fmt))
  else:
    rbits = None
    if op.rounding == "stochastic":
      k = ref_key(key, gemm, side)
      rbits = np.asarray(random_bits(k, x.shape))
    q = O.quantize(x, _oracle_fmt(op.fmt), axis=-1, rounding=op.rounding, scale_mode=op.scale_mode,
                   rbits=rbits)["values"]
  if op.sr_prescale is not None:
    q = q / np.float32(op.sr_prescale)
  return q.astype(np.float32)


def _c(a, recipe):
  """Cast to the compute dtype and widen to float64 for the reference product."""
  a = np.asarray(a, np.float32)
  if recipe.compute_dtype == jnp.bfloat16:
    a = a.astype(ml_dtypes.bfloat16)
  return a.astype(np.float64)


def ref_gemms(x, w, dy, recipe, key):
  """(Y, dX, dW) of Y = X W per the recipe, X (M, K), W (K, N), dY (M, N)."""
  r = recipe
  fx = ref_operand(x, r.fwd.lhs, key, "fwd", 0, r.fwd.hadamard_block)
  fw_t = ref_operand(w.T, r.fwd.rhs, key, "fwd", 1, r.fwd.hadamard_block)  # W^T: K last
  y = _c(fx, r) @ _c(fw_t, r).T
  b = r.dgrad.hadamard_block
  a = ref_operand(dy, r.dgrad.lhs, key, "dgrad", 0, b)
  if r.dgrad.rhs == REUSE_FWD:
    wq = ref_operand(w.T, r.fwd.rhs, key, "fwd", 1, None).T  # forward's Q(W), unrotated
    bw = ref_operand(wq, None, key, "dgrad", 1, b)
  elif getattr(r.dgrad.rhs, "from_fwd", False) or (r.dgrad.rhs is None and r.trust_masked):
    # re-quantize (or, QuEST with a high-precision backward, use) the forward's Q(W)
    wq = _c(fw_t, r).astype(np.float32).T
    bw = ref_operand(wq, r.dgrad.rhs, key, "dgrad", 1, b)
  else:
    bw = ref_operand(w, r.dgrad.rhs, key, "dgrad", 1, b)
  dx = _c(a, r) @ _c(bw, r).T
  b = r.wgrad.hadamard_block
  if r.wgrad.lhs == REUSE_FWD:
    xq = ref_operand(x, r.fwd.lhs, key, "fwd", 0, None)
    ax = ref_operand(xq.T, None, key, "wgrad", 0, b)
  elif getattr(r.wgrad.lhs, "from_fwd", False) or (r.wgrad.lhs is None and r.trust_masked):
    xq = _c(fx, r).astype(np.float32)
    ax = ref_operand(xq.T, r.wgrad.lhs, key, "wgrad", 0, b)
  else:
    ax = ref_operand(x.T, r.wgrad.lhs, key, "wgrad", 0, b)
  bdy = ref_operand(dy.T, r.wgrad.rhs, key, "wgrad", 1, b)
  dw = _c(ax, r) @ _c(bdy, r).T
  if r.trust_masked:  # QuEST: gradients in the rotated domain -> trust mask -> rotate back
    b, ones = r.fwd.hadamard_block, np.ones(r.fwd.hadamard_block)
    k = x.shape[1]
    rotated = lambda a: np.asarray(hadamard(jnp.asarray(np.pad(a, [(0, 0), (0, (-k) % b)])), b))
    mask_x, mask_w = S.quest(rotated(x), 32)[1], S.quest(rotated(w.T), 32)[1]
    dx = ref_rotate(dx * mask_x, b, ones)[:, :k]
    dw = ref_rotate(dw.T * mask_w, b, ones)[:, :k].T
  return y, dx, dw


def _assert_close(got, ref, what):
  got = np.asarray(got, np.float64)
  scale = np.max(np.abs(ref))
  np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5 * scale, err_msg=what)
