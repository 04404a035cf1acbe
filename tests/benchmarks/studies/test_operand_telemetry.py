"""benchmarks/studies/operand_telemetry.py: every quantized operand of every QDense is reported, per block,
and the forward weight statistics match the numpy oracle's quantization of the restored weights."""

import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path[:0] = [os.path.join(os.path.join(ROOT, "benchmarks"), d)
                for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/
sys.path.insert(0, os.path.join(ROOT, "tests", "quant"))

import numpy_oracle as O  # noqa: E402
import operand_telemetry as telemetry  # noqa: E402

from config_helpers import small  # noqa: E402
from lpjax.train.loop._trainer import Trainer  # noqa: E402

DENSE = ("attn/q_proj", "attn/k_proj", "attn/v_proj", "attn/o_proj", "mlp/gate_proj",
         "mlp/up_proj", "mlp/down_proj")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("run"))
  trainer = Trainer(small(steps=2), workdir)
  trainer.run()
  return workdir, trainer.final_state.params, trainer.task.model_config.layers


def test_every_operand_of_every_block_and_the_weights_match_the_oracle(trained):
  workdir, params, layers = trained
  result = telemetry.measure(workdir, recipe="mxfp4_naive")
  assert result["step"] == 2 and result["recipe"] == "mxfp4_naive"
  expected = {(f"layers/{d}", g, s) for d in DENSE for g, s, _, _ in telemetry.PLACES}
  assert set(result["places"]) == expected
  for values in result["places"].values():
    assert all(len(v) == layers for v in values.values())
    assert all(np.isfinite(v).all() for v in values.values())
  # forward W (K, N), blocked along K, round-to-nearest-even: a function of the weights alone
  kernels = np.asarray(params["layers"]["attn"]["q_proj"]["kernel"])
  w_stats = result["places"][("layers/attn/q_proj", "fwd", "rhs")]
  for l in range(layers):
    w = kernels[l].astype(np.float64)
    q = O.quantize(kernels[l], "mxfp4", axis=0)["values"].astype(np.float64)
    snr = 10 * np.log10(np.sum(w**2) / np.sum((w - q) ** 2))
    assert w_stats["snr_db"][l] == pytest.approx(snr, rel=1e-4)
    assert w_stats["frac_flushed"][l] == pytest.approx(np.mean((w != 0) & (q == 0)), abs=1e-7)
  # the gradient operand is measured (one SR draw: 3/4 pre-scale, an SNR of a few dB to ~20 dB)
  dy = result["places"][("layers/mlp/down_proj", "dgrad", "lhs")]["snr_db"]
  assert all(3 < v < 30 for v in dy)
  table = telemetry.table(result)
  assert "| layers/mlp/up_proj | wgrad | dY |" in table and table.count("\n| layers/") == len(expected)

