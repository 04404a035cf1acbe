"""The trainer's monitor on lpjax's own LLaMA (scanned blocks, lpjax.nn layers): one row per
quantized site and block, equal to `lpjax.quant.site_stats` on the same params, batch and key; the
default keep list's sites (LM head, attention products) report nothing; the measured steps make
the same updates as a run with the monitor off. (The model.factory path:
test_trainer_monitor.py.)"""

import jax
import numpy as np
import pytest

from config_helpers import small
from lpjax.models.llama_sizes import LLAMA_SIZES
from lpjax.train.loop._trainer import Trainer
from monitor_helpers import check_against_site_stats, losses, read

LINEARS = {f"layers/attn/{p}_proj" for p in "qkvo"} | {f"layers/mlp/{p}_proj"
                                                       for p in ("gate", "up", "down")}


@pytest.mark.slow
def test_llama_rows_per_block_equal_site_stats_and_the_updates_are_the_same(tmp_path):
  one = jax.devices()[:1]
  on = Trainer(small("mxfp4", steps=2, **{"monitor.every": 1}), str(tmp_path / "on"), devices=one)
  on.run()
  rows = read(tmp_path / "on" / "monitor.jsonl")
  blocks = {r["block"] for r in rows}  # a scanned stack: one row per block
  assert blocks == set(range(LLAMA_SIZES["tiny"].layers))
  # every quantized linear layer of every block, at both steps; nothing of the kept sites
  assert {(r["path"], r["block"], r["step"]) for r in rows} == {
      (p, b, s) for p in LINEARS for b in blocks for s in (1, 2)}
  assert len(rows) == len(LINEARS) * len(blocks) * 2
  assert all(r["recipe"] == "mxfp4" and set(r["fwd"]) == {"out_snr_db", "x", "w"} for r in rows)
  # MXFP4 products: an error of a few percent, neither exact nor broken
  assert all(8 < r["fwd"]["out_snr_db"] < 30 for r in rows)
  check_against_site_stats(on, [r for r in rows if r["step"] == 1],
                           operands=len(LINEARS) * len(blocks) * 6)

  off = Trainer(small("mxfp4", steps=2), str(tmp_path / "off"), devices=one)
  off.run()
  assert not (tmp_path / "off" / "monitor.jsonl").exists()
  assert losses(tmp_path / "on") == losses(tmp_path / "off") and len(losses(tmp_path / "off")) == 2
  for a, b in zip(jax.tree.leaves(on.final_state.params), jax.tree.leaves(off.final_state.params)):
    assert np.array_equal(a, b)
