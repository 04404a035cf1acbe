"""lpjax.models.diffusion: schedules against closed forms, the forward process, the loss, samplers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax.models import diffusion
from lpjax.models.diffusion import (cosine_schedule, ddim_sample, ddpm_sample, diffusion_loss,
                                    linear_schedule, q_sample)

LINEAR = linear_schedule()


def _abar(schedule, t, ndim=4):
  return schedule.alphas_cumprod[t].reshape((-1,) + (1,) * (ndim - 1))


def point_mass_oracle(schedule, c):
  """The exact eps predictor when the data distribution is the point mass at image c."""
  return lambda x, t: (x - jnp.sqrt(_abar(schedule, t)) * c) / jnp.sqrt(1 - _abar(schedule, t))


def gaussian_oracle(schedule, s):
  """E[eps | x_t] when x0 ~ N(0, s^2 I): x_t ~ N(0, abar s^2 + 1 - abar), eps|x_t linear in x_t."""
  def eps_fn(x, t):
    abar = _abar(schedule, t, x.ndim)
    return jnp.sqrt(1 - abar) * x / (abar * s**2 + 1 - abar)
  return eps_fn


def test_linear_schedule_matches_the_closed_form():
  betas = np.linspace(1e-4, 0.02, 1000, dtype=np.float64)
  abar = np.cumprod(1 - betas)
  abar_prev = np.concatenate([[1.0], abar[:-1]])
  np.testing.assert_allclose(LINEAR.betas, betas, rtol=1e-6)
  np.testing.assert_allclose(LINEAR.alphas_cumprod, abar, rtol=1e-5)
  np.testing.assert_allclose(LINEAR.alphas_cumprod_prev, abar_prev, rtol=1e-5)
  np.testing.assert_allclose(LINEAR.posterior_variance, betas * (1 - abar_prev) / (1 - abar), rtol=1e-5)
  assert LINEAR.posterior_variance[0] == 0  # beta_tilde_0 = 0: the last reverse step adds no noise
  assert LINEAR.alphas_cumprod.dtype == jnp.float32 and LINEAR.num_steps == 1000
  # Ho et al. 2020: abar_T ~ 4e-5 for this schedule, so x_T is almost pure noise.
  assert 3.9e-5 < float(LINEAR.alphas_cumprod[-1]) < 4.2e-5


def test_cosine_schedule_matches_the_formula_and_clips():
  T, s = 1000, 0.008
  f = lambda t: np.cos((t / T + s) / (1 + s) * np.pi / 2) ** 2
  sched = cosine_schedule(T, s)
  for i in (0, 10, 250, 500, 900, 980):
    np.testing.assert_allclose(float(sched.alphas_cumprod[i]), f(i + 1) / f(0), rtol=1e-5, atol=1e-7)
  assert float(sched.betas.max()) == pytest.approx(0.999)
  assert float(sched.betas[-1]) == pytest.approx(0.999)  # f(T) = 0: the last beta would be 1
  assert np.all(np.diff(np.asarray(sched.alphas_cumprod)) < 0)


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match="T must be"):
    linear_schedule(T=0)
  with pytest.raises(ValueError, match="betas"):
    diffusion.schedule_from_betas([0.1, 1.5])
  with pytest.raises(ValueError, match="steps must be in"):
    ddim_sample(lambda x, t: x, LINEAR, (1, 2), jax.random.key(0), steps=1001)
  with pytest.raises(ValueError, match="x_init has shape"):
    ddim_sample(lambda x, t: x, LINEAR, (1, 2), jax.random.key(0), steps=2, x_init=jnp.zeros((2, 2)))


def test_q_sample_is_the_closed_form_and_has_the_right_moments():
  key = jax.random.key(0)
  x0 = jax.random.uniform(key, (3, 4, 4, 2), minval=-1, maxval=1)
  noise = jax.random.normal(jax.random.key(1), x0.shape)
  t = jnp.array([0, 499, 999])
  abar = np.cumprod(1 - np.linspace(1e-4, 0.02, 1000))[np.asarray(t)].reshape(3, 1, 1, 1)
  want = np.sqrt(abar) * np.asarray(x0) + np.sqrt(1 - abar) * np.asarray(noise)
  np.testing.assert_allclose(q_sample(LINEAR, x0, t, noise), want, rtol=1e-5, atol=1e-6)
  # Statistics over 65536 draws at t = 300: mean sqrt(abar) * 0.7, std sqrt(1 - abar).
  x0 = jnp.full((4096, 4, 4, 1), 0.7)
  xt = q_sample(LINEAR, x0, 300, jax.random.normal(jax.random.key(2), x0.shape))
  a = float(LINEAR.alphas_cumprod[300])
  assert float(xt.mean()) == pytest.approx(np.sqrt(a) * 0.7, abs=0.01)
  assert float(xt.std()) == pytest.approx(np.sqrt(1 - a), rel=0.02)


def test_loss_of_zero_prediction_is_the_noise_power_and_of_the_oracle_is_zero():
  x0 = jax.random.uniform(jax.random.key(0), (64, 8, 8, 1), minval=-1, maxval=1)
  key = jax.random.key(1)
  zero = diffusion_loss(lambda x, t: jnp.zeros_like(x), LINEAR, x0, key)
  assert float(zero) == pytest.approx(1.0, abs=0.05)  # E[noise^2] = 1 over 4096 values
  # The exact noise given the known x0: (x_t - sqrt(abar_t) x0) / sqrt(1 - abar_t).
  oracle = lambda x, t: (x - jnp.sqrt(_abar(LINEAR, t)) * x0) / jnp.sqrt(1 - _abar(LINEAR, t))
  assert float(diffusion_loss(oracle, LINEAR, x0, key)) < 1e-7
  assert float(diffusion_loss(oracle, LINEAR, x0, jax.random.key(2))) < 1e-7


def test_loss_gradient_flows_and_matches_finite_differences():
  x0 = jax.random.uniform(jax.random.key(0), (32, 4, 4, 1), minval=-1, maxval=1)
  loss = lambda w: diffusion_loss(lambda x, t: w * x, LINEAR, x0, jax.random.key(3))
  g = float(jax.jit(jax.grad(loss))(0.5))
  h = 1e-2
  fd = (float(loss(0.5 + h)) - float(loss(0.5 - h))) / (2 * h)  # loss is quadratic in w: exact
  assert g != 0 and g == pytest.approx(fd, rel=1e-3)


@pytest.mark.parametrize("sampler", ["ddpm", "ddim"])
def test_samplers_are_deterministic_per_key(sampler):
  eps_fn = lambda x, t: 0.3 * x + 1e-4 * t[:, None, None, None]
  fn = {"ddpm": lambda k: ddpm_sample(eps_fn, LINEAR, (2, 4, 4, 3), k, steps=20),
        "ddim": lambda k: ddim_sample(eps_fn, LINEAR, (2, 4, 4, 3), k, steps=20, eta=0.5)}[sampler]
  run = jax.jit(fn)
  a, b, c = run(jax.random.key(0)), run(jax.random.key(0)), run(jax.random.key(1))
  assert a.shape == (2, 4, 4, 3) and a.dtype == jnp.float32
  np.testing.assert_array_equal(a, b)
  assert float(jnp.abs(a - c).max()) > 1e-3


def test_ddim_eta0_is_deterministic_given_the_initial_noise():
  eps_fn = lambda x, t: 0.3 * x
  x_init = jax.random.normal(jax.random.key(5), (2, 4, 4, 1))
  run = jax.jit(lambda k, eta: ddim_sample(eps_fn, LINEAR, x_init.shape, k, steps=10, eta=eta,
                                           x_init=x_init))
  np.testing.assert_array_equal(run(jax.random.key(0), 0.0), run(jax.random.key(1), 0.0))
  assert float(jnp.abs(run(jax.random.key(0), 1.0) - run(jax.random.key(1), 1.0)).max()) > 1e-3


def test_ddim_matches_a_numpy_reimplementation_of_song_et_al_eq_12():
  T, steps = 1000, 7
  abar = np.cumprod(1 - np.linspace(1e-4, 0.02, T))
  eps_fn_np = lambda x, t: 0.4 * x + 1e-3 * t
  ts = np.round(np.linspace(0, T - 1, steps)).astype(int)  # both ends: 0, 166, ..., 999
  x = x_init = np.random.default_rng(0).normal(size=(3, 2, 2, 1))
  for i in reversed(range(steps)):
    a, a_prev = abar[ts[i]], (abar[ts[i - 1]] if i else 1.0)
    eps = eps_fn_np(x, ts[i])
    x0 = (x - np.sqrt(1 - a) * eps) / np.sqrt(a)
    x = np.sqrt(a_prev) * x0 + np.sqrt(1 - a_prev) * eps
  eps_fn = lambda x, t: 0.4 * x + 1e-3 * t[:, None, None, None].astype(jnp.float32)
  got = ddim_sample(eps_fn, LINEAR, x_init.shape, jax.random.key(0), steps=steps, clip_x0=False,
                    x_init=jnp.asarray(x_init, jnp.float32))
  np.testing.assert_allclose(got, x, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("schedule", [LINEAR, cosine_schedule()], ids=["linear", "cosine"])
@pytest.mark.parametrize("sampler,steps", [("ddpm", None), ("ddpm", 50), ("ddim", 50), ("ddim", 10)])
def test_oracle_of_a_point_mass_recovers_it(schedule, sampler, steps):
  c = jnp.linspace(-0.9, 0.9, 16).reshape(1, 4, 4, 1)  # a fixed image in [-1, 1]
  oracle = point_mass_oracle(schedule, c)
  if sampler == "ddpm":
    run = lambda k: ddpm_sample(oracle, schedule, (3, 4, 4, 1), k, steps=steps)
  else:
    run = lambda k: ddim_sample(oracle, schedule, (3, 4, 4, 1), k, steps=steps, eta=1.0)
  x = jax.jit(run)(jax.random.key(0))
  np.testing.assert_allclose(x, np.broadcast_to(c, x.shape), atol=1e-3)


@pytest.mark.parametrize("sampler", ["ddpm", "ddim"])
def test_oracle_of_a_gaussian_samples_its_variance(sampler):
  # With the exact eps of N(0, s^2), DDPM (beta_tilde variance, all 1000 steps) and DDIM (eta=0,
  # 100 steps) must produce samples of std s; 16384 samples give std to ~1%.
  s = 0.5
  eps_fn = gaussian_oracle(LINEAR, s)
  shape = (4096, 2, 2, 1)
  if sampler == "ddpm":
    x = jax.jit(lambda k: ddpm_sample(eps_fn, LINEAR, shape, k, clip_x0=False))(jax.random.key(0))
  else:
    x = jax.jit(lambda k: ddim_sample(eps_fn, LINEAR, shape, k, steps=100, clip_x0=False))(jax.random.key(0))
  assert float(x.std()) == pytest.approx(s, rel=0.04)
  assert abs(float(x.mean())) < 0.02
