"""The bad-input table (issue 40), library rows: lpjax.quant on zero-size operands and non-finite
amaxes, lpjax.optim on spikes, huge and tiny gradients.

Each case is one row with its expected outcome (bad_input_cases.py): an exception type and a
message substring, or a property of the result checked against an independent reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bad_input_cases import Case, Holds, Raises, check

from lpjax import optim, quant

KEY = jax.random.key(0)


def _gemm_empty(recipe, lhs_shape, rhs_shape):
  """dot_general of `recipe` on zero-size operands: the shape of lax's result, zeros where the
  contraction is empty (lax's result, the reference), and gradients of the operands' shapes."""
  x, w = jnp.ones(lhs_shape), jnp.ones(rhs_shape)
  dn = (((x.ndim - 1,), (0,)), ((), ()))
  gemm = lambda x, w: quant.dot_general(x, w, dn, recipe, key=KEY)
  y = jax.jit(gemm)(x, w)  # jitted: eager dispatch of the recipe's many small ops is slow
  reference = jax.lax.dot_general(x, w, dn)
  gx, gw = jax.jit(jax.grad(lambda x, w: jnp.sum(gemm(x, w)), (0, 1)))(x, w)
  return (y.shape == reference.shape and bool(jnp.all(y == reference))
          and gx.shape == x.shape and gw.shape == w.shape
          and bool(jnp.all(jnp.isfinite(gx))) and bool(jnp.all(jnp.isfinite(gw))))


def _every_format_takes_empty_arrays():
  for fmt in quant.FORMAT_NAMES:
    for shape in [(0, 64), (4, 0), (2, 0, 32)]:
      x = jnp.zeros(shape, jnp.float32)
      if quant.dequantize(quant.quantize(x, fmt)).shape != shape:
        return False
      if quant.fake_quant(x, fmt).shape != shape:
        return False
  return True


def _nan_tensor_amax(amax):
  x = jax.random.normal(jax.random.key(1), (4, 64))
  q = quant.quantize(x, "nvfp4", tensor_amax=amax)
  deq = quant.dequantize(q)
  fake = quant.fake_quant(x, "nvfp4", tensor_amax=amax)
  return (bool(jnp.all(jnp.isnan(deq))) and bool(jnp.all(jnp.isnan(fake)))
          and bool(jnp.all(q.scales.view(jnp.uint8) == 0x7F) if q.scales.dtype.itemsize == 1
                   else jnp.all(q.scales == 0x7F))
          and bool(jnp.all(q.codes == 0)))


def _pallas_agrees_on_a_nan_tensor_amax():
  """The Pallas kernels (interpret mode off GPU) give the XLA path's bits for non-finite amax."""
  x = jax.random.normal(jax.random.key(1), (16, 64))
  for amax in (float("inf"), float("nan")):
    q, qx = (quant.quantize(x, "nvfp4", tensor_amax=amax, impl=i) for i in ("pallas", "xla"))
    y, yx = (quant.fake_quant(x, "nvfp4", tensor_amax=amax, impl=i) for i in ("pallas", "xla"))
    if not (bool(jnp.all(q.codes == qx.codes)) and bool(jnp.all(q.scales == qx.scales))
            and bool(jnp.all(y.view(jnp.uint32) == yx.view(jnp.uint32)))):
      return False
  return True


def _finite_tensor_amax_is_the_measured_one():
  x = jax.random.normal(jax.random.key(2), (4, 64))
  given = quant.fake_quant(x, "nvfp4", tensor_amax=jnp.max(jnp.abs(x)))
  return bool(jnp.all(given.view(jnp.uint32) == quant.fake_quant(x, "nvfp4").view(jnp.uint32)))


def _first_update(tx, grad):
  params = {"w": jnp.ones(grad.shape)}
  updates, state = jax.jit(tx.update)({"w": grad}, tx.init(params), params)
  return updates["w"], state


def _huge_first_step_is_scale_free(magnitude):
  """Stable-SPAM's first step normalizes the gradient (AdaGN at k=1 gives target n / (n + eps)),
  so a huge finite gradient moves the params as the same gradient scaled down by 2**-100 does."""
  g = jax.random.uniform(jax.random.key(3), (64, 64), minval=-1.0) * magnitude  # finite
  tx = optim.stable_spam(1e-3)
  huge, state = _first_update(tx, g)
  small_, _ = _first_update(tx, g * 2.0**-100)
  assert bool(jnp.all(jnp.isfinite(g)))
  finite = all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(state))
  return finite and bool(jnp.all(jnp.isfinite(huge))) and np.allclose(huge, small_, rtol=1e-5,
                                                                       atol=1e-9)


