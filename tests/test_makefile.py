"""The Makefile's set-up: the Python version is checked first, `make train` installs only the
runtime requirements and `make test` adds the test extras, and the stamp files reinstall when a
requirements file changes. Runs `make` itself (a fake interpreter, or `make -n` on a stand-in venv),
so nothing is installed."""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def _make(*args, **env):
  """`make ARGS` as a user types it: a top-level make, also when the suite itself runs under
  `make test` (whose MAKELEVEL / MAKEFLAGS would make it a sub-make, "make[1]: ...")."""
  base = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
  return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), *args],
                        capture_output=True, text=True, timeout=60, env={**base, **env})


def _fake_python(tmp_path, version):
  """An interpreter that reports `version` to any question, as a 3.10 python3 would."""
  path = tmp_path / f"python{version}"
  path.write_text(f"#!/bin/sh\necho {version}\n")
  path.chmod(0o755)
  return path


@pytest.mark.parametrize("goal", ["train", "test", ""])
def test_an_old_python_stops_with_one_line_before_anything_is_made(tmp_path, goal):
  venv = tmp_path / "venv"
  r = _make(*([goal] if goal else []), f"PY={_fake_python(tmp_path, '3.10')}", f"VENV={venv}")
  assert r.returncode != 0
  ours = [line for line in r.stderr.splitlines() if not line.startswith("make: ***")]
  assert len(ours) == 1, r.stderr
  assert "needs Python 3.11+" in ours[0] and "is Python 3.10" in ours[0]
  assert f"make PY=python3.11{' ' + goal if goal else ''}" in ours[0]  # the fix, with the goal
  assert not venv.exists() and "pip" not in r.stdout  # nothing made, nothing installed


def test_a_missing_python_is_named(tmp_path):
  r = _make("train", f"PY={tmp_path / 'no-such-python'}", f"VENV={tmp_path / 'venv'}")
  assert r.returncode != 0
  assert "no Python at PY=" in r.stderr and "3.11+" in r.stderr
  assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize("version", ["3.11", "3.12", "3.13"])
def test_a_new_enough_python_passes(tmp_path, version):
  r = _make("check-python", f"PY={_fake_python(tmp_path, version)}")
  assert r.returncode == 0 and r.stderr == "", r.stderr


def test_this_python_passes_the_check():
  assert sys.version_info >= (3, 11)  # the suite's own interpreter meets requires-python
  assert _make("check-python", f"PY={sys.executable}").returncode == 0


def _installs(goal, venv, version="3.11", *args):
  """The requirements files `make -n goal` would install, in order, for a Python `version`."""
  r = _make("-n", goal, f"VENV={venv}", f"PY={_fake_python(venv.parent, version)}", *args)
  assert r.returncode == 0, r.stderr
  return [line.split(" -r ")[1].split()[0] for line in r.stdout.splitlines()
          if "pip install" in line and " -r " in line]


def _variables(version, tmp_path, *args):
  """The Makefile's stack variables for a Python `version` (make's database, nothing run)."""
  r = _make("-p", "-n", "check-python", f"PY={_fake_python(tmp_path, version)}", *args)
  assert r.returncode == 0, r.stderr
  found = {}
  for line in r.stdout.splitlines():
    name, sep, value = line.partition(" = ")
    if not sep:
      name, sep, value = line.partition(" := ")
    if sep and name in ("STACK", "VENV", "REQUIREMENTS", "REQUIREMENTS_DEV"):
      found[name] = value
  return found


@pytest.mark.parametrize("version,stack,venv,requirements", [
    ("3.11", "pinned", ".venv", "requirements.txt"),
    ("3.12", "current", ".venv-py312", "requirements-py312.txt"),
    ("3.13", "current", ".venv-py312", "requirements-py312.txt")])
def test_the_stack_follows_the_python(tmp_path, version, stack, venv, requirements):
  got = _variables(version, tmp_path)
  dev = requirements.replace(".txt", "-dev.txt")
  assert got == {"STACK": stack, "VENV": venv, "REQUIREMENTS": requirements,
                 "REQUIREMENTS_DEV": dev}
  stand_in = _venv(tmp_path / "v")
  interop = ["requirements-interop.txt"] if stack == "pinned" else []  # CPU torch: Python 3.11
  assert _installs("test", stand_in, version) == [requirements, "requirements-plot.txt", dev,
                                                  *interop]
  assert f"-r {requirements}" in (ROOT / dev).read_text()


