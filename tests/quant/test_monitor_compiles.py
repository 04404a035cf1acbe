"""The advisor's measurement is one compiled function per batch shape, whatever the number of
sites; each selected-site forward runs one product per GEMM (not both); and its loss_delta equals
an independent reference (a policy keeping every other site in high precision), bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import monitoring

from lpjax import quant
from lpjax.quant.monitor.site_stats import Measurer, discover, selected_loss

D = 64
RECIPE = "mxfp4_naive"  # the cheapest to compile
SEEN: list = []  # (fun_name) of every XLA backend compile while a test listens


def _listener(event, duration, **kw):
  if event == "/jax/core/compile/backend_compile_duration" and SEEN and SEEN[0] is True:
    SEEN.append(kw.get("fun_name", "?"))


monitoring.register_event_duration_secs_listener(_listener)


def _params(layers, seed=0):
  keys = jax.random.split(jax.random.key(seed), layers)
  return {f"l{i}": {"kernel": jax.random.normal(k, (D, D)) / 8} for i, k in enumerate(keys)}


def _loss(params, batch):
  h = batch
  for i in range(len(params)):
    h = jnp.tanh(h @ params[f"l{i}"]["kernel"])
  return jnp.mean(h ** 2)


def _batches(n=2, rows=32):
  return [jax.random.normal(jax.random.key(10 + i), (rows, D)) for i in range(n)]


def _compiles_of(fn):
  """The names of the XLA compiles that `fn()` triggers."""
  SEEN[:] = [True]
  try:
    fn()
  finally:
    names = SEEN[1:]
    SEEN[:] = []
  return names


@pytest.mark.parametrize("layers", [1, 3])
def test_the_measurer_compiles_once_per_batch_shape_whatever_the_number_of_sites(layers):
  from lpjax.quant.codec import factor_tables
  factor_tables.e8m0_rows()  # the per-process constant tables, built op by op once per process
  params = _params(layers)
  m = Measurer(quant.quantized(_loss, RECIPE))
  key = jax.random.key(1)
  first, second = _batches(2)
  # the statistics and every site's (and block's) forward: one compile
  assert len(_compiles_of(lambda: m(params, first, quant_key=key, loss_delta=True))) == 1
  assert _compiles_of(lambda: m(params, second, quant_key=key, loss_delta=True)) == []
  other = _batches(1, rows=16)[0]  # a new batch shape: one more
  assert len(_compiles_of(lambda: m(params, other, quant_key=key, loss_delta=True))) == 1


def test_a_selected_forward_runs_one_product_per_gemm():
  """Each quantized GEMM of the loss-delta forward is a cond between its quantized and its
  high-precision product (one runs), not a select of both."""
  params, batch = _params(3), _batches(1)[0]
  call = lambda p, b: quant.quantized(_loss, RECIPE)(p, b, quant_key=jax.random.key(1))
  sites = discover(call, params, batch)
  jaxpr = jax.make_jaxpr(selected_loss(call, sites))(0, 0, params, batch)
  conds = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "cond"]
  assert len(conds) == len(sites) == 3


def test_loss_delta_equals_the_policy_that_keeps_every_other_site():
  params, batch = _params(4), _batches(1)[0]
  key = jax.random.key(3)
  hp = quant.QuantPolicy(recipe=RECIPE).high_precision
  t = quant.site_stats(quant.quantized(_loss, RECIPE), params, batch, quant_key=key,
                       loss_delta=True)
  run = lambda rules: float(quant.quantized(_loss, quant.QuantPolicy(recipe=RECIPE, rules=rules))(
      params, batch, quant_key=key))
  none = run((("^l[0-9]$", hp),))
  assert t.hp_loss == none
  deltas = {r["path"]: r["loss_delta"] for r in t.rows}
  assert sorted(deltas) == ["l0", "l1", "l2", "l3"]
  for path, delta in deltas.items():
    assert delta == run(((f"^(?!{path}$)l[0-9]$", hp),)) - none, path


def test_the_advisors_statistics_run_no_quantizer_again():
  """operand_stats=False (the advisor's): the products' statistics, grad_noise_ratio and the
  counts bit-identical to the full measurement's, and no quantizer of the statistics in the
  lowered function (the full one quantizes every operand again)."""
  import re

  from lpjax.quant.monitor.observer import SINK_FIELDS
  from lpjax.quant.monitor.site_stats import measured_value_and_grad

  params, batch = _params(2), _batches(1)[0]
  call = lambda p, b: quant.quantized(_loss, RECIPE)(p, b, quant_key=jax.random.key(1))
  sites = discover(call, params, batch)
  fns = {flag: jax.jit(measured_value_and_grad(call, sites, operand_stats=flag))
         for flag in (True, False)}
  requantized = {flag: len(re.findall(r"call @_quantize_(?:unpacked_)?xla",
                                           f.lower(params, batch).as_text()))
                 for flag, f in fns.items()}
  assert requantized[False] == 0 < requantized[True], requantized
  (_, _, full), (_, _, lean) = fns[True](params, batch), fns[False](params, batch)
  own = [i for i, f in enumerate(SINK_FIELDS) if f.count(".") < 2]  # not an operand's field
  for k in sites:
    a, b = np.asarray(full[k]), np.asarray(lean[k])
    assert a[:, own].tobytes() == b[:, own].tobytes()


def test_rows_without_operand_statistics_read_nan_never_exact():
  """Measurer(operand_stats=False): the operand fields were not measured, so every row reads NaN
  there and its status is the product's ("ok"), never "exact" (an inf snr of zero sums)."""
  import math

  from lpjax.quant.monitor.site_stats import Measurer

  params, batch = _params(2), _batches(1)[0]
  rows = Measurer(_loss, RECIPE, operand_stats=False)(params, batch,
                                                        quant_key=jax.random.key(1)).rows
  assert rows
  for r in rows:
    assert r["status"] == "ok", r
    assert math.isnan(r["snr_db"]) and math.isnan(r["rel_err"]), r
    assert math.isfinite(r["out_snr_db"]) and math.isfinite(r["grad_noise_ratio"]), r


def _instructions(fn, *args) -> int:
  """Instructions of the optimized HLO of `jax.jit(fn)(*args)` (a load-free size of a compile)."""
  import re
  text = jax.jit(fn).lower(*args).compile().as_text()
  return len(re.findall(r"^\s+\S+ = ", text, re.M))


def test_the_statistics_are_finished_in_one_computation_for_every_site():
  """The products' statistics of a measured step (operand_stats=False: the advisor's) cost a
  bounded fraction of the plain value_and_grad's HLO: the sums of every site are finished as one
  array (sink.finish_all), not per site and per field (3 sites of a 3-layer MLP were 2.95x the
  plain step's instructions, per-field finishing ~1700 instructions a site; now 1.45x)."""
  from lpjax.quant.monitor.site_stats import measured_value_and_grad

  params, batch = _params(3), _batches(1)[0]
  call = lambda p, b: quant.quantized(_loss, RECIPE)(p, b, quant_key=jax.random.key(1))
  sites = discover(call, params, batch)
  plain = _instructions(jax.value_and_grad(call), params, batch)
  lean = _instructions(measured_value_and_grad(call, sites, operand_stats=False), params, batch)
  assert lean <= 1.6 * plain, (lean, plain)


def test_a_sites_statistics_do_not_depend_on_the_rows_finished_with_it():
  """finish gives a row the same bits alone or stacked with other sites' rows (its sums are
  reduced in a fixed order): a site reads the same whatever else is measured in the step."""
  from lpjax.quant.monitor import sink
  from lpjax.quant.monitor.operand_numerics import EXP_BINS, SUMS

  rng = np.random.default_rng(0)
  acc = np.zeros((24, sink.SIZE), np.float32)
  acc[:, -2] = 1.0  # calls
  for i in range(len(sink.OPERANDS)):
    base = i * (len(SUMS) + EXP_BINS)
    acc[:, base:base + len(SUMS)] = rng.random((24, len(SUMS))) * 100
    bins = base + len(SUMS) + rng.integers(120, 200, size=(24, 6))
    for r in range(24):
      acc[r, bins[r]] = rng.integers(1, 10 ** 5, size=6)
  finish = jax.jit(sink.finish)
  alone = np.concatenate([np.asarray(finish(acc[r:r + 1])) for r in range(24)])
  stacked = np.asarray(finish(acc))
  assert alone.tobytes() == stacked.tobytes()
  parts = {i: acc[4 * i:4 * i + 4] for i in range(6)}
  together = jax.jit(sink.finish_all)(parts)
  for i, part in parts.items():
    assert np.asarray(together[i]).tobytes() == np.asarray(finish(part)).tobytes()


@pytest.mark.parametrize("recipe", ["mxfp4", "nvfp4"])
def test_the_measured_step_quantizes_each_operand_once(recipe, monkeypatch):
  """The operand statistics read the quantizations the GEMM multiplies (pass_operands'
  OPERAND_OBSERVER): one quantizer call per quantized operand in the lowered measured function
  (3 layers x 6 operands), where the statistics used to quantize all six again next to the
  step's own (18 fake_quant + 18 quantize); and the statistics equal, bit for bit, those of the
  operands quantized again from the same inputs and keys."""
  import collections
  import re

  from lpjax.quant.monitor import observer
  from lpjax.quant.monitor.site_stats import measured_value_and_grad

  params, batch = _params(3), _batches(1)[0]
  call = lambda p, b: quant.quantized(_loss, recipe)(p, b, quant_key=jax.random.key(1))
  sites = discover(call, params, batch)
  f = measured_value_and_grad(call, sites)
  text = jax.jit(f).lower(params, batch).as_text()
  calls = collections.Counter(re.sub(r"_[0-9]+$", "", m)
                              for m in re.findall(r"call @(_[a-z_]*quant[a-z_0-9]*)", text))
  assert calls["_quantize_unpacked_xla"] + calls["_fake_quant_xla"] == 3 * 6, calls
  loss, grads, stats = jax.jit(f)(params, batch)
  plain_loss, plain_grads = jax.jit(jax.value_and_grad(call))(params, batch)
  assert np.asarray(loss).tobytes() == np.asarray(plain_loss).tobytes()
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(plain_grads)):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
  import contextlib
  monkeypatch.setattr(observer, "_seeing", lambda active: contextlib.nullcontext({}))
  _, _, again = jax.jit(measured_value_and_grad(call, sites))(params, batch)
  for k in sites:
    np.testing.assert_array_equal(np.asarray(stats[k]), np.asarray(again[k]), err_msg=str(k))


