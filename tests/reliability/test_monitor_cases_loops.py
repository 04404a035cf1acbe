"""The per-site monitor's case table (issue 57), part 2 of 3: item 3 (a GEMM in a scan over time
pools its iterations as the same cell unrolled reads) and fresh adversarial cases: loops (fori,
nested and reversed scans, a cond in a scan, a while_loop), transforms (checkpoint, vmap, switch,
a weight used twice), zero and infinite operands, the JSON encodings and the heatmap's cells.
test_monitor_cases.py has items 1, 2 and 8; monitor_case_models.py what the parts share.

Each model is measured by one `Measurer` (compiled once, shared by the cases of the same shapes).
"""

from __future__ import annotations

import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bad_input_cases import Case, Holds, check
from monitor_case_models import (C, D, M, T, W_DOWN, W_UP, X, by, fp4_range, monitor_line, normal,
                                 stats)


# --- the models ----------------------------------------------------------------------------------


def rnn(p, batch):
  """An RNN cell under lax.scan over time (its weight is a constant of the scan)."""
  xs, c = batch

  def step(h, x):
    h = jnp.tanh((h + x) @ p["cell"]["kernel"])
    return h, None

  h, _ = jax.lax.scan(step, jnp.zeros_like(xs[0]), xs)
  return jnp.mean((h @ p["head"]["kernel"] - c) ** 2)


def rnn_unrolled(p, batch):
  xs, c = batch
  h = jnp.zeros_like(xs[0])
  for t in range(xs.shape[0]):
    h = jnp.tanh((h + xs[t]) @ p["cell"]["kernel"])
  return jnp.mean((h @ p["head"]["kernel"] - c) ** 2)


RNN_P = {"cell": {"kernel": normal(12, (D, D), 1 / 4)}, "head": {"kernel": W_DOWN}}
XS = normal(4, (T, M, D))


def loops(p, batch):
  """fori_loop (static bounds: a scan), a nested scan, a cond inside a scan taken on some
  iterations and one never taken, a reversed scan, and a while_loop with a dynamic trip count
  (outside the gradient: JAX cannot differentiate a while_loop in reverse mode)."""
  x, c = batch
  h = jax.lax.fori_loop(0, 3, lambda i, h: jnp.tanh(h @ p["fori"]["kernel"]), x)

  def outer(h, _):
    def inner(h, _):
      return jnp.tanh(h @ p["nested"]["kernel"]), None
    return jax.lax.scan(inner, h, None, length=2)[0], None

  h = jax.lax.scan(outer, h, None, length=2)[0]

  def conds(h, t):
    h = jax.lax.cond(t % 2 == 0, lambda h: jnp.tanh(h @ p["even"]["kernel"]), lambda h: h, h)
    h = jax.lax.cond(t > 100, lambda h: jnp.tanh(h @ p["never"]["kernel"]), lambda h: h, h)
    return h, None

  h = jax.lax.scan(conds, h, jnp.arange(4))[0]
  h = jax.lax.scan(lambda h, _: (jnp.tanh(h @ p["rev"]["kernel"]), None), h, None, length=2,
                   reverse=True)[0]
  n = jnp.int32(jnp.sum(x > 100.0)) + 2  # a trip count the trace cannot know
  w = jax.lax.stop_gradient(p["while"]["kernel"])
  g = jax.lax.while_loop(lambda s: s[0] < n, lambda s: (s[0] + 1, jnp.tanh(s[1] @ w)),
                         (jnp.int32(0), jax.lax.stop_gradient(h)))[1]
  return jnp.mean((h + g - c) ** 2)


LOOPS_P = {k: {"kernel": normal(20 + i, (D, D), 1 / 6)}
           for i, k in enumerate(("fori", "nested", "even", "never", "rev", "while"))}