def test_the_two_stacks_pin_jax_apart():
  def pins(name):
    return dict(l.split("==") for l in (ROOT / name).read_text().splitlines() if "==" in l)
  pinned, current = pins("requirements.txt"), pins("requirements-py312.txt")
  assert pinned["jax"] == pinned["jaxlib"] == "0.10.2"
  assert current["jax"] == current["jaxlib"] and current["jax"] >= "0.12"
  assert set(pinned) == set(current)  # the same packages, each stack's releases


def test_a_venv_of_another_python_is_refused_before_anything_is_installed(tmp_path):
  venv = tmp_path / "venv"
  (venv / "bin").mkdir(parents=True)
  (tmp_path / "v").mkdir()
  (venv / "bin" / "python").symlink_to(_fake_python(tmp_path / "v", "3.11"))  # the pinned stack's
  for goal in ("venv", "test"):
    r = _make(goal, f"VENV={venv}", f"PY={_fake_python(tmp_path, '3.12')}")
    assert r.returncode != 0
    assert f"VENV={venv} holds Python 3.11, but PY=" in r.stderr and "current stack" in r.stderr
    assert "pip" not in r.stdout and not (venv / ".installed").exists()


def test_make_test_current_runs_the_fast_part_on_the_current_python(tmp_path):
  venv = _venv(tmp_path, stamps=(".installed", ".installed-plot", ".installed-dev"), age=10)
  py = _fake_python(tmp_path, "3.12")
  r = _make("-n", "test-current", f"CURRENT_PY={py}", f"VENV={venv}")
  assert r.returncode == 0, r.stderr
  run = r.stdout.strip().splitlines()[-1]
  assert run.startswith(f"{venv}/bin/python -m pytest -n 2 ")
  for path in ("tests/quant/test_jax_compat.py", "tests/quant/test_intercept.py",
               "tests/pallas/test_pallas_lowering.py", "tests/benchmarks/gpu_check/test_gpu_check.py"):
    assert f" {path} " in f"{run} "
  for path in [w for w in run.split() if w.startswith("tests/")]:
    assert (ROOT / path.split("::")[0]).exists(), path


def test_the_tensorflow_extra_is_refused_on_the_current_stack(tmp_path):
  r = _make("venv-tf", f"PY={_fake_python(tmp_path, '3.12')}", f"TF_VENV={tmp_path / 'tf'}")
  assert r.returncode != 0 and "pinned stack only" in r.stderr
  assert not (tmp_path / "tf").exists()


def _venv(tmp_path, stamps=(), age=0.0):
  """A stand-in venv: bin/python and the given stamp files, `age` seconds newer than every
  requirements file (negative: older than every one)."""
  venv = tmp_path / "venv"
  (venv / "bin").mkdir(parents=True)
  times = [os.path.getmtime(ROOT / f) for f in
           ("requirements.txt", "requirements-dev.txt", "requirements-plot.txt",
            "requirements-interop.txt", "pyproject.toml")]
  # newer than the newest file, or older than the oldest (a checkout that edited one file later)
  ref = max(times) if age >= 0 else min(times)
  for i, name in enumerate(("bin/python",) + tuple(stamps)):
    (venv / name).touch()
    os.utime(venv / name, (ref + age + i, ref + age + i))
  return venv


def test_train_installs_only_the_runtime_requirements(tmp_path):
  venv = _venv(tmp_path)
  assert _installs("train", venv) == ["requirements.txt"]


def test_test_adds_the_test_extras_after_train(tmp_path):
  venv = _venv(tmp_path, stamps=(".installed",), age=10)
  assert _installs("train", venv) == []  # up to date for training
  assert _installs("test", venv) == ["requirements-plot.txt", "requirements-dev.txt",
                                     "requirements-interop.txt"]


def test_a_changed_requirements_file_reinstalls_every_stamp_above_it(tmp_path):
  stamps = (".installed", ".installed-plot", ".installed-dev", ".installed-interop")
  fresh = _venv(tmp_path / "a", stamps=stamps, age=10)
  assert _installs("test", fresh) == []
  stale = _venv(tmp_path / "b", stamps=stamps, age=-100)
  assert _installs("test", stale) == ["requirements.txt", "requirements-plot.txt",
                                      "requirements-dev.txt", "requirements-interop.txt"]


