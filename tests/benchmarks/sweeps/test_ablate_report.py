"""benchmarks/sweeps/ablate_report.py and run_machine.py: the tables' statistics against hand-computed
numbers, and which runs a table may compare (machine fingerprints)."""

import json
import os
import sys

import pytest

sys.path[:0] = [os.path.join(os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmarks"), d)
                for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/

import ablate  # noqa: E402
import ablate_report as report  # noqa: E402
import ablate_sweeps as sweeps  # noqa: E402
import run_machine  # noqa: E402

MICRO = ["--seeds", "1", "--steps", "3", "--set", "batch_size=8", "--set", "seq_len=32",
         "--set", "eval_steps=1", "--set", "log_every=1"]

# --- statistics against hand-computed numbers -------------------------------------------------

def _fake_run(path, loss=None, fp=None, wall=100.0, curve=(), error=None):
  os.makedirs(path, exist_ok=True)
  if error:
    json.dump({"type": "TrainingError", "error": error}, open(os.path.join(path, "failed.json"), "w"))
  else:
    json.dump({"final_eval_loss": loss, "final_eval_loss_fp": fp if fp is not None else loss - 0.01,
               "final_train_loss": loss - 0.5, "wall_time_s": wall, "steps": 3},
              open(os.path.join(path, "results.json"), "w"))
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    for step, value in curve:
      f.write(json.dumps({"step": step, "train/loss": value}) + "\n")


def _rows(tmp_path, table):
  rows = []
  for label, runs in table.items():
    loaded = []
    for seed, kwargs in enumerate(runs):
      _fake_run(str(tmp_path / label / f"seed{seed}"), **kwargs)
      loaded.append({**report.load_run(str(tmp_path / label / f"seed{seed}")), "seed": seed})
    rows.append({"label": label, "recipe": "mxfp4", "optimizer": "adam", "lr": 3e-3,
                 "overrides": [], "command": "python train.py", "runs": loaded})
  return rows


def test_table_mean_std_and_ratio(tmp_path):
  rows = _rows(tmp_path, {
      "fp32_adam": [dict(loss=2.0, wall=90, curve=[(1, 5.0), (2, 4.0)]),
                    dict(loss=2.1, wall=110, curve=[(1, 6.0), (2, 3.0)]), dict(loss=2.2, wall=100)],
      "a": [dict(loss=2.2, fp=2.0), dict(loss=2.3, fp=2.1), dict(loss=2.4, fp=2.2)],
      "b": [dict(loss=2.5), dict(error="3 non-finite steps"), dict(loss=2.7)],
  })
  s = report.summarize("demo", rows, "fp32_adam", {"size": "tiny", "scale": "cpu", "steps": 3,
                                                   "seeds": [0, 1, 2]})
  ref, a, b = s["rows"]
  assert ref["mean"] == pytest.approx(2.1) and ref["std"] == pytest.approx(0.1)
  assert ref["wall_mean"] == pytest.approx(100.0)
  assert a["mean"] == pytest.approx(2.3) and a["std"] == pytest.approx(0.1)
  assert a["fp_mean"] == pytest.approx(2.1) and a["ratio_pct"] == pytest.approx(100 * (2.3 / 2.1 - 1))
  assert b["mean"] == pytest.approx(2.6) and b["std"] == pytest.approx(2**0.5 / 10)
  assert (b["n"], b["n_ok"], b["n_diverged"]) == (3, 2, 1)
  assert ref["curve"] == {"steps": [1, 2], "mean": [5.5, 3.5],
                          "std": pytest.approx([2**0.5 / 2, 2**0.5 / 2])}
  md = report.markdown(s)
  assert ("| fp32_adam | `mxfp4` | adam | 0.003 | 2.1000 ± 0.1000 | 2.0900 ± 0.1000 | +0.00% | 100 s "
          "| 3/3 |") in md
  assert "| a | `mxfp4` | adam | 0.003 | 2.3000 ± 0.1000 | 2.1000 ± 0.1000 | +9.52% |" in md
  assert "| b | `mxfp4` | adam | 0.003 | 2.6000 ± 0.1414 |" in md and "2/3 (1 diverged)" in md
  assert "- b: TrainingError: 3 non-finite steps" in md


def test_plots_state_the_number_of_seeds_and_draw_no_error_band_for_one(tmp_path):
  one = [{"label": "a", "n_ok": 1}, {"label": "b", "n_ok": 1}]
  assert report.seeds_note(one) == "n = 1 seed (no error band)"
  assert report.seeds_note([{"n_ok": 3}, {"n_ok": 3}]).startswith("n = 3 seeds per row")
  assert report.seeds_note([{"n_ok": 1}, {"n_ok": 3}]).startswith("n = 1-3 seeds per row")
  assert report.seeds_note([{"n_ok": 0}]) == "no finished runs"
  assert report.row_legend({"label": "mxfp4", "n_ok": 2}) == "mxfp4 (n=2)"
  pytest.importorskip("matplotlib")
  rows = _rows(tmp_path, {"fp32_adam": [dict(loss=2.0, curve=[(1, 5.0), (2, 4.0)])],
                          "a": [dict(loss=2.2, curve=[(1, 5.5), (2, 4.5)])]})
  s = report.summarize("demo", rows, "fp32_adam", {"size": "tiny", "scale": "cpu", "steps": 3,
                                                   "seeds": [0]})
  paths = report.write_reports(s, str(tmp_path / "out"))
  for key in ("curves", "final"):
    with open(paths[key], "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_ratio_of_a_row_with_fewer_seeds_uses_the_reference_runs_of_the_same_seeds(tmp_path):
  """A row with only seed 0 so far is compared with the reference's seed 0 (2.0), not with the
  mean of its three seeds (2.4): +10%, not -8.3%."""
  rows = _rows(tmp_path, {"fp32_adam": [dict(loss=2.0), dict(loss=2.4), dict(loss=2.8)],
                          "partial": [dict(loss=2.2)]})
  rows[1]["runs"] += [{"seed": 1, "status": "missing", "results": {}, "error": None, "curve": {}}]
  s = report.summarize("demo", rows, "fp32_adam", {"seeds": [0, 1, 2]})
  assert s["rows"][1]["ratio_pct"] == pytest.approx(10.0)
  assert s["rows"][0]["ratio_pct"] == 0.0


def _stats(tmp_path, table):
  return {r["label"]: report.row_stats(r["runs"]) for r in _rows(tmp_path, table)}


def test_quality_goals_against_hand_computed_verdicts(tmp_path):
  three = lambda *losses: [dict(loss=x) for x in losses]
  stats = _stats(tmp_path, {
      "fp32_adam": three(2.0, 2.0, 2.0),
      "mxfp4_bwd_adam": three(2.019, 2.019, 2.019),  # +0.95%: holds
      "mxfp4_adam": three(2.06, 2.07, 2.08),  # +3.5%: fails
      "nvfp4_adam": three(2.05, 2.05, 2.05),  # below mxfp4: holds
      "mxfp4_naive_adam": three(2.07, 2.08, 2.09),  # +0.01 with 2 SE = 0.0163: not visible
      "fp32_stable_spam": three(1.99, 1.99, 1.99),  # holds
      "mxfp4_stable_spam": three(2.1, 2.1, 2.1),  # worse than adam: fails
      "mxfp4_adam_lr3x": [dict(loss=2.2), dict(error="diverged"), dict(loss=2.2)],  # diverged: degrades
      "mxfp4_stable_spam_lr3x": three(2.11, 2.11, 2.11),  # within +1% of 2.1 and < inf: holds
  })
  verdicts = [g["holds"] for g in report.quality_goals(stats)]
  assert verdicts == [True, False, True, False, True, False, True, True]
  stats["mxfp4_naive_adam"] = _stats(tmp_path / "n", {"mxfp4_naive_adam": three(2.3, 2.3, 2.31)})[
      "mxfp4_naive_adam"]
  assert report.quality_goals(stats)[3]["holds"] is True
  del stats["nvfp4_adam"]
  assert report.quality_goals(stats)[2]["holds"] is None  # not run: not measured
  text = report.quality_markdown(report.quality_goals(stats))
  assert "| nvfp4 no worse than mxfp4 | not run vs 2.0700 | not measured |" in text


def test_a_run_recorded_before_a_config_field_existed_still_counts(tmp_path):
  """A finished run whose key lacks a field lpjax added later is the same run when the field is
  at its default, and another run otherwise (`ablate.py` refuses to mix them)."""
  row = sweeps.SWEEPS["recipes"][0]
  config = sweeps.row_config(row, size="tiny", seed=0, steps=5)
  key = ablate.run_key(config)
  recorded = json.loads(key)
  del recorded["grad_accum_dtype"]  # as a run of a version before the field was recorded it
  recorded = json.dumps(recorded, sort_keys=True)
  assert ablate.same_run(recorded, key)
  config.grad_accum_dtype = "bfloat16"
  assert not ablate.same_run(recorded, ablate.run_key(config))
  config.grad_accum_dtype, config.optimizer.lr = "float32", 0.5
  assert not ablate.same_run(recorded, ablate.run_key(config))


def _record_machine(path, machine, key="{}"):
  json.dump({"key": key, "machine": machine}, open(os.path.join(path, "run.json"), "w"))


def test_runs_from_another_machine_are_left_out_and_named(tmp_path):
  """A row's run whose machine differs from the reference run of the same seed is not compared
  (the same config trains to another loss on another machine); runs without a record count."""
  here = run_machine.fingerprint()
  other = {**here, "cpu": "Other CPU 9000", "cores": 64}
  rows = _rows(tmp_path, {"fp32_adam": [dict(loss=2.0), dict(loss=2.2)],
                          "a": [dict(loss=2.1), dict(loss=9.9)],
                          "b": [dict(loss=2.4), dict(loss=2.6)]})
  for label, machines in {"fp32_adam": [here, here], "a": [here, other], "b": [None, here]}.items():
    for seed, machine in enumerate(machines):
      if machine is not None:
        _record_machine(str(tmp_path / label / f"seed{seed}"), machine)
  rows = [{**r, "runs": [{**report.load_run(str(tmp_path / r["label"] / f"seed{k}")), "seed": k}
                         for k in range(2)]} for r in rows]
  s = report.summarize("demo", rows, "fp32_adam", {"seeds": [0, 1]})
  ref, a, b = s["rows"]
  assert a["mean"] == pytest.approx(2.1) and (a["n_done"], a["n_ok"], a["n_diverged"]) == (1, 1, 0)
  assert a["runs"][1]["status"] == "other machine" and a["runs"][1]["machine"]["cores"] == 64
  assert b["mean"] == pytest.approx(2.5) and b["n_ok"] == 2  # no record: nothing to compare
  assert len(s["other_machines"]) == 1 and "a seed 1: ran on Other CPU 9000, 64 cores" in \
      s["other_machines"][0]
  md = report.markdown(s)
  assert "another machine" in md and "- a seed 1: ran on Other CPU 9000" in md


def test_fingerprints_compare_everything_but_the_virtual_device_count(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  eight = run_machine.fingerprint()
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
  assert run_machine.same_machine(eight, run_machine.fingerprint())
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_thunk_runtime=false")
  assert not run_machine.same_machine(eight, run_machine.fingerprint())
  assert not run_machine.same_machine(eight, {**eight, "jaxlib": "0.0.1"})
  assert not run_machine.same_machine(eight, {**eight, "gpus": ["NVIDIA H200"]})


def test_a_sweep_resumed_on_another_machine_keeps_or_reruns_its_runs(tmp_path, capsys):
  """Finished runs of another machine are kept (and noted) by default; --rerun-other-machines
  plans them again and moves the old run aside (not in a dry run)."""
  out = str(tmp_path)
  args = ["format", "--out", out, "--rows", "mxfp4_naive"] + MICRO
  parsed = ablate.parse_args(args)
  other = {**run_machine.fingerprint(), "cpu": "Other CPU 9000"}
  for label in ("fp32_adam", "mxfp4_naive"):
    task = next(t for t in ablate.plan(parsed)[1] if t.row.label == label)
    _fake_run(task.workdir, loss=2.0)
    _record_machine(task.workdir, other, ablate.run_key(ablate.config_of(task, parsed)))
  capsys.readouterr()
  assert ablate.main(args + ["--dry-run"]) == 0
  log = capsys.readouterr().out
  assert "0 to train" in log and log.count("ran on another machine (Other CPU 9000") == 2
  assert ablate.main(args + ["--dry-run", "--rerun-other-machines"]) == 0
  log = capsys.readouterr().out
  assert "2 runs: 2 to train" in log and "(dry run: not moved)" in log
  assert not any(name.endswith(".other-machine")
                 for name in os.listdir(os.path.join(out, "runs", "format", "fp32_adam")))
  _, _, to_run, _ = ablate.plan(ablate.parse_args(args + ["--rerun-other-machines"]))
  assert len(to_run) == 2
  moved = os.path.join(out, "runs", "format", "fp32_adam", "seed0.other-machine")
  assert json.load(open(os.path.join(moved, "run.json")))["machine"]["cpu"] == "Other CPU 9000"
  assert not os.path.exists(os.path.join(out, "runs", "format", "fp32_adam", "seed0"))


def test_report_only_writes_the_finished_runs_and_trains_nothing(tmp_path, capsys):
  out = str(tmp_path)
  args = ["format", "--out", out, "--rows", "mxfp4_naive", "--seeds", "2"] + MICRO[2:]
  _fake_run(os.path.join(out, "runs", "format", "fp32_adam", "seed0"), loss=2.0)
  _fake_run(os.path.join(out, "runs", "format", "mxfp4_naive", "seed0"), loss=2.2)
  assert ablate.main(args + ["--report-only"]) == 0
  md = open(os.path.join(out, "format.md")).read()
  assert "| mxfp4_naive | `mxfp4_naive` | adam | 0.003 | 2.2000 |" in md and "| 1/2 |" in md
  assert "+10.00%" in md
  for label in ("fp32_adam", "mxfp4_naive"):  # seed 1 was not trained
    assert not os.path.exists(os.path.join(out, "runs", "format", label, "seed1"))


def test_fingerprint_keeps_the_cores_of_the_first_run(monkeypatch):
  """A worker pinned to fewer cores after its XLA client started still runs with its first
  thread count: the fingerprint keeps the first reading of the process."""
  if not hasattr(os, "sched_getaffinity"):
    pytest.skip("no CPU affinity on this platform")
  run_machine.usable_cores.cache_clear()
  try:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    first = run_machine.fingerprint()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert run_machine.fingerprint()["cores"] == first["cores"] == 4
  finally:
    run_machine.usable_cores.cache_clear()  # the other tests read this process's own cores