def _keeps_training_after_a_spike(make, magnitude, spike_steps=(5, 30)):
  """Params and optimizer state stay finite through spikes of `magnitude`, and the steps after
  them still move the params (no state stuck at inf)."""
  tx = make()
  params = {"w": jnp.ones((16, 16)), "b": jnp.ones(3)}
  state = tx.init(params)

  @jax.jit
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for t in range(40):
    grads = jax.tree.map(lambda p: jnp.full(p.shape, 0.01 * (1 + t % 3)), params)
    if t in spike_steps:
      grads = {"w": grads["w"].at[0].set(magnitude), "b": grads["b"].at[0].set(-magnitude)}
    before = params
    params, state = step(params, state, grads)
  finite = all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves((params, state)))
  moved = bool(jnp.any(params["w"] != before["w"]))
  return finite and moved


def _scaled_norm_matches_float64(values):
  from lpjax.optim._safe_norms import scaled_norm
  x = np.asarray(values, np.float32)
  norm, scaled, down = scaled_norm(jnp.asarray(x))
  want = np.sqrt(np.sum(np.square(x.astype(np.float64))))
  unit = np.asarray(jnp.asarray(x) * down / scaled, np.float64)
  return (np.isclose(float(norm), want, rtol=1e-6) if want < np.finfo(np.float32).max
          else np.isinf(float(norm))) and np.allclose(unit, x / want, rtol=1e-6, atol=1e-30)


def _scaled_norm_is_the_plain_norm_bit_for_bit():
  from lpjax.optim._safe_norms import scaled_norm
  for seed in range(5):
    x = jax.random.normal(jax.random.key(seed), (33, 17)) * 10.0 ** (seed - 2)
    if scaled_norm(x)[0].view(jnp.uint32) != jnp.sqrt(jnp.sum(jnp.square(x))).view(jnp.uint32):
      return False
  return True


