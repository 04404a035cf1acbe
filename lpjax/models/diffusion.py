"""Gaussian diffusion (DDPM, DDIM): noise schedules, the forward process, the loss, two samplers.

A model is seen only through `eps_fn(x_t, t) -> eps`: the noise it predicts for noisy images x_t
(b, ...) at integer timesteps t (b,) in [0, T). Timestep t = 0 is the least noisy. Schedules are
computed in float64 and stored as float32 arrays (as the DDPM reference does); a `NoiseSchedule` is a
pytree, so it can be passed into or closed over by jitted functions.

- `linear_schedule`: beta_t linear from 1e-4 to 0.02 over T = 1000 (Ho et al. 2020).
- `cosine_schedule`: abar(t) = f(t) / f(0), f(t) = cos(((t / T + s) / (1 + s)) pi / 2)^2, betas
  clipped at 0.999 (Nichol & Dhariwal 2021); `alphas_cumprod[i]` is abar(i + 1).
- `q_sample`: x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) noise.
- `diffusion_loss`: the "simple" loss E ||eps - eps_fn(x_t, t)||^2, t uniform in [0, T).
- `ddpm_sample`: ancestral sampling with the posterior variance beta_tilde (Ho et al. 2020), on all
  T steps or on a respaced subsequence (Nichol & Dhariwal 2021, Sec. 4).
- `ddim_sample`: DDIM (Song et al. 2021) with eta (0: deterministic given the initial noise).
Both samplers predict x0, clip it to [-1, 1] (`clip_x0`), run in a `lax.fori_loop` (so they jit
to one loop body), and are deterministic per key.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> sched = linear_schedule()
  >>> sched.num_steps, round(float(sched.alphas_cumprod[-1]), 6)
  (1000, 4e-05)
  >>> c = 0.5   # data = the point mass at c: the exact eps predictor is known in closed form
  >>> abar = lambda t: sched.alphas_cumprod[t][:, None, None, None]
  >>> oracle = lambda x, t: (x - jnp.sqrt(abar(t)) * c) / jnp.sqrt(1 - abar(t))
  >>> x = jax.jit(lambda key: ddim_sample(oracle, sched, (2, 4, 4, 1), key, steps=10))(jax.random.key(0))
  >>> bool(jnp.allclose(x, c, atol=1e-4))
  True
  >>> x0 = jnp.zeros((8, 4, 4, 1))
  >>> float(diffusion_loss(lambda x, t: jnp.zeros_like(x), sched, x0, jax.random.key(1))) > 0.5
  True
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

EpsFn = Callable[[jax.Array, jax.Array], jax.Array]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NoiseSchedule:
  """Per-timestep constants of a diffusion process, float32 arrays of shape (T,)."""

  betas: jax.Array  # beta_t, the variance added at step t
  alphas_cumprod: jax.Array  # abar_t = prod_{s <= t} (1 - beta_s)
  alphas_cumprod_prev: jax.Array  # abar_{t-1}, with abar_{-1} = 1
  sqrt_alphas_cumprod: jax.Array  # sqrt(abar_t): the signal scale of x_t
  sqrt_one_minus_alphas_cumprod: jax.Array  # sqrt(1 - abar_t): the noise scale of x_t
  posterior_variance: jax.Array  # beta_tilde_t = beta_t (1 - abar_{t-1}) / (1 - abar_t)
  posterior_mean_coef1: jax.Array  # coefficient of x0 in the mean of q(x_{t-1} | x_t, x0)
  posterior_mean_coef2: jax.Array  # coefficient of x_t in that mean

  @property
  def num_steps(self) -> int:
    return self.betas.shape[0]


def schedule_from_betas(betas) -> NoiseSchedule:
  """The NoiseSchedule of a beta sequence (computed in float64, stored in float32)."""
  betas = np.asarray(betas, np.float64)
  if betas.ndim != 1 or not len(betas) or np.any(betas <= 0) or np.any(betas >= 1):
    raise ValueError("betas must be a non-empty 1-D sequence of values in (0, 1).")
  abar = np.cumprod(1.0 - betas)
  abar_prev = np.concatenate([[1.0], abar[:-1]])
  fields = dict(
      betas=betas, alphas_cumprod=abar, alphas_cumprod_prev=abar_prev,
      sqrt_alphas_cumprod=np.sqrt(abar), sqrt_one_minus_alphas_cumprod=np.sqrt(1.0 - abar),
      posterior_variance=betas * (1.0 - abar_prev) / (1.0 - abar),
      posterior_mean_coef1=betas * np.sqrt(abar_prev) / (1.0 - abar),
      posterior_mean_coef2=(1.0 - abar_prev) * np.sqrt(1.0 - betas) / (1.0 - abar))
  return NoiseSchedule(**{k: jnp.asarray(v, jnp.float32) for k, v in fields.items()})


def linear_schedule(T: int = 1000, beta_start: float = 1e-4, beta_end: float = 0.02) -> NoiseSchedule:
  """DDPM's linear beta schedule (Ho et al. 2020): beta_t = linspace(beta_start, beta_end, T)."""
  if T < 1:
    raise ValueError(f"T must be >= 1, got {T}.")
  return schedule_from_betas(np.linspace(beta_start, beta_end, T, dtype=np.float64))


