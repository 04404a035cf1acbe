"""`python -m lpjax.advise`: the advised policy as config lines that parse back, that train.py
accepts, and that build exactly the policy `lpjax.quant.advise` returned; clear errors for bad
flags."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from lpjax import advise as cli
from lpjax.train import build_policy, validate
from lpjax.train.schema._quant_rules import parse_rules

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs" / "llama_tiny_mxfp4.py")
# the smallest LLaMA run, in MXFP4 without stochastic rounding or RHT (the quickest to compile)
SMALL = ["--config.seq_len=16", "--config.batch_size=8", "--config.data.prefetch=0",
         "--config.quant.recipe=mxfp4_naive"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  out = tmp_path_factory.mktemp("advise") / "advice.txt"
  argv = [f"--config={CONFIG}", "--budget=default", "--batches=1", f"--out={out}", *SMALL]
  config, opts = cli.load_config(argv)
  advised = cli.advise_run(config, budget=cli.parse_budget(opts["budget"]), batches=1)
  return argv, out, advised


@pytest.mark.slow  # one measurement of LLaMA-tiny (~50 s on 2 CPU cores), shared
def test_main_prints_the_ranking_and_writes_the_lines(run, capsys, monkeypatch):
  argv, out, advised = run
  given = {}

  def measured(config, **kwargs):  # the fixture's measurement, of the same flags
    given.update(kwargs, recipe=config.quant.recipe, seq_len=config.seq_len)
    return advised

  monkeypatch.setattr(cli, "advise_run", measured)
  assert cli.main(argv) == 0
  assert given == dict(budget="default", workdir=None, batches=1, recipe="mxfp4_naive", seq_len=16)
  text = capsys.readouterr().out
  assert "| rank | path | loss_delta | grad_noise_ratio | out_snr_db | flops_fraction | kept |" in text
  lines = out.read_text().splitlines()
  assert lines == list(advised.lines)  # same batches, same key: the same advice
  assert cli.shell_line(lines) in text
  # --budget=default: every GEMM site measured (the head and attention products too), and the
  # budget is the FLOP fraction of those the default keep list keeps
  paths = {r["path"] for r in advised.advice.ranking}
  assert {"lm_head", "layers/attn/attn_scores", "layers/attn/attn_values"} <= paths
  assert set(advised.default_kept) == {"lm_head", "layers/attn/attn_scores",
                                       "layers/attn/attn_values"}
  flops = {r["path"]: r["flops"] for r in advised.advice.ranking}
  assert advised.budget == pytest.approx(sum(flops[p] for p in advised.default_kept)
                                         / sum(flops.values()))
  assert advised.advice.kept_flops_fraction <= advised.budget


@pytest.mark.slow  # one measurement of LLaMA-tiny (~50 s on 2 CPU cores), shared
def test_the_lines_parse_back_and_build_the_advised_policy(run):
  argv, _, advised = run
  lines = list(advised.lines)
  assert lines[0] == "--config.quant.policy=pure"
  rules_flag = lines[-1]
  assert rules_flag.startswith("--config.quant.rules=")
  assert parse_rules(rules_flag.partition("=")[2]) == advised.advice.policy.rules
  config, _ = cli.load_config([f"--config={CONFIG}", "--budget=1", *SMALL, *lines])
  policy = build_policy(validate(config, device_count=1))
  assert policy.rules == advised.advice.policy.rules
  assert policy.pure and advised.advice.policy.pure
  assert policy == advised.advice.policy  # every field: the run's policy, pure, with the rules


@pytest.mark.slow  # one measurement of LLaMA-tiny (~50 s on 2 CPU cores), shared
def test_train_py_accepts_the_lines(run):
  _, _, advised = run
  proc = subprocess.run([sys.executable, str(ROOT / "train.py"), f"--config={CONFIG}",
                         *advised.lines, "--print_config"], capture_output=True, text=True,
                        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
  assert proc.returncode == 0, proc.stderr
  rules = advised.lines[-1].partition("=")[2]
  assert re.search(r"rules\W+" + re.escape(rules), proc.stdout), proc.stdout
  assert re.search(r"policy\W+pure", proc.stdout), proc.stdout


def test_int_budget_keeps_the_run_policy_and_writes_no_pure():
  from lpjax import quant

  policy = quant.QuantPolicy(recipe="mxfp4", rules=(("^layers/mlp/up_proj$", "bf16"),
                                                    ("mlp", "mxfp8")))
  lines = cli.config_lines(policy, pure=False)
  assert lines == ("--config.quant.rules=^layers/mlp/up_proj$->bf16;mlp->mxfp8",)
  assert cli.shell_line(lines) == "--config.quant.rules='^layers/mlp/up_proj$->bf16;mlp->mxfp8'"


@pytest.mark.parametrize("argv,match", [
    ([f"--config={CONFIG}"], "--budget is required"),
    ([f"--config={CONFIG}", "--budget=1.5"], r"--budget=1.5: give an int .* float in \[0, 1\]"),
    ([f"--config={CONFIG}", "--budget=-1"], "must be >= 0"),
    ([f"--config={CONFIG}", "--budget=lots"], "--budget=lots: give an int"),
    (["--budget=1"], "--config is required"),
    (["--config=configs/nope.py", "--budget=1"], "no such file"),
    ([f"--config={CONFIG}", "--budget=1", "extra"], "unexpected arguments"),
    ([f"--config={CONFIG}", "--budget=1", "--batches=0"], "at least 1 batch"),
    ([f"--config={CONFIG}", "--budget=1", "--workdir=/nonexistent/run"], "is no folder"),
    ([f"--config={CONFIG}", "--budget=1", "--config.quant.rules=mlp=bf16"], "has no '->'"),
    ([f"--config={CONFIG}", "--budget=1", "--config.optimizer.lrr=1"], "lrr"),
    ([f"--config={CONFIG}", "--budget=default", "--config.quant.keep_last=1"],
     r"--budget=default with kept blocks .*quant.keep_last=1.* int or float --budget"),
])
def test_bad_flags_are_one_clear_error(argv, match, capsys):
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ")
  assert re.search(match, err), err


@pytest.mark.slow  # a 2-step run and one measurement of its checkpoint
def test_workdir_measures_the_runs_newest_checkpoint(tmp_path):
  from lpjax.train import Trainer

  argv = [f"--config={CONFIG}", "--budget=1", "--config.steps=2", "--config.eval_every=0",
          "--config.progress_bar=False", *SMALL]
  config, _ = cli.load_config(argv)
  trainer = Trainer(config, str(tmp_path / "run"))
  trainer.run()
  files = lambda: {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*") if p.is_file()}
  before = files()
  advised = cli.advise_run(config, budget=1, workdir=str(tmp_path / "run"), batches=1)
  assert files() == before  # the run's workdir is read, not written
  assert advised.source == f"checkpoint step 2 of {tmp_path / 'run'}"
  fresh = cli.advise_run(config, budget=1, batches=1)
  assert fresh.source == f"fresh init (seed {config.seed})"
  # trained weights, not the initialisation: the measured losses differ
  assert advised.advice.ranking != fresh.advice.ranking
