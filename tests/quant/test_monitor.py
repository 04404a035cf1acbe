"""lpjax.quant.site_stats: every statistic against numpy on the same tensors, kept and exact sites,
a planted outlier site found first, scanned blocks, and the quantized run's bits unchanged."""

import json
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from monitor_mlp import D, mlp_batch, mlp_loss, mlp_params

from lpjax import quant
from lpjax.quant.gemm.dot_general import quantizer_inputs
from lpjax.quant.gemm.operand import quantize_view
from lpjax.quant.monitor import operand_numerics as operand_numerics_module
from lpjax.quant.monitor.operand_numerics import STATS, operand_numerics
from lpjax.quant.recipes.gemm_recipe import OperandQuant


# -- independent numpy statistics --------------------------------------------------------------
def _np_common(xs, xh):
  xs, xh = np.asarray(xs, np.float64), np.asarray(xh, np.float64)
  err, power = np.sum((xs - xh) ** 2), np.sum(xs ** 2)
  nz = xs != 0
  return dict(snr_db=10 * np.log10(power / err) if err > 0 else np.inf,
              rel_err=np.sqrt(err / power) if power > 0 else 0.0,
              flushed=np.sum(nz & (xh == 0)) / max(np.sum(nz), 1))


def _np_block_stats(xs, xh, exps, live, clamped, max_value, mult):
  """Statistics from per-block exponents (blocks of the last axis) and decode multipliers."""
  out = _np_common(xs, xh)
  e = exps[live & (mult > 0)].astype(np.float64)  # blocks with a scale (not underflowed to 0)
  out.update(scale_min=e.min(), scale_max=e.max(), scale_std=e.std(),
             clamped_scales=np.sum(clamped & live) / np.sum(live))
  beyond = np.abs(np.asarray(xs, np.float64)) > max_value * mult[..., None]  # clipped at the max
  beyond &= (mult > 0)[..., None]  # (a block whose scale underflowed to 0 is flushed, not clipped)
  out["saturated"] = beyond.mean()
  return out


def _np_mxfp4(xs, xh, mode):
  """MXFP4 (e2m1, emax 2, max 6) blocks of 32 along the last axis; e8m0 exponent by `mode`."""
  xs = np.asarray(xs, np.float32)
  blocks = xs.reshape(xs.shape[:-1] + (-1, 32))
  amax = np.abs(blocks).max(-1).astype(np.float64)
  live = amax > 0
  with np.errstate(divide="ignore"):
    if mode == "floor":
      k = np.floor(np.log2(amax)) - 2
    else:  # rceil
      k = np.ceil(np.log2(amax / 6.0))
  k = np.where(live, k, -127)
  clamped = (k < -127) | (k > 127)
  kc = np.clip(k, -127, 127)
  return _np_block_stats(blocks, np.asarray(xh, np.float32).reshape(blocks.shape), kc, live,
                         clamped, 6.0, 2.0 ** kc)


def _np_nvfp4(xs, xh):
  """NVFP4 blocks of 16 along the last axis: s_b = e4m3(amax_b * (2688 / amax_t) / 6), decode
  multiplier s_b * amax_t / 2688 (docs/numerics.md §5)."""
  xs = np.asarray(xs, np.float32)
  blocks = xs.reshape(xs.shape[:-1] + (-1, 16))
  amax = np.abs(blocks).max(-1)
  amax_t = np.float32(np.abs(xs).max())
  s_enc = np.float32(2688.0) / amax_t
  ideal = amax * s_enc / np.float32(6.0)
  s_b = np.minimum(ideal, 448.0).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
  mult = s_b * amax_t / np.float32(2688.0)
  live = amax > 0
  exps = np.floor(np.log2(np.where(mult > 0, mult, 1.0).astype(np.float64)))
  clamped = (s_b == 0) | (ideal > 448)
  return _np_block_stats(blocks, np.asarray(xh, np.float32).reshape(blocks.shape), exps, live,
                         clamped, 6.0, mult)


def _assert_stats(got: dict, want: dict, where=""):
  for name, value in want.items():
    g = float(got[name])
    if math.isinf(value):
      assert g == value, (where, name, g, value)
    else:
      np.testing.assert_allclose(g, value, rtol=1e-5, atol=1e-7, err_msg=f"{where} {name}")


# -- the models ----------------------------------------------------------------------------------
def _single_gemm_loss(params, batch):
  x, c = batch
  return jnp.sum((x @ params["w"]["kernel"]) * c)  # dY = c exactly