@pytest.mark.parametrize("recipe", ["mxfp4", "nvfp4"])
def test_the_operand_statistics_read_one_unpacked_encode(recipe):
  """The measured step's operand statistics read the codes, scales and values of the one encode
  the GEMM multiplies (`quantize_unpacked`): no nibble packing or unpacking, no code-table gather,
  no scatter for the scale histogram, and a bounded compile (3-layer MLP: measured / plain
  optimized-HLO instructions were 4.65x (mxfp4) and 3.27x (nvfp4), now 2.36x and 1.98x)."""
  import re

  from lpjax.quant.monitor.operand_numerics import EXP_BINS
  from lpjax.quant.monitor.site_stats import measured_value_and_grad

  params, batch = _params(3), _batches(1)[0]
  call = lambda p, b: quant.quantized(_loss, recipe)(p, b, quant_key=jax.random.key(1))
  sites = discover(call, params, batch)
  f = measured_value_and_grad(call, sites)
  lowered = jax.jit(f).lower(params, batch).as_text()
  assert len(re.findall(r"call @_quantize_unpacked_xla", lowered)) == 3 * 6
  assert not re.findall(r"call @_(?:de)?quantize_xla", lowered)  # nothing packed, nothing unpacked
  text = jax.jit(f).lower(params, batch).compile().as_text()
  assert not re.search(r"= \S+ (?:scatter|while)\(", text)
  # no array of one row per block and one column per histogram bin (XLA:CPU materializes a
  # reduction's input whole: that was 1.3 KB per block, the measured step's peak memory)
  bins = (EXP_BINS, EXP_BINS + 1, EXP_BINS + 2)
  shapes = [tuple(map(int, s.split(","))) for s in re.findall(r"\w\[(\d+(?:,\d+)+)\]", text)]
  blocks = 32 * D // 32  # the fewest blocks of any operand here (32 x 64, 32-blocks)
  assert not [s for s in shapes if set(s) & set(bins) and max(set(s) - set(bins), default=0) >= blocks]
  plain = _instructions(jax.value_and_grad(call), params, batch)
  measured = len(re.findall(r"^\s+\S+ = ", text, re.M))
  assert measured <= {"mxfp4": 2.8, "nvfp4": 2.2}[recipe] * plain, (measured, plain)
