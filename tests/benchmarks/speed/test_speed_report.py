"""benchmarks/speed/speed_report.py: the speed table's structure (`--quick`: sizes too small to mean
anything), its rows' figures positive and finite, and its helpers. No timing is asserted."""

import doctest
import json
import math
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path[:0] = [os.path.join(os.path.join(ROOT, "benchmarks"), d)
                for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/

import speed_report  # noqa: E402
import speed_rows  # noqa: E402

ROW = re.compile(r"^\| (\w+) \| ([^|]+) \| ([^|]+) \| ([^|]*) \| (pass|FAIL|) \|$")


def _run_quick(tmp_path, rows):
  out = tmp_path / "speed.json"
  env = dict(os.environ, PYTHONPATH=ROOT)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "speed", "speed_report.py"),
                         "--quick", f"--rows={rows}", f"--json={out}"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout, json.loads(out.read_text())


def _check_table(stdout, figures):
  lines = stdout.splitlines()
  start = lines.index("| row | figure | measured | goal | pass |")
  assert lines[start + 1] == "|---|---|---|---|---|"
  body = lines[start + 2:start + 2 + len(figures)]
  assert len(body) == len(figures)
  for line, f in zip(body, figures):
    m = ROW.match(line)
    assert m, line
    assert m.group(2).strip() == f["name"]
    # a figure with a goal carries a verdict, and the verdict is the goal's
    assert (m.group(5) != "") == (f["ok"] is not None)
    if f["ok"] is not None:
      assert m.group(5) == ("pass" if f["ok"] else "FAIL")
  assert "load average" in lines[0] and "load average at the end" in stdout


def test_quick_fake_quant_row_covers_every_fp4_format_with_finite_ratios(tmp_path):
  stdout, result = _run_quick(tmp_path, "fake_quant")
  figures = result["rows"]["fake_quant"]
  _check_table(stdout, figures)
  ratios = {f["name"]: f["value"] for f in figures if f["unit"] == "x"}
  formats = speed_rows.fp4_formats()
  assert {"mxfp4", "nvfp4"} <= set(formats)
  assert set(ratios) == {f"fake_quant {fmt} {tag} / copy" for fmt in formats
                         for tag in ("RTN", "SR")}
  for name, value in ratios.items():
    assert math.isfinite(value) and value > 0, (name, value)
  goals = {f["name"]: f["goal"] for f in figures if f["unit"] == "x"}
  assert all(g == (">= 0.6x" if n.endswith("RTN / copy") else ">= 0.5x")
             for n, g in goals.items())


@pytest.mark.benchmark  # two LLaMA-tiny compiles: minutes on a loaded 2-core machine
def test_quick_monitor_compile_row_is_a_positive_ratio(tmp_path):
  stdout, result = _run_quick(tmp_path, "monitor_compile")
  figures = result["rows"]["monitor_compile"]
  _check_table(stdout, figures)
  plain, ratio = (f["value"] for f in figures)
  assert plain > 0 and math.isfinite(ratio) and ratio > 0


def test_unknown_row_is_refused_with_the_choices(capsys):
  with pytest.raises(SystemExit):
    speed_report.parse(["--rows=fake_quant,steps"])
  err = capsys.readouterr().err
  assert "unknown rows ['steps']" in err and "monitor_compile" in err


def test_suite_flag_adds_the_suite_row_and_default_leaves_it_out():
  assert "suite" not in speed_report.parse([]).rows
  assert speed_report.parse(["--rows=advise", "--suite"]).rows == ["advise", "suite"]


def test_record_figure_names_are_valid_record_names():
  from records import _check_figures
  results = {"fake_quant": [speed_rows.figure("fake_quant mxfp4 RTN / copy", 0.5, "x", "", None)],
             "advise": [speed_rows.figure("advise XLA compiles (all)", 7, "", "", None)]}
  figures = speed_report.record_figures(results)
  assert figures == {"fake_quant_fake_quant_mxfp4_rtn_copy": 0.5,
                     "advise_advise_xla_compiles_all": 7}
  assert _check_figures(figures) == figures


def test_docstring_examples():
  for module in (speed_report, speed_rows):
    assert doctest.testmod(module).failed == 0


def test_conftest_cache_dir_follows_lpjax_test_cache_dir(tmp_path):
  """The suite row's cold run: tests/conftest.py puts the compile cache where the env var says."""
  code = ("import sys; sys.path.insert(0, 'tests'); import conftest, jax; "
          "print(conftest._CACHE_DIR, jax.config.jax_compilation_cache_dir)")
  env = dict(os.environ, LPJAX_TEST_CACHE_DIR=str(tmp_path / "cold"))
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.split() == [str(tmp_path / "cold")] * 2
