"""The per-site monitor's case table (issue 57, items 1, 2 and 8), part 1 of 3: models lpjax did
not write (plain jnp functions and a linen module written here) whose readings must keep "not
measured", "exact", "non-finite" and "bad" apart: a NaN batch is no exact site, a GEMM in an
untaken `cond` branch never ran (it never ranks first, alerts or falls back), and the advisor's
budget is what it says. test_monitor_cases_loops.py (item 3, loops and the fresh cases) and
test_monitor_cases_bits.py (items 4 and 9) are the other parts; monitor_case_models.py holds
what they share.

Each model is measured by one `Measurer` (compiled once, shared by the cases of the same shapes).
"""

from __future__ import annotations

import functools
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bad_input_cases import Case, Holds, Raises, check
from monitor_case_models import (C, D, MLP_P, QK, RECIPE, W_DOWN, W_UP, X, by, fp4_range,
                                 linen_loss, measurer, mlp, monitor_line, normal, stats)

from lpjax import quant


# --- the models ----------------------------------------------------------------------------------


def cond_branches(p, batch):
  """lax.cond on the data: the `big` branch runs only for inputs summing above 1e6 (never here)."""
  x, c = batch
  h = jax.lax.cond(jnp.sum(x) > 1e6, lambda x: jnp.tanh(x @ p["big"]["kernel"]),
                   lambda x: jnp.tanh(x @ p["small"]["kernel"]), x)
  return jnp.mean((h @ p["down"]["kernel"] - c) ** 2)


COND_P = {"big": {"kernel": W_UP}, "small": {"kernel": normal(13, (D, D), 1 / 6)},
          "down": {"kernel": W_DOWN}}


class _LinenCond(nn.Module):
  """nn.cond between two Dense layers on the data (the `rare` one never runs here)."""

  def setup(self):
    self.rare, self.usual, self.out = nn.Dense(D), nn.Dense(D), nn.Dense(D)

  def __call__(self, x):
    if self.is_initializing():  # both branches' parameters exist before the cond
      self.rare(x), self.usual(x)
    h = nn.cond(jnp.sum(x) > 1e6, lambda m, x: m.rare(x), lambda m, x: m.usual(x), self, x)
    return self.out(jnp.tanh(h))


LINEN_COND_LOSS = linen_loss(_LinenCond())


@functools.cache
def _linen_cond_params():
  return _LinenCond().init(jax.random.key(5), X)


# --- item 1: a non-finite batch is no exact site ------------------------------------------------


def _nan_batch():
  t = stats(mlp, MLP_P, (X.at[3, 5].set(jnp.nan), C))
  return (math.isnan(float(t.loss)) and len(t.rows) == 12
          and all(r["status"] == "nonfinite" and math.isnan(r["snr_db"])
                  and math.isnan(r["grad_noise_ratio"]) for r in t.rows)
          and not t.worst(3).rows)  # nothing to rank


def _inf_batch():
  t = stats(mlp, MLP_P, (X.at[0, 0].set(jnp.inf), C))
  return len(t.rows) == 12 and all(r["status"] == "nonfinite" and not r["snr_db"] == math.inf
                                   for r in t.rows)


def _nan_labels():
  """Labels NaN: the forward is finite, the loss and every dY are not: no site is measured."""
  t = stats(mlp, MLP_P, (X, C.at[0, 0].set(jnp.nan)))
  return len(t.rows) == 12 and all(r["status"] == "nonfinite" for r in t.rows)


def _finite_batch_reads_fp4():
  return fp4_range(stats(mlp, MLP_P, (X, C)).rows)


def _advise_nan_batch():
  quant.advise(mlp, MLP_P, [(X, C), (X.at[3, 5].set(jnp.nan), C)], RECIPE, budget=1,
               quant_key=QK)


def _monitor_nan_line():
  lines, found = monitor_line(mlp, MLP_P, (X.at[3, 5].set(jnp.nan), C))
  return (all(r["status"] == "nonfinite" and r["loss"] is None and r["grad_noise_ratio"] is None
              and r["fwd"]["x"]["snr_db"] is None for r in lines) and found == [])


# --- item 2: a site that never ran -------------------------------------------------------------


def _cond_untaken():
  t = stats(cond_branches, COND_P, (X, C), loss_delta=True)
  big, small = by(t, "big"), by(t, "small")
  return (len(big) == 6 and all(r["status"] == "not_run" and math.isnan(r["snr_db"])
                                and math.isnan(r["grad_noise_ratio"]) and r["loss_delta"] is None
                                for r in big)
          and fp4_range(small) and t.worst(1, by="grad_noise_ratio").rows[0]["path"] != "big")