@pytest.fixture(scope="module")
def outlier_run():
  params = mlp_params(jax.random.key(0), outlier=True)
  batch = mlp_batch()
  target = quant.quantized(mlp_loss, "mxfp4")
  t = quant.site_stats(target, params, batch, quant_key=jax.random.key(3), loss_delta=True)
  return target, params, batch, t


# -- tests ---------------------------------------------------------------------------------------
def test_every_statistic_equals_numpy_on_the_tensors_the_gemm_quantizes():
  recipe = quant.get_recipe("mxfp4")  # RHT-32, RTN forward, SR x3/4 rceil backward
  kx, kw, kc = jax.random.split(jax.random.key(5), 3)
  x = jax.random.normal(kx, (32, D))
  w = jax.random.normal(kw, (D, 32)) / 8
  c = jax.random.normal(kc, (32, 32))
  step_key = jax.random.key(9)
  t = quant.site_stats(quant.quantized(_single_gemm_loss, recipe), {"w": {"kernel": w}},
                       (x, c), quant_key=step_key)
  assert {(r["gemm"], r["operand"]) for r in t.rows} == {
      ("fwd", "x"), ("fwd", "w"), ("dgrad", "dy"), ("dgrad", "w"), ("wgrad", "x"), ("wgrad", "dy")}
  key = quant.QuantPolicy().site_key(step_key, "w")  # the site's key, as the interception folds it
  views = {}
  for d in quantizer_inputs(x, w, c, key, recipe):
    assert d["axis"] == -1  # blocked along the last axis: 32-blocks are numpy's last axis
    xs, xh, _ = quantize_view(d["x"], d["op"], axis=-1, key=d["key"], signs=d["signs"],
                              block=d["block"])
    views[(d["gemm"], d["operand"])] = (xs, xh)
    row = next(r for r in t.rows if (r["gemm"], r["operand"]) == (d["gemm"], d["operand"]))
    mode = "floor" if d["gemm"] == "fwd" else "rceil"
    _assert_stats(row, _np_mxfp4(xs, xh, mode), f"{d['gemm']}.{d['operand']}")
  # They are the tensors the GEMM multiplied: dW = Q(X)^T Q(dY) (pre-scale undone, bf16 operands).
  bf = lambda a: (a / 0.75).astype(jnp.bfloat16)
  xm, gm = views[("wgrad", "x")][1], views[("wgrad", "dy")][1]  # (K, M) and (N, M)
  dw = jax.lax.dot_general(bf(gm), bf(xm), (((1,), (1,)), ((), ())),
                           preferred_element_type=jnp.float32).T
  np.testing.assert_allclose(np.asarray(t.grads["w"]["kernel"]), np.asarray(dw), rtol=1e-6)
  # The gradient-noise ratio and the output SNRs against float64 numpy products.
  dw_hp = np.asarray(x, np.float64).T @ np.asarray(c, np.float64)
  ratio = np.linalg.norm(dw_hp) / np.linalg.norm(np.asarray(t.grads["w"]["kernel"]) - dw_hp)
  np.testing.assert_allclose(t.rows[0]["grad_noise_ratio"], ratio, rtol=1e-4)
  wg = next(r for r in t.rows if r["gemm"] == "wgrad")
  np.testing.assert_allclose(wg["out_snr_db"], 20 * np.log10(ratio), rtol=1e-4)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_operand_statistics_and_clamped_scales_against_numpy(fmt):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((8, 64)).astype(np.float32)
  x[0, :3] *= 20.0  # a spread of block scales
  x[1, :16] = np.float32(2.0 ** -140)  # a block below every e8m0 / ue4m3 scale: clamped
  x[1, 16:32] = np.float32(-(2.0 ** -141))
  op = OperandQuant(fmt)
  xs, xh, q = quantize_view(jnp.asarray(x), op, axis=-1, key=None)
  got = operand_numerics(xs, xh, q, op)
  want = _np_mxfp4(xs, xh, "floor") if fmt == "mxfp4" else _np_nvfp4(xs, xh)
  assert want["clamped_scales"] > 0
  _assert_stats(got, want, fmt)


def test_the_scale_histogram_and_flag_counts_equal_numpy_bincount():
  """The block-exponent histogram (two one-hot digits multiplied) and the flag counts are exact
  counts: numpy's bincount of the live blocks, both end bins included, for 1, 77 and 40000
  blocks."""
  rng = np.random.default_rng(3)
  bins_count = operand_numerics_module.EXP_BINS
  for n in (1, 77, 40_000):
    bins = rng.integers(0, bins_count, n).astype(np.int32)
    bins[: min(n, 2)] = [0, bins_count - 1][: min(n, 2)]
    live, a, b = rng.random(n) < 0.8, rng.random(n) < 0.3, rng.random(n) < 0.5
    hist, count_a, count_b = jax.jit(operand_numerics_module._histogram)(
        jnp.asarray(bins), jnp.asarray(live), jnp.asarray(a), jnp.asarray(b))
    np.testing.assert_array_equal(np.asarray(hist), np.bincount(bins[live], minlength=bins_count))
    assert (float(count_a), float(count_b)) == (a.sum(), b.sum())