def transforms(p, batch):
  """A GEMM under jax.checkpoint, one under vmap (examples x tokens), a lax.switch of three
  branches (branch 1 runs) and one weight used twice."""
  x, c = batch
  h = jax.checkpoint(lambda h: jnp.tanh(h @ p["remat"]["kernel"]))(x)
  h = jax.vmap(lambda h: jnp.tanh(h @ p["vmapped"]["kernel"]))(h.reshape(2, M // 2, D))
  branch = jnp.int32(jnp.sum(x) > 1e6) + 1  # 1, not known to the trace
  h = jax.lax.switch(branch, [lambda h, i=i: h @ p[f"sw{i}"]["kernel"] for i in range(3)],
                     h.reshape(M, D))
  h = jnp.tanh(h @ p["twice"]["kernel"])
  h = jnp.tanh(h @ p["twice"]["kernel"])
  return jnp.mean((h - c) ** 2)


TRANSFORMS_P = {k: {"kernel": normal(30 + i, (D, D), 1 / 6)}
                for i, k in enumerate(("remat", "vmapped", "sw0", "sw1", "sw2", "twice"))}


def single(p, batch):
  x, c = batch
  return jnp.mean((x @ p["w"]["kernel"] - c) ** 2)


# --- item 3: a scan over time pools its iterations ----------------------------------------------


def _rnn_matches_unrolled():
  scan, unrolled = stats(rnn, RNN_P, (XS, C)), stats(rnn_unrolled, RNN_P, (XS, C))
  cell = by(scan, "cell")
  assert len(cell) == 6 and all(r["in_loop"] and r["status"] == "ok" for r in cell), cell
  for r in cell:
    calls = by(unrolled, "cell", r["gemm"], r["operand"])
    assert len(calls) == T
    for stat in ("snr_db", "out_snr_db"):
      want = np.mean([u[stat] for u in calls])
      assert abs(r[stat] - want) < 1.0, (r["gemm"], r["operand"], stat, r[stat], want)
    want = np.mean([u["grad_noise_ratio"] for u in calls])
    assert abs(r["grad_noise_ratio"] / want - 1) < 0.10, (r["grad_noise_ratio"], want)
    assert r["flops"] == sum(u["flops"] for u in calls) == T * 2 * M * D * D
  return True


# --- fresh cases --------------------------------------------------------------------------------


@functools.cache
def _loops_table():
  return stats(loops, LOOPS_P, (X, C))


def _fori_loop():
  rows = by(_loops_table(), "fori")
  return (fp4_range(rows) and all(r["in_loop"] and r["flops"] == 3 * 2 * M * D * D
                                   for r in rows))


def _nested_scan():
  rows = by(_loops_table(), "nested")
  return fp4_range(rows) and all(r["flops"] == 4 * 2 * M * D * D for r in rows)


def _cond_in_scan_taken_sometimes():
  rows = by(_loops_table(), "even")
  return fp4_range(rows) and all(r["flops"] == 4 * 2 * M * D * D for r in rows)


def _cond_in_scan_never_taken():
  rows = by(_loops_table(), "never")
  return len(rows) == 6 and all(r["status"] == "not_run" for r in rows)


def _reversed_scan():
  return fp4_range(by(_loops_table(), "rev"))


def _while_loop():
  """A while_loop's body runs as written: its GEMM is not quantized, so it has no rows."""
  return not by(_loops_table(), "while") and len(_loops_table().sites()) == 5


@functools.cache
def _transforms_table():
  return stats(transforms, TRANSFORMS_P, (X, C))


def _checkpointed():
  return fp4_range(by(_transforms_table(), "remat"))


def _vmapped():
  rows = by(_transforms_table(), "vmapped")
  return fp4_range(rows) and all(r["flops"] == 2 * M * D * D for r in rows)


def _switch_three_branches():
  t = _transforms_table()
  return (all(len(by(t, p)) == 6 for p in ("sw0", "sw1", "sw2"))
          and all(r["status"] == "not_run" for p in ("sw0", "sw2") for r in by(t, p))
          and all(r["status"] == "ok" for r in by(t, "sw1")))


def _site_used_twice():
  rows = by(_transforms_table(), "twice")
  return sorted({r["call"] for r in rows}) == [0, 1] and fp4_range(rows)


def _zero_weights():
  """W = 0: its operands quantize exactly (status exact, snr inf, rel_err 0); X and dY do not."""
  t = stats(single, {"w": {"kernel": jnp.zeros((D, D))}}, (X, C))
  w_rows = [r for r in t.rows if r["operand"] == "w"]
  others = [r for r in t.rows if r["operand"] != "w"]
  return (len(w_rows) == 2 and all(r["status"] == "exact" and r["snr_db"] == math.inf
                                   and r["rel_err"] == 0.0 for r in w_rows)
          and all(r["status"] == "ok" and r["snr_db"] < 30 for r in others))


def _zero_input():
  """X = 0: X quantizes exactly and dW = X^T dY = 0 exactly (ratio inf); W and dY still err."""
  t = stats(single, {"w": {"kernel": W_UP}}, (jnp.zeros((M, D)), C))
  x_rows = [r for r in t.rows if r["operand"] == "x"]
  return (all(r["status"] == "exact" and r["snr_db"] == math.inf for r in x_rows)
          and all(r["grad_noise_ratio"] == math.inf for r in t.rows)
          and all(r["status"] == "ok" for r in t.rows if r["operand"] != "x"))


def _inf_in_weights():
  t = stats(single, {"w": {"kernel": W_UP.at[0, 0].set(jnp.inf)}}, (X, C))
  return len(t.rows) == 6 and all(r["status"] == "nonfinite" and math.isnan(r["snr_db"])
                                  for r in t.rows)


def _json_encodings():
  """SiteStats.to_json and monitor.jsonl: valid JSON (no bare NaN / Infinity); exact is "inf"."""
  t = stats(single, {"w": {"kernel": jnp.zeros((D, D))}}, (X, C))
  data = json.loads(t.to_json())
  json.dumps(data, allow_nan=False)
  w = next(r for r in data["rows"] if r["operand"] == "w")
  lines, _ = monitor_line(single, {"w": {"kernel": jnp.zeros((D, D))}}, (X, C))
  return (w["status"] == "exact" and w["snr_db"] == "inf" and lines[0]["status"] == "ok"
          and lines[0]["fwd"]["w"] == dict(lines[0]["fwd"]["w"], status="exact", snr_db="inf"))


def _heatmap_cells():
  """The heatmap's grids: a cell that did not run or saw NaN is no reading (NaN), marked by its
  status; an exact reading is inf (drawn at the top of the scale)."""
  from lpjax.train.monitor._monitor_heatmap import STATUS_CODES, grids, status_grid  # noqa: PLC0415

  def line(step, path, status, snr):
    return {"step": step, "path": path, "block": None, "call": 0, "status": status,
            "grad_noise_ratio": snr, "fwd": {"out_snr_db": snr, "x": {}},
            "dgrad": {"out_snr_db": None}, "wgrad": {"out_snr_db": None}}

  rows = [line(1, "a", "ok", "inf"), line(1, "b", "not_run", None),
          line(2, "a", "nonfinite", None), line(2, "b", "ok", 12.0)]
  labels, steps, snr, gnr = grids(rows)
  marks = status_grid(rows, labels, steps)
  return bool(snr[0, 0] == math.inf and gnr[0, 0] == math.inf and snr[1, 1] == 12.0
          and np.isnan(snr[1, 0]) and np.isnan(snr[0, 1])
          and marks[1, 0] == STATUS_CODES["not_run"] and marks[0, 1] == STATUS_CODES["nonfinite"]
          and np.isnan(marks[0, 0]))


CASES = [
    # item 3
    Case("3 loops", "RNN cell under lax.scan vs unrolled", lambda _: _rnn_matches_unrolled(),
         Holds("within 1 dB, ratio within 10%, FLOPs of every step")),
    # fresh
    Case("fresh", "fori_loop of 3", lambda _: _fori_loop(), Holds("FP4 readings, FLOPs x3")),
    Case("fresh", "scan in a scan", lambda _: _nested_scan(), Holds("FP4 readings, FLOPs x4")),
    Case("fresh", "cond in a scan, taken on half the steps",
         lambda _: _cond_in_scan_taken_sometimes(), Holds("ok, FP4 readings")),
    Case("fresh", "cond in a scan, never taken", lambda _: _cond_in_scan_never_taken(),
         Holds("not_run")),
    Case("fresh", "reversed scan", lambda _: _reversed_scan(), Holds("FP4 readings")),
    Case("fresh", "while_loop", lambda _: _while_loop(), Holds("not quantized, no rows")),
    Case("fresh", "jax.checkpoint", lambda _: _checkpointed(), Holds("FP4 readings")),
    Case("fresh", "vmap over a GEMM", lambda _: _vmapped(), Holds("pooled, FLOPs of all")),
    Case("fresh", "lax.switch of three", lambda _: _switch_three_branches(),
         Holds("two not_run, one ok")),
    Case("fresh", "a site used twice", lambda _: _site_used_twice(), Holds("calls 0 and 1")),
    Case("fresh", "zero weights", lambda _: _zero_weights(), Holds("w exact, the rest ok")),
    Case("fresh", "all-zero input", lambda _: _zero_input(), Holds("x exact, ratio inf")),
    Case("fresh", "Inf in the weights", lambda _: _inf_in_weights(), Holds("nonfinite")),
    Case("fresh", "JSON encodings", lambda _: _json_encodings(), Holds("valid, exact is 'inf'")),
    Case("fresh", "heatmap cells", lambda _: _heatmap_cells(), Holds("statuses apart")),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.group}-{c.name}")
def test_monitor_case(case, tmp_path):
  check(case, lambda: case.run(tmp_path))
