"""Per-site fallback recipes (lpjax/train/monitor/_site_fallback.py) and the monitor's config checks: a
composite recipe runs the fallback's GEMMs in its switched pass and its own in the others."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from config_helpers import small
from lpjax import quant
from lpjax.quant import QuantPolicy, recipes
from lpjax.quant.recipes.gemm_recipe import GemmQuant
from lpjax.train import ConfigError, validate
from lpjax.train.monitor._site_fallback import composite, with_switches

DN = (((1,), (0,)), ((), ()))


def _grads(recipe, x, w, dy, key):
  y, vjp = jax.vjp(lambda x, w: quant.dot_general(x, w, DN, recipe, key=key), x, w)
  return (y, *vjp(dy))


@pytest.mark.parametrize("own", ["mxfp4", "quartet", "nvfp4"])
@pytest.mark.parametrize("passes", [("fwd",), ("bwd",)])
def test_a_composite_runs_each_pass_in_its_own_recipe(own, passes):
  """Y from the fallback (bf16) when the forward switched, else from the own recipe; dX and dW
  from bf16 when the backward switched. (A quartet-style backward that re-quantizes the
  forward's codes quantizes its own operands once the forward is bf16: dX, dW then differ from
  both, and are checked to stay close to the high-precision gradients.)"""
  k1, k2, k3, key = jax.random.split(jax.random.key(0), 4)
  x = jax.random.normal(k1, (64, 128))
  w = jax.random.normal(k2, (128, 64)) / 11
  dy = jax.random.normal(k3, (64, 64))
  r = composite(recipes.get(own), recipes.get("bf16"), passes)
  assert hash(r) == hash(composite(recipes.get(own), recipes.get("bf16"), passes))
  assert r.name == f"{own}+{passes[0]}:bf16" and not r.is_high_precision
  mixed, ours, bf16 = (_grads(rc, x, w, dy, key) for rc in (r, own, "bf16"))
  hp = _grads("fp32", x, w, dy, key)
  if passes == ("fwd",):
    np.testing.assert_array_equal(mixed[0], bf16[0])
    assert not np.array_equal(mixed[0], ours[0])
    for got, exact in zip(mixed[1:], hp[1:]):  # backward still FP4: ~4 bits of error
      rel = float(jnp.linalg.norm(got - exact) / jnp.linalg.norm(exact))
      assert 0.02 < rel < 0.35, rel
    if own != "quartet":
      for got, want in zip(mixed[1:], ours[1:]):
        np.testing.assert_array_equal(got, want)
  else:
    np.testing.assert_array_equal(mixed[0], ours[0])
    # QuEST's forward (quartet) back-propagates through its trust mask whatever the backward GEMMs
    # are: the backward is then the forward-only recipe's (QAF), which for the others is bf16's
    fwd_only = dataclasses.replace(recipes.get(own), dgrad=GemmQuant(), wgrad=GemmQuant())
    for got, want, hp16 in zip(mixed[1:], _grads(fwd_only, x, w, dy, key)[1:], bf16[1:]):
      np.testing.assert_array_equal(got, want)
      if own != "quartet":
        np.testing.assert_array_equal(got, hp16)


def test_switches_become_rules_of_exactly_their_paths():
  base = QuantPolicy(recipe="mxfp4", rules=(("down", "nvfp4"),))
  p = with_switches(base, [dict(path="layers/mlp/up", step=2, recipe="bf16", **{"pass": "bwd"}),
                           dict(path="layers/mlp/down", step=5, recipe="mxfp8", **{"pass": "fwd"}),
                           dict(path="layers/mlp/up", step=9, recipe="bf16", **{"pass": "fwd"})])
  assert p.recipe_for("layers/mlp/up").name == "mxfp4+fwd:bf16+bwd:bf16"
  assert p.recipe_for("layers/mlp/down").name == "nvfp4+fwd:mxfp8"  # on top of the base rule
  assert p.recipe_for("layers/mlp/up_proj").name == "mxfp4"  # exact paths only
  assert p.recipe_for("layers/mlp/down_proj").name == "nvfp4"
  assert with_switches(base, []) is base
  assert p.with_recipe("bf16").rules == ()  # warm-up / finish / global fallback drop them
  assert hash(p) == hash(with_switches(base, [dict(path="layers/mlp/up", recipe="bf16",
                                                   **{"pass": "bwd"}),
                                              dict(path="layers/mlp/down", recipe="mxfp8",
                                                   **{"pass": "fwd"}),
                                              dict(path="layers/mlp/up", recipe="bf16",
                                                   **{"pass": "fwd"})]))


@pytest.mark.parametrize("overrides,match", [
    ({"monitor.every": -1}, "monitor.every must be >= 0"),
    ({"monitor.fallback": True}, "monitor.fallback=True needs the monitor"),
    ({"monitor.every": 10, "monitor.fallback_recipe": "bf17"}, "monitor.fallback_recipe 'bf17'"),
    ({"monitor.fallback_after": 0}, "monitor.fallback_after must be >= 1"),
    ({"monitor.max_flushed": -0.5}, "monitor.max_flushed must be a finite number >= 0"),
    ({"monitor.min_out_snr_db": float("nan")}, "monitor.min_out_snr_db must be a finite"),
    ({"debug.monitor_fail_path": "(up"}, "debug.monitor_fail_path '\\(up' is no regex"),
])
def test_monitor_config_errors_are_named(overrides, match):
  with pytest.raises(ConfigError, match=match):
    validate(small("mxfp4", **overrides), 8)


def test_monitor_defaults_and_recipe_names_are_canonical():
  c = validate(small("mxfp4", **{"monitor.every": 100, "monitor.fallback_recipe": "MXFP8"}), 8)
  assert c.monitor.fallback_recipe == "mxfp8"
  m = small().monitor
  assert (m.every, m.min_grad_noise_ratio, m.fallback, m.fallback_recipe) == (0, 1.732, False,
                                                                               "bf16")
