"""benchmarks/studies/advisor_vs_defaults.py: the run grid's commands and its table (no training)."""

import argparse
import os
import sys

import numpy as np

sys.path[:0] = [os.path.join(os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmarks"), d)
                for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/
import advisor_vs_defaults as bench  # noqa: E402


def _args(tmp_path, **kw):
  a = dict(steps=300, seeds=[0, 1, 2], recipes=["mxfp4"], arms=["default", "advised", "pure"], batches=2,
           root=str(tmp_path), report_only=True, retrain_same=False)
  a.update(kw)
  return argparse.Namespace(**a)


def test_arms_flags_and_the_table(tmp_path):
  args = _args(tmp_path)
  advice = tmp_path / "mxfp4" / "advice"
  advice.mkdir(parents=True)
  for s in (0, 1, 2):
    (advice / f"seed{s}.txt").write_text("--config.quant.policy=pure\n"
                                         "--config.quant.rules=^layers/attn/v_proj$->bf16\n")
    (advice / f"seed{s}.md").write_text(
        "Measured 2 batch(es) at the fresh init (seed 0); budget 0.1700 of the GEMM FLOPs "
        "(the default keep list's).\n\nKept in high precision: layers/attn/v_proj (0.0800 of "
        "the GEMM FLOPs).\n")
  assert bench.arm_flags(args, "mxfp4", "default", 0) == []
  assert bench.arm_flags(args, "mxfp4", "pure", 0) == ["--config.quant.policy=pure"]
  assert bench.arm_flags(args, "mxfp4", "advised", 1) == [
      "--config.quant.policy=pure", "--config.quant.rules=^layers/attn/v_proj$->bf16"]
  losses = {"default": [2.30, 2.34, 2.32], "advised": [2.28, 2.31, 2.29], "pure": [2.5, None, 2.6]}
  results = {("mxfp4", arm, s): v for arm, vals in losses.items() for s, v in enumerate(vals)}
  text = bench.table(args, results)
  rows = {line.split(" | ")[1]: line for line in text.splitlines()[2:]}
  for arm in ("default", "advised"):
    v = np.array(losses[arm])
    assert f"{v.mean():.4f} ± {v.std(ddof=1):.4f}" in rows[arm]
  assert "s1: -" in rows["pure"] and "2.5500 ± 0.0707" in rows["pure"]
  assert "| 0.170 |" in rows["default"] and "| 0.080 |" in rows["advised"]
  assert "| 0.000 |" in rows["pure"]
  assert bench.train(args, "mxfp4", "default", 0) is None  # report_only: nothing runs


RANKING = """Measured 2 batch(es) at the checkpoint step 1000; budget 0.1696 of the GEMM FLOPs.

| rank | path | loss_delta | grad_noise_ratio | out_snr_db | flops_fraction | kept | kept_by_default |
|---|---|---|---|---|---|---|---|
| 1 | lm_head | 0.0119 | 5.89 | 11.8 | 0.034 | yes | yes |
| 2 | layers/mlp/down_proj | 0.006939 | 4.55 | 13.1 | 0.186 | {down} |  |
| 3 | layers/attn/attn_scores | 0.004062 | 4.3 | 8.5 | 0.068 | {scores} | yes |
"""


def test_an_advice_that_keeps_the_default_list_is_the_default_run(tmp_path):
  args = _args(tmp_path, arms=["default", "advised_ckpt"])
  folder = tmp_path / "mxfp4" / "advice_ckpt"
  folder.mkdir(parents=True)
  (folder / "seed0.txt").write_text("--config.quant.policy=pure\n")
  (folder / "seed0.md").write_text(RANKING.format(down="", scores="yes"))
  (folder / "seed1.txt").write_text("--config.quant.policy=pure\n")
  (folder / "seed1.md").write_text(RANKING.format(down="yes", scores=""))
  assert bench.keeps_the_default_list(args, "mxfp4", "advised_ckpt", 0)
  assert not bench.keeps_the_default_list(args, "mxfp4", "advised_ckpt", 1)
  assert not bench.keeps_the_default_list(args, "mxfp4", "default", 0)
  done = tmp_path / "mxfp4" / "default" / "seed0"
  done.mkdir(parents=True)
  (done / "results.json").write_text('{"steps": 300, "final_eval_loss": 2.25}')
  assert bench.train(args, "mxfp4", "advised_ckpt", 0)["final_eval_loss"] == 2.25
  assert bench.train(args, "mxfp4", "advised_ckpt", 1) is None  # its own run: not trained here


def test_record_holds_each_arms_mean_std_and_seeds(tmp_path, monkeypatch):
  import json

  import records
  args = _args(tmp_path, arms=["default", "advised_ckpt"])
  results = {("mxfp4", "default", 0): 1.8320, ("mxfp4", "default", 1): 1.8935,
             ("mxfp4", "default", 2): 1.8232, ("mxfp4", "advised_ckpt", 0): 1.8553,
             ("mxfp4", "advised_ckpt", 1): None}
  figures = bench.figures_of(args, results)
  d = np.array([1.8320, 1.8935, 1.8232])
  assert np.isclose(figures["mxfp4_default_mean"], d.mean())
  assert np.isclose(figures["mxfp4_default_std"], d.std(ddof=1))
  assert figures["mxfp4_default_seed1"] == 1.8935
  assert figures["mxfp4_advised_ckpt_mean"] == 1.8553  # one seed: a mean, no std
  assert "mxfp4_advised_ckpt_std" not in figures and "mxfp4_advised_ckpt_seed1" not in figures
  # --record on finished runs (report_only: nothing trains) writes the record
  for s, v in enumerate([1.8320, 1.8935, 1.8232]):
    run = tmp_path / "mxfp4" / "default" / f"seed{s}"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"steps": 300, "final_eval_loss": v}))
  monkeypatch.setattr(records, "RECORDS_DIR", str(tmp_path / "records"))
  bench.main(["--steps=300", "--recipes=mxfp4", "--arms=default", f"--root={tmp_path}",
              "--report_only", "--record"])
  record = json.loads((tmp_path / "records" / "advisor_vs_defaults_300.json").read_text())
  assert np.isclose(record["figures"]["mxfp4_default_mean"], d.mean())
  assert "--record" in record["command"]
