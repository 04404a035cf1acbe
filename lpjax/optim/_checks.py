"""Argument checks of the optimizers: a clear ValueError at construction, not NaN parameters later.

Only concrete Python / numpy numbers are checked; arrays and traced values (e.g. under
`optax.inject_hyperparams`) pass through unchecked.

Examples:
  >>> check_hyperparameters("stable_spam", decays={"b1": 0.9}, eps=1e-8)
  >>> try:
  ...   check_hyperparameters("stable_spam", decays={"b1": 1.0})
  ... except ValueError as e:
  ...   print(e)
  stable_spam: b1 must be in [0, 1) (a decay of 1 divides by 1 - b1**t = 0), got 1.0.
"""

from __future__ import annotations

import math
import numbers

import jax.numpy as jnp


def _concrete(v):
  return isinstance(v, numbers.Real) and not isinstance(v, bool)


def check_hyperparameters(optimizer: str, *, decays=None, eps=None, total_steps=None,
                          reset_interval=None, dtypes=None, nonnegative=None, unit=None):
  """Raises ValueError naming the first bad argument of `optimizer`.

  The same ranges as the trainer's config validation (lpjax/train/schema/_validate.py): decays in
  [0, 1), eps > 0, and the `nonnegative` arguments (learning rate, weight decay, ...) finite and
  >= 0; `unit` arguments in [0, 1]. A learning rate may also be a schedule (not checked).
  """
  for name, v in (decays or {}).items():
    if _concrete(v) and not (math.isfinite(v) and 0 <= v < 1):
      raise ValueError(f"{optimizer}: {name} must be in [0, 1) (a decay of 1 divides by "
                       f"1 - {name}**t = 0), got {v!r}.")
  if _concrete(eps) and not (math.isfinite(eps) and eps > 0):
    raise ValueError(f"{optimizer}: eps must be a finite number > 0 (a zero eps divides 0 by 0 "
                     f"where a gradient is zero), got {eps!r}.")
  for name, v in (nonnegative or {}).items():
    if _concrete(v) and not (math.isfinite(v) and v >= 0):
      raise ValueError(f"{optimizer}: {name} must be a finite number >= 0, got {v!r}.")
  for name, v in (unit or {}).items():
    if _concrete(v) and not (math.isfinite(v) and 0 <= v <= 1):
      raise ValueError(f"{optimizer}: {name} must be in [0, 1], got {v!r}.")
  if _concrete(total_steps) and not total_steps > 0:
    raise ValueError(f"{optimizer}: total_steps must be positive (or None: no cosine factor), "
                     f"got {total_steps!r}.")
  if _concrete(reset_interval) and reset_interval < 0:
    raise ValueError(f"{optimizer}: reset_interval must be >= 0 (or None / 0: never), got "
                     f"{reset_interval!r}.")
  for name, dtype in (dtypes or {}).items():
    if dtype is not None and not jnp.issubdtype(jnp.dtype(dtype), jnp.floating):
      raise ValueError(f"{optimizer}: {name} must be a floating dtype (float32, bfloat16), got "
                       f"{jnp.dtype(dtype)}: an integer moment would be truncated every step.")