def test_the_element_sums_read_each_term_once_and_equal_numpy():
  """The operand's element sums (power, error, counts) are one pass over the elements: the
  compiled sums hold no term at the operand's size (XLA:CPU materialized every term before a plain
  float32 sum: 4 B per element per term), and they equal numpy's (float64 sums within 1e-6
  relative, counts exact), for a size that runs of 128 divide and one they do not."""
  rng = np.random.default_rng(4)
  for shape in ((512, 256), (3, 250)):
    x = rng.standard_normal(shape).astype(np.float32)
    xh = (x + 0.01 * rng.standard_normal(shape)).astype(np.float32)
    x.flat[::97] = 0.0
    terms = lambda x, xh: dict(power=jnp.square(x), err=jnp.square(x - xh), nonzero=x != 0)
    f = jax.jit(lambda x, xh: operand_numerics_module._element_sums(terms(x, xh)))
    got = f(x, xh)
    np.testing.assert_allclose(float(got["power"]), np.sum(np.float64(x) ** 2), rtol=1e-6)
    np.testing.assert_allclose(float(got["err"]), np.sum((np.float64(x) - xh) ** 2), rtol=1e-6)
    assert float(got["nonzero"]) == np.count_nonzero(x)
    if x.size % 128 == 0:
      temp = f.lower(x, xh).compile().memory_analysis().temp_size_in_bytes
      assert temp < x.nbytes, (temp, x.nbytes)


def test_a_kept_site_reports_no_error_and_exact_operands_report_none():
  params = mlp_params(jax.random.key(0), outlier=False)
  policy = quant.QuantPolicy(recipe="mxfp4_naive", rules=((r"^l1$", "bf16"),))
  t = quant.site_stats(lambda p, b: mlp_loss(p, b, outlier=False), params, mlp_batch(),
                       policy=policy)
  assert {r["path"] for r in t.rows} == {"l0", "l2", "l3"}  # l1 ran bf16: nothing quantized
  assert all(r["snr_db"] < 25 for r in t.rows)  # the quantized sites do report their error
  # Values on the FP4 grid of their block scale: quantization is exact in all three passes.
  grid = np.array([0.5, 1.0, 2.0, 4.0, -1.0, -2.0, 0.0, 3.0], np.float32)
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.choice(grid, (32, D)).astype(np.float32))
  w = jnp.asarray(rng.choice(grid, (D, 32)).astype(np.float32))
  c = jnp.asarray(rng.choice(grid, (32, 32)).astype(np.float32))
  x, w, c = (a.at[:, 0].set(4.0) for a in (x, w, c))
  t = quant.site_stats(quant.quantized(_single_gemm_loss, "mxfp4_naive"), {"w": {"kernel": w}},
                       (x, c))
  assert len(t.rows) == 6
  for r in t.rows:
    assert r["snr_db"] == math.inf and r["rel_err"] == 0.0, r
    assert r["flushed"] == 0.0 and r["saturated"] == 0.0 and r["clamped_scales"] == 0.0, r
    assert r["out_snr_db"] == math.inf and r["grad_noise_ratio"] == math.inf, r


def _site_min(t, stat):
  out = {}
  for r in t.rows:
    out[r["path"]] = min(out.get(r["path"], math.inf), r[stat])
  return out


def test_planted_outlier_site_ranks_first_on_snr_and_loss_delta(outlier_run):
  _, _, _, t = outlier_run
  assert t.worst(1, by="loss_delta").rows[0]["path"] == "l2"
  deltas = {r["path"]: r["loss_delta"] for r in t.rows}
  others = [abs(v) for p, v in deltas.items() if p != "l2"]
  assert deltas["l2"] > 10 * max(others)
  assert t.worst(1, by="out_snr_db").rows[0]["path"] == "l2"
  snr = _site_min(t, "out_snr_db")
  assert snr["l2"] < min(v for p, v in snr.items() if p != "l2") - 20  # tens of dB below
  # The outlier block scales: a wide spread of exponents where the rest have about one.
  x_rows = {r["path"]: r for r in t.rows if (r["gemm"], r["operand"]) == ("fwd", "x")}
  assert x_rows["l2"]["scale_max"] - x_rows["l2"]["scale_min"] >= 5
  assert x_rows["l2"]["saturated"] > 5 * max(x_rows[p]["saturated"] for p in ("l0", "l1", "l3"))


