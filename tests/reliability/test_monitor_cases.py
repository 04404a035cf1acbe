"""The per-site monitor's case table (issue 57, items 1-4, 8 and 9, and a fresh adversarial pass):
models lpjax did not write (plain jnp functions, linen and NNX modules written here) whose
readings must keep "not measured", "exact", "non-finite" and "bad" apart: a NaN batch is no exact
site, a GEMM in an untaken `cond` branch never ran (it never ranks first, alerts or falls back), a
GEMM in a scan over time pools its iterations as the same cell unrolled reads, the measured
gradients are the plain run's bits, and the advisor's budget and baseline are what it says.

Each model is measured by one `Measurer` (compiled once, shared by the cases of the same shapes).
"""

from __future__ import annotations

import functools
import json
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

from bad_input_cases import Case, Holds, Raises, check

from lpjax import quant
from lpjax.quant.monitor.site_stats import Measurer

D, M, T = 32, 32, 4  # features, tokens (rows of a GEMM), time steps of the RNN
QK = jax.random.key(1)
RECIPE = "mxfp4"  # RHT, RTN forward, SR backward: FP4 reads ~15-19 dB per operand


def _normal(seed, shape, scale=1.0):
  return jax.random.normal(jax.random.key(seed), shape) * scale


X = _normal(2, (M, D))
C = _normal(3, (M, D))
W_UP, W_DOWN = _normal(10, (D, D), 1 / 6), _normal(11, (D, D), 1 / 6)


# --- the models ----------------------------------------------------------------------------------


def mlp(p, batch):
  x, c = batch
  h = jnp.tanh(x @ p["up"]["kernel"] + p["up"]["bias"])
  return jnp.mean((h @ p["down"]["kernel"] - c) ** 2)


MLP_P = {"up": {"kernel": W_UP, "bias": jnp.full((D,), 0.1)}, "down": {"kernel": W_DOWN}}


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


RNN_P = {"cell": {"kernel": _normal(12, (D, D), 1 / 4)}, "head": {"kernel": W_DOWN}}
XS = _normal(4, (T, M, D))


def cond_branches(p, batch):
  """lax.cond on the data: the `big` branch runs only for inputs summing above 1e6 (never here)."""
  x, c = batch
  h = jax.lax.cond(jnp.sum(x) > 1e6, lambda x: jnp.tanh(x @ p["big"]["kernel"]),
                   lambda x: jnp.tanh(x @ p["small"]["kernel"]), x)
  return jnp.mean((h @ p["down"]["kernel"] - c) ** 2)


