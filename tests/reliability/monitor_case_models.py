"""What the per-site monitor's case tables share (test_monitor_cases*.py, issue 57): the data, the
two-layer MLP, one `Measurer` per model (compiled once, shared by the cases of the same shapes)
and the readers of a measured table.

The tables are three files, so that `pytest -n 2 --dist loadfile` runs them side by side:
test_monitor_cases.py (items 1, 2 and 8: non-finite, not run, budgets),
test_monitor_cases_loops.py (item 3 and the fresh cases: loops, transforms, zeros, JSON) and
test_monitor_cases_bits.py (items 4 and 9: the measured gradients' bits, the loss_delta baseline).
"""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.quant.monitor.site_stats import Measurer

D, M, T = 32, 32, 4  # features, tokens (rows of a GEMM), time steps of the RNN
QK = jax.random.key(1)
RECIPE = "mxfp4"  # RHT, RTN forward, SR backward: FP4 reads ~15-19 dB per operand


def normal(seed, shape, scale=1.0):
  return jax.random.normal(jax.random.key(seed), shape) * scale


X = normal(2, (M, D))
C = normal(3, (M, D))
W_UP, W_DOWN = normal(10, (D, D), 1 / 6), normal(11, (D, D), 1 / 6)


def mlp(p, batch):
  x, c = batch
  h = jnp.tanh(x @ p["up"]["kernel"] + p["up"]["bias"])
  return jnp.mean((h @ p["down"]["kernel"] - c) ** 2)


MLP_P = {"up": {"kernel": W_UP, "bias": jnp.full((D,), 0.1)}, "down": {"kernel": W_DOWN}}


def linen_loss(module):
  def loss(p, batch):
    x, c = batch
    return jnp.mean((module.apply(p, x) - c) ** 2)
  return loss


@functools.cache
def measurer(loss_fn) -> Measurer:
  """The one `Measurer` of `loss_fn` (a module-level function: compiled once per shape)."""
  return Measurer(loss_fn, RECIPE)


def stats(loss_fn, params, batch, loss_delta=False):
  return measurer(loss_fn)(params, batch, quant_key=QK, loss_delta=loss_delta)


def by(t, path, gemm=None, operand=None):
  return [r for r in t.rows if r["path"] == path and (gemm is None or r["gemm"] == gemm)
          and (operand is None or r["operand"] == operand)]


def fp4_range(rows) -> bool:
  """Rows, every reading in FP4's range: operand SNR 8-30 dB, product SNR 5-30 dB, ratio 1-30."""
  return bool(rows) and all(r["status"] == "ok" and 8 < r["snr_db"] < 30
                            and 5 < r["out_snr_db"] < 30 and 1 < r["grad_noise_ratio"] < 30
                            for r in rows)


def monitor_line(loss_fn, params, batch):
  """The trainer's monitor.jsonl lines (and their alerts) of one measured pass."""
  from lpjax.train.monitor._monitor_rows import alerts, row  # noqa: PLC0415
  from lpjax.train.config import llama_config  # noqa: PLC0415

  m = measurer(loss_fn)
  if m.sites is None:
    m(params, batch, quant_key=QK)  # discovers the sites
  loss, _, readings = m._stats(QK, params, batch)
  lines = [row(1, loss, k, b, info, np.asarray(readings[k])[b]) for k, info in m.sites.items()
           for b in range(info.rows)]
  config = llama_config().monitor
  return [json.loads(json.dumps(r, allow_nan=False)) for r in lines], [
      a for r in lines for a in alerts(r, config)]