CASES = [
    # library calls: zero-size operands and non-finite tensor_amax (lpjax.quant)
    Case("library", "Hadamard of (0, 32)",
         lambda t: quant.hadamard(jnp.zeros((0, 32)), 16).shape == (0, 32), Holds("shape kept")),
    Case("library", "Hadamard of (4, 0), inverse",
         lambda t: quant.hadamard(jnp.zeros((4, 0)), 16, inverse=True).shape == (4, 0),
         Holds("shape kept")),
    Case("library", "SSP FP4 of (0, 256)",
         lambda t: quant.ssp_fake_quant(jnp.zeros((0, 256)), "ssp_fp4_g256").shape == (0, 256),
         Holds("shape kept")),
    Case("library", "SSP uint4 of (3, 0)",
         lambda t: quant.ssp_fake_quant(jnp.zeros((3, 0)), "ssp_uint4_g256").shape == (3, 0),
         Holds("shape kept")),
    Case("library", "quartet GEMM with no rows", lambda t: _gemm_empty("quartet", (0, 64), (64, 32)),
         Holds("lax's shape, finite gradients")),
    Case("library", "nvfp4 GEMM with no columns", lambda t: _gemm_empty("nvfp4", (8, 64), (64, 0)),
         Holds("lax's shape, finite gradients")),
    Case("library", "mxfp4_bwd GEMM with an empty batch axis",
         lambda t: _gemm_empty("mxfp4_bwd", (2, 0, 64), (64, 32)), Holds("lax's shape")),
    Case("library", "ssp_fp4 GEMM with no rows", lambda t: _gemm_empty("ssp_fp4", (0, 64), (64, 32)),
         Holds("lax's shape")),
    Case("library", "quartet GEMM with an empty contraction",
         lambda t: _gemm_empty("quartet", (8, 0), (0, 32)), Holds("zeros, as lax gives")),
    Case("library", "quartet conv of an empty batch",
         lambda t: jax.jit(lambda x, w: quant.conv_general_dilated(
             x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), recipe="quartet",
             key=KEY))(jnp.ones((0, 8, 8, 32)), jnp.ones((3, 3, 32, 16))).shape == (0, 8, 8, 16),
         Holds("shape kept")),
    Case("library", "nvfp4 einsum of an empty batch",
         lambda t: jax.jit(lambda x, w: quant.einsum("bsd,df->bsf", x, w, recipe="nvfp4", key=KEY))(
             jnp.ones((0, 4, 64)), jnp.ones((64, 32))).shape == (0, 4, 32), Holds("shape kept")),
    Case("library", "every format quantizes zero-size arrays",
         lambda t: _every_format_takes_empty_arrays(), Holds("shapes kept")),
    Case("library", "tensor_amax=inf", lambda t: _nan_tensor_amax(float("inf")),
         Holds("every block NaN: scale 0x7F, codes 0")),
    Case("library", "tensor_amax=nan", lambda t: _nan_tensor_amax(float("nan")),
         Holds("every block NaN: scale 0x7F, codes 0")),
    Case("library", "tensor_amax=inf through the Pallas kernels",
         lambda t: _pallas_agrees_on_a_nan_tensor_amax(), Holds("the XLA path's bits")),
    Case("library", "a finite tensor_amax equal to max|x|",
         lambda t: _finite_tensor_amax_is_the_measured_one(), Holds("the measured amax's bits")),

    # optimizers: what the trainer rejects, the library rejects; huge finite gradients
    Case("optim", "stable_spam negative lr", lambda t: optim.stable_spam(-1e-3),
         Raises(ValueError, "learning_rate must be a finite number >= 0, got -0.001")),
    Case("optim", "spam negative lr", lambda t: optim.spam(-1.0),
         Raises(ValueError, "spam: learning_rate must be a finite number >= 0")),
    Case("optim", "stable_spam NaN lr", lambda t: optim.stable_spam(float("nan")),
         Raises(ValueError, "learning_rate must be a finite number >= 0, got nan")),
    Case("optim", "stable_spam negative weight decay",
         lambda t: optim.stable_spam(1e-3, weight_decay=-0.1),
         Raises(ValueError, "weight_decay must be a finite number >= 0")),
    Case("optim", "spam infinite weight decay",
         lambda t: optim.spam(1e-3, weight_decay=float("inf")),
         Raises(ValueError, "weight_decay must be a finite number >= 0, got inf")),
    Case("optim", "stable_spam eps of 0", lambda t: optim.stable_spam(1e-3, eps=0.0),
         Raises(ValueError, "eps must be a finite number > 0")),
    Case("optim", "stable_spam eta_min above 1", lambda t: optim.stable_spam(1e-3, eta_min=1.5),
         Raises(ValueError, r"eta_min must be in [0, 1]")),
    Case("optim", "stable_spam NaN gamma3", lambda t: optim.stable_spam(1e-3, gamma3=float("nan")),
         Raises(ValueError, "gamma3 must be in [0, 1)")),
    Case("optim", "spam negative spike threshold",
         lambda t: optim.spam(1e-3, spike_threshold=-1.0),
         Raises(ValueError, "spike_threshold must be a finite number >= 0")),
    Case("optim", "spam negative clip-free steps", lambda t: optim.spam(1e-3, clip_free_steps=-1),
         Raises(ValueError, "clip_free_steps must be a finite number >= 0")),
    Case("optim", "decay_updated_weights negative decay",
         lambda t: optim.decay_updated_weights(-0.1, 1e-3),
         Raises(ValueError, "weight_decay must be a finite number >= 0")),
    Case("optim", "a learning-rate schedule is accepted",
         lambda t: optim.stable_spam(optax.linear_schedule(0.0, 1e-3, 10)) is not None,
         Holds("schedules are not checked")),
    Case("optim", "stable_spam first step of a 1e30 gradient",
         lambda t: _huge_first_step_is_scale_free(1e30), Holds("= the step of the gradient / 2^100")),
    Case("optim", "stable_spam first step of a 3e38 gradient (its norm overflows float32)",
         lambda t: _huge_first_step_is_scale_free(3e38), Holds("= the step of the gradient / 2^100")),
    Case("optim", "stable_spam through 1e20 spikes",
         lambda t: _keeps_training_after_a_spike(lambda: optim.stable_spam(1e-3), 1e20),
         Holds("finite params and state, still training")),
    Case("optim", "stable_spam through FLT_MAX spikes",
         lambda t: _keeps_training_after_a_spike(lambda: optim.stable_spam(1e-3, reset_interval=20),
                                                 float(np.finfo(np.float32).max)),
         Holds("finite params and state, still training")),
    Case("optim", "spam through 1e30 spikes (inside and after the clip-free steps)",
         lambda t: _keeps_training_after_a_spike(lambda: optim.spam(1e-3), 1e30),
         Holds("finite params and state, still training")),
    Case("optim", "spam through FLT_MAX spikes after a reset",
         lambda t: _keeps_training_after_a_spike(lambda: optim.spam(1e-3, reset_interval=10),
                                                 float(np.finfo(np.float32).max), (12, 31)),
         Holds("finite params and state, still training")),
    Case("optim", "the scaled norm of huge values",
         lambda t: _scaled_norm_matches_float64([3e30, -4e30, 1.0]),
         Holds("the float64 norm, and the unit vector")),
    Case("optim", "the scaled norm beyond FLT_MAX",
         lambda t: _scaled_norm_matches_float64([3e38] * 4), Holds("inf, with a finite unit vector")),
    Case("optim", "the scaled norm of tiny values",
         lambda t: _scaled_norm_matches_float64([3e-30, 4e-30]), Holds("no underflow to 0")),
    Case("optim", "the scaled norm in the normal range",
         lambda t: _scaled_norm_is_the_plain_norm_bit_for_bit(), Holds("the plain norm's bits")),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c.group}: {c.name}" for c in CASES])
def test_bad_input(case, tmp_path):
  check(case, lambda: case.run(tmp_path))