def test_the_interop_extra_goes_into_the_test_venv_beside_the_pinned_stack(tmp_path):
  """`make test` installs the interop extra into the same venv (no second jax): each package it
  shares with requirements.txt is pinned alike, it pins no jax, and `make test-interop` runs the
  client tests (files that exist)."""
  def pins(name):
    return dict(l.split("==") for l in (ROOT / name).read_text().splitlines()
                if "==" in l and not l.startswith("#"))
  interop, runtime = pins("requirements-interop.txt"), pins("requirements.txt")
  assert {k: runtime[k] for k in interop.keys() & runtime.keys()} == {
      k: interop[k] for k in interop.keys() & runtime.keys()}
  assert not {"jax", "jaxlib", "numpy"} & interop.keys()
  assert {"torch", "transformers", "compressed-tensors", "gguf"} <= interop.keys()
  venv = _venv(tmp_path, stamps=(".installed", ".installed-plot", ".installed-dev"), age=10)
  r = _make("-n", "test-interop", f"VENV={venv}", f"PY={_fake_python(tmp_path, '3.11')}")
  assert r.returncode == 0, r.stderr
  run = r.stdout.strip().splitlines()[-1]
  assert run.startswith(f"{venv}/bin/python -m pytest tests/models/test_hf_clients.py")
  for path in [w for w in run.split() if w.startswith("tests/")]:
    assert (ROOT / path).exists(), path


def test_the_runtime_requirements_hold_no_test_or_notebook_package():
  runtime = (ROOT / "requirements.txt").read_text().lower()
  for name in ("pytest", "nbclient", "nbformat", "ipykernel", "matplotlib"):
    assert name not in runtime
  dev = (ROOT / "requirements-dev.txt").read_text()
  assert "-r requirements.txt" in dev and "pytest==" in dev


def test_the_editable_install_filters_setuptools_notice_only():
  line = next(l for l in (ROOT / "Makefile").read_text().splitlines() if "-e ." in l
              and "$(BIN)/pip" in l)
  assert line.strip().startswith('PYTHONWARNINGS="ignore:Editable installation"')


def _ci(tmp_path, fail=""):
  """.ci/run with a stand-in `make` that logs its arguments (and fails for goal `fail`)."""
  log = tmp_path / "make.log"
  fake = tmp_path / "bin" / "make"
  fake.parent.mkdir()
  fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n[ "$1" = "{fail}" ] && exit 3\nexit 0\n')
  fake.chmod(0o755)
  env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
  env["PATH"] = f"{fake.parent}:{env['PATH']}"
  r = subprocess.run([str(ROOT / ".ci" / "run")], capture_output=True, text=True, timeout=60,
                     env=env)
  return r, log.read_text().splitlines()


@pytest.mark.parametrize("fail", ["", "test", "test-current"])
def test_ci_runs_make_test_then_the_current_stack_and_fails_if_either_fails(tmp_path, fail):
  r, calls = _ci(tmp_path, fail)
  assert calls == ["test", "test-current"]  # the README's command first; both always run
  assert (r.returncode != 0) == bool(fail), r.stdout
  for part in ("pinned", "current"):
    assert re.search(rf"=== ci: {part}: exit \d+, wall \d+ s", r.stdout), r.stdout


def test_python_requirement_is_311_everywhere():
  assert 'requires-python = ">=3.11"' in (ROOT / "pyproject.toml").read_text()
  readme = (ROOT / "README.md").read_text()
  assert "3.10" not in readme and "Python 3.11" in readme


def test_make_plot_runs_lpjax_plot_on_the_given_runs(tmp_path):
  venv = _venv(tmp_path, stamps=(".installed", ".installed-plot"), age=10)
  r = _make("-n", "plot", f"VENV={venv}", "RUNS=runs/a runs/b", "OUT=x.png")
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip().splitlines()[-1] == f"{venv}/bin/python -m lpjax.plot runs/a runs/b --out=x.png"
  assert _installs("plot", _venv(tmp_path / "fresh", stamps=(".installed",), age=10)) == [
      "requirements-plot.txt"]  # plotting adds matplotlib only, no test packages
