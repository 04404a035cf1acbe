"""Short contractions (issue 48, item 2): every preset, through the interception, at K = 1, 2, 3,
7, 16, 31, 33 either holds its own 4-bit (or 8-bit) error level, measured at K = 64 on the same
data, or keeps the GEMM in high precision and says why in the report.

The reference is the unquantized function: the forward output and both gradients (dW: the wgrad
GEMM, dX: the dgrad GEMM) of a Dense of K inputs. "Holds" means: relative error below 0.45 and
at most 1.5x the recipe's own error at K = 64 (+0.05), and no input feature whose weight gradient
(a row of dW) or input gradient (a column of dX) is all zero. quartet's QuEST forward cannot (its RMS scale clips a block holding fewer than 4 values),
so the interception keeps K = 1, 2, 3 and 33 there.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax import quant
from lpjax.quant import recipes

KS = (1, 2, 3, 7, 16, 31, 33)
M, N = 64, 48


def _errors(recipe, ks):
  """{K: (forward, dW, dX relative errors, some gradient row or column all zero, the report's
  site)} for one Dense of K inputs per K, all in one traced function (one compile); the
  reference is float64 numpy."""
  xs = {f"k{k}": jax.random.normal(jax.random.key(k), (M, k)) for k in ks}
  p = {f"k{k}": {"kernel": jax.random.normal(jax.random.key(100 + k), (k, N)) / np.sqrt(k)}
       for k in ks}
  rs = {f"k{k}": jax.random.normal(jax.random.key(200 + k), (M, N)) for k in ks}
  f = lambda p, xs: {n: xs[n] @ p[n]["kernel"] for n in xs}
  q = quant.quantized(f, quant.QuantPolicy(recipe=recipe, keep_high_precision=()))
  key = jax.random.key(0)

  @jax.jit
  def run(p, xs):
    y, vjp = jax.vjp(lambda p, xs: q(p, xs, quant_key=key), p, xs)
    gp, gx = vjp(rs)
    return y, gp, gx

  y, gp, gx = run(p, xs)
  sites = {s.path: s for s in quant.report(q, p, xs, quant_key=key).sites}
  rel = lambda a, b: float(np.linalg.norm(a - b) / np.linalg.norm(b))
  out = {}
  for k in ks:
    n = f"k{k}"
    x64, w64, r64 = (np.asarray(a, np.float64) for a in (xs[n], p[n]["kernel"], rs[n]))
    y1, gw1, gx1 = (np.asarray(a, np.float64) for a in (y[n], gp[n]["kernel"], gx[n]))
    y0, gw0, gx0 = x64 @ w64, x64.T @ r64, r64 @ w64.T
    zero = bool(np.any(np.all(gw1 == 0, axis=1)) or np.any(np.all(gx1 == 0, axis=0)))
    out[k] = (rel(y1, y0), rel(gw1, gw0), rel(gx1, gx0)), zero, sites[n]
  return out


@pytest.mark.parametrize("recipe", [n for n in recipes.NAMES if not recipes.get(n).is_high_precision])
def test_every_preset_holds_its_error_level_or_keeps_short_contractions(recipe):
  found = _errors(recipe, (64,) + KS)
  level, zero, site = found[64]
  assert site.status == "quantized" and not zero
  for k in KS:
    errs, zero, site = found[k]
    assert not zero, (recipe, k)
    if site.status == "high precision":
      assert "contraction" in site.reason and f"K={k}" in site.reason, (recipe, k, site.reason)
      assert max(errs) < 0.01, (recipe, k, errs)  # bf16: the high-precision level
      continue
    assert site.status == "quantized" and site.reason == "", (recipe, k, site)
    for e, ref in zip(errs, level):
      assert e < 0.45 and e <= 1.5 * ref + 0.05, (recipe, k, errs, level)


def test_quartet_keeps_exactly_the_contractions_its_blocks_cannot_hold():
  found = _errors("quartet", (1, 2, 3, 4, 7, 33, 36, 64))
  kept = {k: site.status == "high precision" for k, (_, _, site) in found.items()}
  assert kept == {1: True, 2: True, 3: True, 4: False, 7: False, 33: True, 36: False, 64: False}