def _linen_cond_untaken():
  t = stats(LINEN_COND_LOSS, _linen_cond_params(), (X, C))
  rare = [r for r in t.rows if r["path"] == "rare"]  # param_path: no linen "params" collection
  usual = [r for r in t.rows if r["path"] == "usual"]
  return len(rare) == 6 and all(r["status"] == "not_run" for r in rare) and fp4_range(usual)


@functools.cache
def _advise_cond():
  """Never first, never kept; the budget a numpy int (item 8)."""
  advice = quant.advise(cond_branches, COND_P, [(X, C)], RECIPE, budget=np.int64(3),
                        quant_key=QK)
  last = advice.ranking[-1]
  return (last["path"] == "big" and last["status"] == "not_run" and not last["kept"]
          and "big" not in advice.kept and "not run" in advice.to_markdown())


def _monitor_cond_never_alerts_or_falls_back():
  from lpjax.train.monitor import _monitor  # noqa: PLC0415

  lines, found = monitor_line(cond_branches, COND_P, (X, C))
  big = [r for r in lines if r["path"] == "big"]
  ok = (len(big) == 1 and big[0]["status"] == "not_run" and big[0]["grad_noise_ratio"] is None
        and not any(a for a in found if a.get("path") == "big"))
  # per-site fallback after one failing measurement: nothing switches on a site that never ran
  mon = _monitor.Monitor.__new__(_monitor.Monitor)
  mon.config = types.SimpleNamespace(fallback_after=1, max_fallback_sites=8,
                                     fallback_recipe="bf16")
  mon.switches, mon.streaks = [], {}
  from lpjax.train.monitor._monitor_rows import alerts  # noqa: PLC0415
  from lpjax.train.config import llama_config  # noqa: PLC0415

  threshold = llama_config().monitor
  found = [dict(a, path=r["path"], block=r["block"]) for r in big for a in alerts(r, threshold)]
  mon._strike(1, {k: v for k, v in measurer(cond_branches).sites.items() if k.path == "big"}, found,
              big)
  return ok and mon.switches == [] and not any(mon.streaks.values())


# --- item 8: numpy budgets ----------------------------------------------------------------------


def _budget(budget):
  quant.advise(mlp, MLP_P, [(X, C)], RECIPE, budget=budget, quant_key=QK)


CASES = [
    # item 1
    Case("1 non-finite", "NaN in the batch", lambda _: _nan_batch(),
         Holds("loss nan, every row nonfinite with NaN statistics, nothing ranked")),
    Case("1 non-finite", "Inf in the batch", lambda _: _inf_batch(), Holds("nonfinite, not inf")),
    Case("1 non-finite", "NaN in the labels only", lambda _: _nan_labels(),
         Holds("every row nonfinite")),
    Case("1 non-finite", "the same batch finite", lambda _: _finite_batch_reads_fp4(),
         Holds("ok, FP4 readings")),
    Case("1 non-finite", "advise on a NaN batch", lambda _: _advise_nan_batch(),
         Raises(ValueError, "batch 1 of 2 is non-finite: the quantized loss is nan")),
    Case("1 non-finite", "monitor.jsonl of a NaN batch", lambda _: _monitor_nan_line(),
         Holds("status nonfinite, nulls, no alert")),
    # item 2
    Case("2 not run", "lax.cond untaken branch", lambda _: _cond_untaken(),
         Holds("not_run, NaN, loss_delta None, never worst")),
    Case("2 not run", "nn.cond untaken branch", lambda _: _linen_cond_untaken(),
         Holds("not_run; the taken branch reads FP4")),
    Case("2 not run", "advise with an untaken branch", lambda _: _advise_cond(),
         Holds("ranked last, not kept")),
    Case("2 not run", "trainer monitor: alerts and fallback",
         lambda _: _monitor_cond_never_alerts_or_falls_back(),
         Holds("status not_run, no alert, no switch, no streak")),
    # item 8
    Case("8 budget", "np.int64 budget", lambda _: _advise_cond(), Holds("accepted")),
    Case("8 budget", "np.float32 budget", lambda _: _budget(np.float32(0.5)) is None,
         Holds("accepted")),
    Case("8 budget", "np.bool_ budget", lambda _: _budget(np.bool_(True)),
         Raises(TypeError, "budget must be an int")),
    Case("8 budget", "negative np.int64 budget", lambda _: _budget(np.int64(-1)),
         Raises(ValueError, "budget must be >= 0 sites")),
    Case("8 budget", "np.float64 budget above 1", lambda _: _budget(np.float64(1.5)),
         Raises(ValueError, "in [0, 1]")),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.group}-{c.name}")
def test_monitor_case(case, tmp_path):
  check(case, lambda: case.run(tmp_path))