def test_site_stats_leaves_the_quantized_loss_and_gradients_bit_identical(outlier_run):
  target, params, batch, t = outlier_run
  loss, grads = jax.jit(jax.value_and_grad(
      lambda p, b: target(p, b, quant_key=jax.random.key(3))))(params, batch)
  assert np.asarray(loss).tobytes() == np.asarray(t.loss).tobytes()
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(t.grads)):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def _scanned_loss(params, x):
  def block(h, w):
    return jnp.tanh(h @ w), None
  h, _ = jax.lax.scan(block, x, params["layers"]["kernel"])
  return jnp.mean(h ** 2)


def test_scanned_blocks_give_one_row_per_block_and_the_same_bits():
  w = jax.random.normal(jax.random.key(0), (3, D, D)) / 8
  w = w.at[1].multiply(16.0)  # block 1 differs from the others
  params, x = {"layers": {"kernel": w}}, jax.random.normal(jax.random.key(1), (32, D))
  target = quant.quantized(_scanned_loss, "nvfp4")
  t = quant.site_stats(target, params, x, quant_key=jax.random.key(2))
  fwd_w = [r for r in t.rows if (r["gemm"], r["operand"]) == ("fwd", "w")]
  assert [(r["path"], r["block"]) for r in fwd_w] == [("layers", 0), ("layers", 1), ("layers", 2)]
  # block 1's weights are 16x larger: its NVFP4 block scales sit 4 exponents higher
  assert fwd_w[1]["scale_max"] == fwd_w[0]["scale_max"] + 4
  loss, grads = jax.value_and_grad(lambda p, x: target(p, x, quant_key=jax.random.key(2)))(
      params, x)
  assert np.asarray(loss).tobytes() == np.asarray(t.loss).tobytes()
  assert np.asarray(grads["layers"]["kernel"]).tobytes() == np.asarray(
      t.grads["layers"]["kernel"]).tobytes()


def test_table_worst_markdown_and_json(outlier_run):
  _, _, _, t = outlier_run
  worst = t.worst(3)
  assert len(worst.rows) == 3
  assert [r["snr_db"] for r in worst.rows] == sorted(r["snr_db"] for r in t.rows)[:3]
  md = t.to_markdown().splitlines()
  assert md[0].startswith("| path | block | gemm | operand | snr_db |") and len(md) == len(t.rows) + 2
  data = json.loads(t.to_json())
  assert len(data["rows"]) == len(t.rows) and data["hp_loss"] == pytest.approx(t.hp_loss)
  assert {"path", "gemm", "operand", "snr_db", "rel_err", "saturated", "flushed", "scale_min",
          "scale_max", "scale_std", "clamped_scales", "grad_noise_ratio",
          "loss_delta"} <= set(data["rows"][0])


def test_a_quantize_model_linen_model_through_its_loss():
  import flax.linen as nn

  class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(D, name="down")(jnp.tanh(nn.Dense(D, name="up")(x)))

  qmodel = quant.quantize_model(MLP(), quant.QuantPolicy(recipe="mxfp4_naive", rules=(
      ("^down$", "nvfp4"),)))
  x = jax.random.normal(jax.random.key(0), (16, D))
  params = qmodel.init(jax.random.key(1), x)["params"]
  loss = lambda p, x, quant_key: jnp.mean(qmodel.apply({"params": p}, x, quant_key=quant_key) ** 2)
  t = quant.site_stats(loss, params, x, quant_key=jax.random.key(2))
  assert {(r["path"], r["recipe"]) for r in t.rows} == {("up", "mxfp4_naive"), ("down", "nvfp4")}
  assert len(t.rows) == 12
  ref_loss, ref_grads = jax.jit(jax.value_and_grad(loss))(params, x, jax.random.key(2))
  assert np.asarray(ref_loss).tobytes() == np.asarray(t.loss).tobytes()
  # From jax 0.11 XLA may sum a bias gradient (a reduction over the batch) in another order in the
  # measured program than in the plain one: up to one float32 ulp of the leaf's largest element
  # (seen on jax 0.12.1: 37 of up's 64 bias entries, 0.81 ulp); bit for bit on the pinned jax 0.10
  # (docs/numerics.md §13, "Across JAX releases").
  ulps = 0 if tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 11) else 1
  for a, b in zip(jax.tree.leaves(ref_grads), jax.tree.leaves(t.grads)):
    if ulps == 0:
      assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.abs(a - b).max() <= ulps * np.finfo(np.float32).eps * np.abs(a).max()