def cosine_schedule(T: int = 1000, s: float = 0.008, max_beta: float = 0.999) -> NoiseSchedule:
  """The cosine schedule of Nichol & Dhariwal 2021 (arXiv 2102.09672, eq. 17), betas clipped at
  `max_beta` (0.999) so that the last steps stay finite."""
  if T < 1:
    raise ValueError(f"T must be >= 1, got {T}.")
  f = np.cos((np.arange(T + 1, dtype=np.float64) / T + s) / (1 + s) * np.pi / 2) ** 2
  return schedule_from_betas(np.minimum(1.0 - f[1:] / f[:-1], max_beta))


def _per_example(values, t, ndim: int):
  """values[t] for t (b,), shaped (b, 1, ..., 1) to broadcast against an ndim-array."""
  return values[t].reshape((-1,) + (1,) * (ndim - 1))


def _timesteps(t, batch: int):
  return jnp.broadcast_to(jnp.asarray(t, jnp.int32), (batch,))


def q_sample(schedule: NoiseSchedule, x0, t, noise):
  """x_t ~ q(x_t | x0) = N(sqrt(abar_t) x0, (1 - abar_t) I), given the standard normal `noise`."""
  t = _timesteps(t, x0.shape[0])
  return (_per_example(schedule.sqrt_alphas_cumprod, t, x0.ndim) * x0
          + _per_example(schedule.sqrt_one_minus_alphas_cumprod, t, x0.ndim) * noise)


def predict_x0(schedule: NoiseSchedule, x_t, t, eps):
  """The x0 implied by x_t and a noise prediction: (x_t - sqrt(1 - abar_t) eps) / sqrt(abar_t)."""
  t = _timesteps(t, x_t.shape[0])
  return ((x_t - _per_example(schedule.sqrt_one_minus_alphas_cumprod, t, x_t.ndim) * eps)
          / _per_example(schedule.sqrt_alphas_cumprod, t, x_t.ndim))


def diffusion_loss(eps_fn: EpsFn, schedule: NoiseSchedule, x0, key):
  """Mean squared error of the noise prediction (Ho et al.'s L_simple), t uniform in [0, T)."""
  x0 = jnp.asarray(x0, jnp.float32)
  k_t, k_noise = jax.random.split(key)
  t = jax.random.randint(k_t, (x0.shape[0],), 0, schedule.num_steps)
  noise = jax.random.normal(k_noise, x0.shape, jnp.float32)
  eps = eps_fn(q_sample(schedule, x0, t, noise), t)
  return jnp.mean(jnp.square(eps.astype(jnp.float32) - noise))


def _respaced(schedule: NoiseSchedule, steps: int | None):
  """(timesteps (n,) ascending, abar (n,), abar of the previous kept step (n,), betas (n,)).

  `steps` timesteps evenly spaced over [0, T-1], both ends included (steps=1: only T-1); None: all.
  Respaced betas are 1 - abar_t / abar_prev (Nichol & Dhariwal 2021, Sec. 4).
  """
  T = schedule.num_steps
  if steps is None or steps == T:
    ts = np.arange(T)
  elif not 1 <= steps <= T:
    raise ValueError(f"steps must be in [1, {T}] (the schedule's T), got {steps}.")
  else:
    ts = np.unique(np.round(np.linspace(T - 1, 0, steps)).astype(np.int64))
  abar = schedule.alphas_cumprod[ts]
  abar_prev = jnp.concatenate([jnp.ones((1,), jnp.float32), abar[:-1]])
  betas = schedule.betas if len(ts) == T else 1.0 - abar / abar_prev
  return jnp.asarray(ts, jnp.int32), abar, abar_prev, betas


