"""Independent float64 numpy implementations of Stable-SPAM and SPAM, written from docs/numerics.md §8-9.

They mirror the structure of the PyTorch reference (a dict of per-tensor state, in-place moment
updates through references grabbed at the start of the step) rather than the optax code, and
count the events they go through (clips, resets, zero norms) so that tests can check that a
gradient stream really exercised them.
"""

import collections
import math

import numpy as np


class StableSpamNumpy:
  """Stable-SPAM on a dict of float64 arrays (docs/numerics.md §8)."""

  def __init__(self, b1=0.9, b2=0.999, eps=1e-8, gamma1=0.7, gamma2=0.9, gamma3=0.999,
               reset_interval=1000, total_steps=None, eta_min=0.5, weight_decay=0.0,
               zero_moments_on_reset=False, debias_with_global_step=False):
    self.b1, self.b2, self.eps = b1, b2, eps
    self.gamma1, self.gamma2, self.gamma3 = gamma1, gamma2, gamma3
    self.reset_interval, self.total_steps, self.eta_min = reset_interval, total_steps, eta_min
    self.weight_decay = weight_decay
    self.zero_moments_on_reset = zero_moments_on_reset
    self.debias_with_global_step = debias_with_global_step
    self.state = {}
    self.global_step = 0
    self.events = collections.Counter()

  def step(self, params, grads, lr):
    """Returns the new params (a dict) after one step with learning rate ``lr``."""
    self.global_step += 1
    t = self.global_step
    if self.total_steps is None:
      s = 1.0
    else:
      s = self.eta_min + (1 - self.eta_min) * (
          1 + math.cos(math.pi * t / (self.total_steps + 1))) / 2
    reset_now = bool(self.reset_interval) and t % self.reset_interval == 0
    if reset_now:
      self.events["reset"] += 1
    new_params = {}
    for name in params:
      p = np.array(params[name], dtype=np.float64)
      g = np.array(grads[name], dtype=np.float64)
      if name not in self.state:
        self.state[name] = {"step": 0, "exp_avg": np.zeros_like(p),
                            "exp_avg_sq": np.zeros_like(p),
                            "max_ema": 0.0, "norm_ema": 0.0, "norm_sq_ema": 0.0}
      st = self.state[name]
      exp_avg, exp_avg_sq = st["exp_avg"], st["exp_avg_sq"]  # references, as in torch
      beta1 = self.b1 * s
      st["step"] += 1
      # Decoupled weight decay of the pre-update weights.
      p = p * (1 - lr * self.weight_decay)
      k = t if self.debias_with_global_step else st["step"]
      # AdaClip.
      g_max = float(np.max(np.abs(g))) if g.size else 0.0
      st["max_ema"] = self.gamma3 * st["max_ema"] + (1 - self.gamma3) * g_max
      threshold = st["max_ema"] / (1 - self.gamma3 ** k)
      mask = np.abs(g) > threshold
      if mask.any():
        self.events["clipped_entries"] += int(mask.sum())
        g[mask] = g[mask] / g_max * threshold
      # AdaGN.
      norm = float(np.linalg.norm(g))
      a = self.gamma1 * s
      st["norm_ema"] = a * st["norm_ema"] + (1 - a) * norm
      st["norm_sq_ema"] = self.gamma2 * st["norm_sq_ema"] + (1 - self.gamma2) * norm ** 2
      c = (st["norm_ema"] / (1 - a ** k)) / (
          math.sqrt(st["norm_sq_ema"] / (1 - self.gamma2 ** k)) + self.eps)
      if norm > 0:
        g = g / norm * c
      else:
        self.events["zero_norm"] += 1
      # Momentum reset: new zero tensors are stored, the grabbed references live on.
      if reset_now:
        st["exp_avg"] = np.zeros_like(p)
        st["exp_avg_sq"] = np.zeros_like(p)
        st["step"] = 1
        if self.zero_moments_on_reset:
          exp_avg, exp_avg_sq = st["exp_avg"], st["exp_avg_sq"]
      exp_avg *= beta1
      exp_avg += (1 - beta1) * g
      exp_avg_sq *= self.b2
      exp_avg_sq += (1 - self.b2) * g * g
      step = st["step"]
      bias1 = 1 - beta1 ** step
      bias2 = 1 - self.b2 ** step
      update = (exp_avg / bias1) / (np.sqrt(exp_avg_sq) / math.sqrt(bias2) + self.eps)
      new_params[name] = p - lr * update
    return new_params


class SpamNumpy:
  """SPAM on a dict of float64 arrays (docs/numerics.md §9)."""

  def __init__(self, b1=0.9, b2=0.999, eps=1e-6, spike_threshold=5000.0, reset_interval=500,
               reset_warmup_steps=150, clip_free_steps=20, weight_decay=0.0):
    self.b1, self.b2, self.eps = b1, b2, eps
    self.theta = spike_threshold
    self.reset_interval = reset_interval
    self.warmup = reset_warmup_steps
    self.clip_free = clip_free_steps
    self.weight_decay = weight_decay
    self.state = {}
    self.global_step = 0
    self.events = collections.Counter()

  def _warmup_factor(self, t):
    if not self.reset_interval or t < self.reset_interval:
      return 1.0
    since_reset = t % self.reset_interval
    if since_reset >= self.warmup:
      return 1.0
    return 1 - 0.99 * (1 + math.cos(math.pi * since_reset / (self.warmup + 1))) / 2

  def step(self, params, grads, lr):
    self.global_step += 1
    t = self.global_step
    reset_now = bool(self.reset_interval) and t % self.reset_interval == 0
    clip_now = (self.theta != 0 and t >= self.clip_free and
                (not self.reset_interval or t % self.reset_interval >= self.clip_free))
    if reset_now:
      self.events["reset"] += 1
    w = self._warmup_factor(t)
    if w < 1:
      self.events["warmup_steps"] += 1
    new_params = {}
    for name in params:
      p = np.array(params[name], dtype=np.float64)
      g = np.array(grads[name], dtype=np.float64)
      if name not in self.state:
        self.state[name] = {"step": 0, "exp_avg": np.zeros_like(p),
                            "exp_avg_sq": np.zeros_like(p)}
      st = self.state[name]
      if reset_now:
        st["exp_avg"] = np.zeros_like(p)
        st["exp_avg_sq"] = np.zeros_like(p)
      st["step"] += 1
      if clip_now:
        mask = g ** 2 > self.theta * st["exp_avg_sq"]
        if mask.any():
          self.events["clipped_entries"] += int(mask.sum())
          g[mask] = np.sign(g[mask]) * np.sqrt(self.theta * st["exp_avg_sq"][mask])
      st["exp_avg"] = self.b1 * st["exp_avg"] + (1 - self.b1) * g
      st["exp_avg_sq"] = self.b2 * st["exp_avg_sq"] + (1 - self.b2) * g * g
      step = st["step"]
      step_size = lr * math.sqrt(1 - self.b2 ** step) / (1 - self.b1 ** step)
      denom = np.sqrt(st["exp_avg_sq"]) + self.eps
      p = p - step_size * w * st["exp_avg"] / denom
      if self.weight_decay:
        p = p - lr * self.weight_decay * p
      new_params[name] = p
    return new_params