COND_P = {"big": {"kernel": W_UP}, "small": {"kernel": _normal(13, (D, D), 1 / 6)},
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


def _linen_loss(module):
  def loss(p, batch):
    x, c = batch
    return jnp.mean((module.apply(p, x) - c) ** 2)
  return loss


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


LOOPS_P = {k: {"kernel": _normal(20 + i, (D, D), 1 / 6)}
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


TRANSFORMS_P = {k: {"kernel": _normal(30 + i, (D, D), 1 / 6)}
                for i, k in enumerate(("remat", "vmapped", "sw0", "sw1", "sw2", "twice"))}


def single(p, batch):
  x, c = batch
  return jnp.mean((x @ p["w"]["kernel"] - c) ** 2)


# --- measurements (each model compiled once) -----------------------------------------------------


@functools.cache
def _measurer(name: str) -> Measurer:
  fns = {"mlp": mlp, "rnn": rnn, "rnn_unrolled": rnn_unrolled, "cond": cond_branches,
         "linen_cond": _linen_loss(_LinenCond()), "loops": loops, "transforms": transforms,
         "single": single}
  return Measurer(fns[name], RECIPE)


def _stats(name, params, batch, loss_delta=False):
  return _measurer(name)(params, batch, quant_key=QK, loss_delta=loss_delta)


def _by(t, path, gemm=None, operand=None):
  return [r for r in t.rows if r["path"] == path and (gemm is None or r["gemm"] == gemm)
          and (operand is None or r["operand"] == operand)]


def _fp4_range(rows) -> bool:
  """Rows, every reading in FP4's range: operand SNR 8-30 dB, product SNR 5-30 dB, ratio 1-30."""
  return bool(rows) and all(r["status"] == "ok" and 8 < r["snr_db"] < 30
                            and 5 < r["out_snr_db"] < 30 and 1 < r["grad_noise_ratio"] < 30
                            for r in rows)


@functools.cache
def _linen_cond_params():
  return _LinenCond().init(jax.random.key(5), X)


# --- item 1: a non-finite batch is no exact site ------------------------------------------------


def _nan_batch():
  t = _stats("mlp", MLP_P, (X.at[3, 5].set(jnp.nan), C))
  return (math.isnan(float(t.loss)) and len(t.rows) == 12
          and all(r["status"] == "nonfinite" and math.isnan(r["snr_db"])
                  and math.isnan(r["grad_noise_ratio"]) for r in t.rows)
          and not t.worst(3).rows)  # nothing to rank


def _inf_batch():
  t = _stats("mlp", MLP_P, (X.at[0, 0].set(jnp.inf), C))
  return len(t.rows) == 12 and all(r["status"] == "nonfinite" and not r["snr_db"] == math.inf
                                   for r in t.rows)


def _nan_labels():
  """Labels NaN: the forward is finite, the loss and every dY are not: no site is measured."""
  t = _stats("mlp", MLP_P, (X, C.at[0, 0].set(jnp.nan)))
  return len(t.rows) == 12 and all(r["status"] == "nonfinite" for r in t.rows)


def _finite_batch_reads_fp4():
  return _fp4_range(_stats("mlp", MLP_P, (X, C)).rows)


def _advise_nan_batch():
  quant.advise(mlp, MLP_P, [(X, C), (X.at[3, 5].set(jnp.nan), C)], RECIPE, budget=1,
               quant_key=QK)


def _monitor_line(name, params, batch):
  """The trainer's monitor.jsonl lines (and their alerts) of one measured pass."""
  from lpjax.train._monitor_rows import alerts, row  # noqa: PLC0415
  from lpjax.train.config import llama_config  # noqa: PLC0415

  m = _measurer(name)
  if m.sites is None:
    m(params, batch, quant_key=QK)  # discovers the sites
  loss, _, stats = m._stats(QK, params, batch)
  lines = [row(1, loss, k, b, info, np.asarray(stats[k])[b]) for k, info in m.sites.items()
           for b in range(info.rows)]
  config = llama_config().monitor
  return [json.loads(json.dumps(r, allow_nan=False)) for r in lines], [
      a for r in lines for a in alerts(r, config)]


def _monitor_nan_line():
  lines, found = _monitor_line("mlp", MLP_P, (X.at[3, 5].set(jnp.nan), C))
  return (all(r["status"] == "nonfinite" and r["loss"] is None and r["grad_noise_ratio"] is None
              and r["fwd"]["x"]["snr_db"] is None for r in lines) and found == [])


# --- item 2: a site that never ran -------------------------------------------------------------


def _cond_untaken():
  t = _stats("cond", COND_P, (X, C), loss_delta=True)
  big, small = _by(t, "big"), _by(t, "small")
  return (len(big) == 6 and all(r["status"] == "not_run" and math.isnan(r["snr_db"])
                                and math.isnan(r["grad_noise_ratio"]) and r["loss_delta"] is None
                                for r in big)
          and _fp4_range(small) and t.worst(1, by="grad_noise_ratio").rows[0]["path"] != "big")


def _linen_cond_untaken():
  t = _stats("linen_cond", _linen_cond_params(), (X, C))
  rare = [r for r in t.rows if r["path"] == "rare"]  # param_path: no linen "params" collection
  usual = [r for r in t.rows if r["path"] == "usual"]
  return len(rare) == 6 and all(r["status"] == "not_run" for r in rare) and _fp4_range(usual)


@functools.cache
def _advise_cond():
  """Never first, never kept; the budget a numpy int (item 8)."""
  advice = quant.advise(cond_branches, COND_P, [(X, C)], RECIPE, budget=np.int64(3),
                        quant_key=QK)
  last = advice.ranking[-1]
  return (last["path"] == "big" and last["status"] == "not_run" and not last["kept"]
          and "big" not in advice.kept and "not run" in advice.to_markdown())


def _monitor_cond_never_alerts_or_falls_back():
  from lpjax.train import _monitor  # noqa: PLC0415

  lines, found = _monitor_line("cond", COND_P, (X, C))
  big = [r for r in lines if r["path"] == "big"]
  ok = (len(big) == 1 and big[0]["status"] == "not_run" and big[0]["grad_noise_ratio"] is None
        and not any(a for a in found if a.get("path") == "big"))
  # per-site fallback after one failing measurement: nothing switches on a site that never ran
  mon = _monitor.Monitor.__new__(_monitor.Monitor)
  mon.config = types.SimpleNamespace(fallback_after=1, max_fallback_sites=8,
                                     fallback_recipe="bf16")
  mon.switches, mon.streaks = [], {}
  from lpjax.train._monitor_rows import alerts  # noqa: PLC0415
  from lpjax.train.config import llama_config  # noqa: PLC0415

  threshold = llama_config().monitor
  found = [dict(a, path=r["path"], block=r["block"]) for r in big for a in alerts(r, threshold)]
  mon._strike(1, {k: v for k, v in _measurer("cond").sites.items() if k.path == "big"}, found,
              big)
  return ok and mon.switches == [] and not any(mon.streaks.values())


# --- item 3: a scan over time pools its iterations ----------------------------------------------


def _rnn_matches_unrolled():
  scan, unrolled = _stats("rnn", RNN_P, (XS, C)), _stats("rnn_unrolled", RNN_P, (XS, C))
  cell = _by(scan, "cell")
  assert len(cell) == 6 and all(r["in_loop"] and r["status"] == "ok" for r in cell), cell
  for r in cell:
    calls = _by(unrolled, "cell", r["gemm"], r["operand"])
    assert len(calls) == T
    for stat in ("snr_db", "out_snr_db"):
      want = np.mean([u[stat] for u in calls])
      assert abs(r[stat] - want) < 1.0, (r["gemm"], r["operand"], stat, r[stat], want)
    want = np.mean([u["grad_noise_ratio"] for u in calls])
    assert abs(r["grad_noise_ratio"] / want - 1) < 0.10, (r["grad_noise_ratio"], want)
    assert r["flops"] == sum(u["flops"] for u in calls) == T * 2 * M * D * D
  return True


# --- item 4: the measured gradients are the plain run's bits ------------------------------------


class _Block(nn.Module):
  @nn.compact
  def __call__(self, h, _):
    return jnp.tanh(nn.Dense(D)(h)), None


class _LinenScan(nn.Module):
  @nn.compact
  def __call__(self, x):
    stack = nn.scan(_Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=2)
    return stack(name="layers")(x, None)[0]


class _LinenMLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(D, name="down")(jnp.tanh(nn.Dense(D, name="up")(x)))


class _NNXScan(nnx.Module):
  """Two stacked layers (kernel and bias) run by lax.scan."""

  def __init__(self, rngs):
    self.kernel = nnx.Param(jax.random.normal(rngs.params(), (2, D, D)) / 6)
    self.bias = nnx.Param(jnp.full((2, D), 0.1))

  def __call__(self, x):
    body = lambda h, wb: (jnp.tanh(h @ wb[0] + wb[1]), None)
    return jax.lax.scan(body, x, (self.kernel.value, self.bias.value))[0]


def _bits(kind):
  if kind == "plain":
    loss, params = mlp, MLP_P
  elif kind in ("linen_scan", "linen"):
    module = _LinenScan() if kind == "linen_scan" else _LinenMLP()
    loss, params = _linen_loss(module), module.init(jax.random.key(6), X)
  else:
    graphdef, params = nnx.split(_NNXScan(nnx.Rngs(7)))
    loss = lambda s, b: jnp.mean((nnx.merge(graphdef, s)(b[0]) - b[1]) ** 2)
  target = quant.quantized(loss, RECIPE)
  t = quant.site_stats(target, params, (X, C), quant_key=QK)
  plain = jax.jit(jax.value_and_grad(lambda p, b: target(p, b, quant_key=QK)))(params, (X, C))
  same = lambda a, b: np.asarray(a).tobytes() == np.asarray(b).tobytes()
  leaves = zip(jax.tree.leaves(plain[1]), jax.tree.leaves(t.grads))
  return len(t.rows) > 0 and same(plain[0], t.loss) and all(same(a, b) for a, b in leaves)


# --- item 8: numpy budgets ----------------------------------------------------------------------


def _budget(budget):
  quant.advise(mlp, MLP_P, [(X, C)], RECIPE, budget=budget, quant_key=QK)


# --- item 9: the loss_delta baseline of a quantize_model model is its policy's ------------------


def _quantize_model_baseline():
  module = _LinenMLP()
  params = module.init(jax.random.key(8), X)
  qm = quant.quantize_model(module, quant.QuantPolicy(recipe=RECIPE, high_precision="fp32"))
  loss = lambda p, b, quant_key=None: jnp.mean(
      (qm.apply(p, b[0], rngs={"quant": quant_key}) - b[1]) ** 2)
  t = quant.site_stats(loss, params, (X, C), quant_key=QK, loss_delta=True)
  fp32 = float(jnp.mean((module.apply(params, X) - C) ** 2))  # the model as written
  bf16 = float(jnp.mean((quant.quantize_model(module, "bf16").apply(params, X) - C) ** 2))
  assert abs(bf16 - fp32) > 1e-5 * abs(fp32), (bf16, fp32)  # the two baselines differ
  assert abs(t.hp_loss - fp32) <= 1e-6 * abs(fp32), (t.hp_loss, fp32, bf16)
  return True


# --- fresh cases --------------------------------------------------------------------------------


@functools.cache
def _loops_table():
  return _stats("loops", LOOPS_P, (X, C))


def _fori_loop():
  rows = _by(_loops_table(), "fori")
  return (_fp4_range(rows) and all(r["in_loop"] and r["flops"] == 3 * 2 * M * D * D
                                   for r in rows))


def _nested_scan():
  rows = _by(_loops_table(), "nested")
  return _fp4_range(rows) and all(r["flops"] == 4 * 2 * M * D * D for r in rows)


def _cond_in_scan_taken_sometimes():
  rows = _by(_loops_table(), "even")
  return _fp4_range(rows) and all(r["flops"] == 4 * 2 * M * D * D for r in rows)


def _cond_in_scan_never_taken():
  rows = _by(_loops_table(), "never")
  return len(rows) == 6 and all(r["status"] == "not_run" for r in rows)


def _reversed_scan():
  return _fp4_range(_by(_loops_table(), "rev"))


def _while_loop():
  """A while_loop's body runs as written: its GEMM is not quantized, so it has no rows."""
  return not _by(_loops_table(), "while") and len(_loops_table().sites()) == 5


@functools.cache
def _transforms_table():
  return _stats("transforms", TRANSFORMS_P, (X, C))


def _checkpointed():
  return _fp4_range(_by(_transforms_table(), "remat"))


def _vmapped():
  rows = _by(_transforms_table(), "vmapped")
  return _fp4_range(rows) and all(r["flops"] == 2 * M * D * D for r in rows)


def _switch_three_branches():
  t = _transforms_table()
  return (all(len(_by(t, p)) == 6 for p in ("sw0", "sw1", "sw2"))
          and all(r["status"] == "not_run" for p in ("sw0", "sw2") for r in _by(t, p))
          and all(r["status"] == "ok" for r in _by(t, "sw1")))


def _site_used_twice():
  rows = _by(_transforms_table(), "twice")
  return sorted({r["call"] for r in rows}) == [0, 1] and _fp4_range(rows)


def _zero_weights():
  """W = 0: its operands quantize exactly (status exact, snr inf, rel_err 0); X and dY do not."""
  t = _stats("single", {"w": {"kernel": jnp.zeros((D, D))}}, (X, C))
  w_rows = [r for r in t.rows if r["operand"] == "w"]
  others = [r for r in t.rows if r["operand"] != "w"]
  return (len(w_rows) == 2 and all(r["status"] == "exact" and r["snr_db"] == math.inf
                                   and r["rel_err"] == 0.0 for r in w_rows)
          and all(r["status"] == "ok" and r["snr_db"] < 30 for r in others))


def _zero_input():
  """X = 0: X quantizes exactly and dW = X^T dY = 0 exactly (ratio inf); W and dY still err."""
  t = _stats("single", {"w": {"kernel": W_UP}}, (jnp.zeros((M, D)), C))
  x_rows = [r for r in t.rows if r["operand"] == "x"]
  return (all(r["status"] == "exact" and r["snr_db"] == math.inf for r in x_rows)
          and all(r["grad_noise_ratio"] == math.inf for r in t.rows)
          and all(r["status"] == "ok" for r in t.rows if r["operand"] != "x"))


def _inf_in_weights():
  t = _stats("single", {"w": {"kernel": W_UP.at[0, 0].set(jnp.inf)}}, (X, C))
  return len(t.rows) == 6 and all(r["status"] == "nonfinite" and math.isnan(r["snr_db"])
                                  for r in t.rows)


def _json_encodings():
  """SiteStats.to_json and monitor.jsonl: valid JSON (no bare NaN / Infinity); exact is "inf"."""
  t = _stats("single", {"w": {"kernel": jnp.zeros((D, D))}}, (X, C))
  data = json.loads(t.to_json())
  json.dumps(data, allow_nan=False)
  w = next(r for r in data["rows"] if r["operand"] == "w")
  lines, _ = _monitor_line("single", {"w": {"kernel": jnp.zeros((D, D))}}, (X, C))
  return (w["status"] == "exact" and w["snr_db"] == "inf" and lines[0]["status"] == "ok"
          and lines[0]["fwd"]["w"] == dict(lines[0]["fwd"]["w"], status="exact", snr_db="inf"))


def _heatmap_cells():
  """The heatmap's grids: a cell that did not run or saw NaN is no reading (NaN), marked by its
  status; an exact reading is inf (drawn at the top of the scale)."""
  from lpjax.train._monitor_heatmap import STATUS_CODES, grids, status_grid  # noqa: PLC0415

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
    # item 3
    Case("3 loops", "RNN cell under lax.scan vs unrolled", lambda _: _rnn_matches_unrolled(),
         Holds("within 1 dB, ratio within 10%, FLOPs of every step")),
    # item 4
    *[Case("4 bits", f"grads of {kind}", lambda _, kind=kind: _bits(kind),
           Holds("loss and grads bit-identical to the plain jitted run"))
      for kind in ("plain", "linen_scan", "nnx_scan", "linen")],
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
    # item 9
    Case("9 baseline", "quantize_model with high_precision fp32",
         lambda _: _quantize_model_baseline(),
         Holds("hp_loss is the fp32 model's loss")),
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