def _start(shape, key, x_init):
  k_init, k_loop = jax.random.split(key)
  x = jax.random.normal(k_init, shape, jnp.float32) if x_init is None else jnp.asarray(x_init, jnp.float32)
  if x.shape != tuple(shape):
    raise ValueError(f"x_init has shape {x.shape}, expected {tuple(shape)}.")
  return x, k_loop


def _x0_from_eps(x, eps, abar, clip_x0):
  x0 = (x - jnp.sqrt(1.0 - abar) * eps) / jnp.sqrt(abar)
  return jnp.clip(x0, -1.0, 1.0) if clip_x0 else x0


def _predict(eps_fn, x, t, abar, clip_x0):
  """(eps_hat, x0_hat) of the batch x at timestep t (a scalar) whose alpha-bar is abar."""
  eps = eps_fn(x, jnp.full((x.shape[0],), t, jnp.int32)).astype(jnp.float32)
  return eps, _x0_from_eps(x, eps, abar, clip_x0)


def ddpm_sample(eps_fn: EpsFn, schedule: NoiseSchedule, shape, key, *, steps: int | None = None,
                clip_x0: bool = True, x_init=None):
  """Ancestral DDPM sampling: x_{t-1} = mu_tilde(x_t, x0_hat) + sqrt(beta_tilde_t) z (no noise at the
  last step), x0_hat from eps_fn and clipped to [-1, 1]. `steps` < T samples a respaced chain;
  `x_init` replaces the initial noise x_T (drawn from `key` otherwise). Returns float32 `shape`."""
  ts, abar, abar_prev, betas = _respaced(schedule, steps)
  coef_x0 = betas * jnp.sqrt(abar_prev) / (1.0 - abar)
  coef_xt = (1.0 - abar_prev) * jnp.sqrt(1.0 - betas) / (1.0 - abar)
  std = jnp.sqrt(betas * (1.0 - abar_prev) / (1.0 - abar))
  x, k_loop = _start(shape, key, x_init)
  n = ts.shape[0]

  def step(i, x):
    j = n - 1 - i
    _, x0 = _predict(eps_fn, x, ts[j], abar[j], clip_x0)
    z = jax.random.normal(jax.random.fold_in(k_loop, j), shape, jnp.float32)
    return coef_x0[j] * x0 + coef_xt[j] * x + jnp.where(j > 0, std[j], 0.0) * z

  return jax.lax.fori_loop(0, n, step, x)


def ddim_sample(eps_fn: EpsFn, schedule: NoiseSchedule, shape, key, *, steps: int = 50,
                eta: float = 0.0, clip_x0: bool = True, x_init=None):
  """DDIM sampling (Song et al. 2021, eq. 12) on `steps` timesteps evenly spaced over [0, T-1]:
  x_prev = sqrt(abar_prev) x0_hat + sqrt(1 - abar_prev - sigma^2) eps_hat + sigma z with
  sigma = eta sqrt((1 - abar_prev) / (1 - abar) (1 - abar / abar_prev)); eta=0 is deterministic
  given x_init, eta=1 is DDPM-like. With `clip_x0`, eps_hat is recomputed from the clipped x0_hat."""
  ts, abar, abar_prev, _ = _respaced(schedule, steps)
  x, k_loop = _start(shape, key, x_init)
  n = ts.shape[0]

  def step(i, x):
    j = n - 1 - i
    eps, x0 = _predict(eps_fn, x, ts[j], abar[j], clip_x0)
    if clip_x0:
      eps = (x - jnp.sqrt(abar[j]) * x0) / jnp.sqrt(1.0 - abar[j])
    sigma = eta * jnp.sqrt((1.0 - abar_prev[j]) / (1.0 - abar[j]) * (1.0 - abar[j] / abar_prev[j]))
    direction = jnp.sqrt(jnp.maximum(1.0 - abar_prev[j] - sigma**2, 0.0)) * eps
    z = jax.random.normal(jax.random.fold_in(k_loop, j), shape, jnp.float32)
    return jnp.sqrt(abar_prev[j]) * x0 + direction + sigma * z

  return jax.lax.fori_loop(0, n, step, x)
