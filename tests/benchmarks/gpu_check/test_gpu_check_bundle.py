"""`make gpu-bundle` (scripts/gpu_bundle.py): the folder carried to a GPU machine with no package
index, and `make gpu-check BUNDLE=..` run from inside it."""

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _wheel_is_pure_and_consistent(path):
  with zipfile.ZipFile(path) as zf:
    names = zf.namelist()
    assert not [n for n in names if n.endswith((".so", ".pyd", ".pyc"))], path
    record = next(n for n in names if n.endswith(".dist-info/RECORD"))
    wheel = zf.read(record.replace("RECORD", "WHEEL")).decode()
    assert "Root-Is-Purelib: true" in wheel and "Tag: py3-none-any" in wheel
    for line in zf.read(record).decode().splitlines():
      name, digest, size = line.split(",")
      if name == record:
        continue
      data = zf.read(name)
      want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
      assert digest == f"sha256={want}" and int(size) == len(data), name
    assert set(names) == {line.split(",")[0] for line in zf.read(record).decode().splitlines()}


def test_the_bundle_holds_the_source_and_pure_wheels_and_runs_the_check(tmp_path):
  bundle = tmp_path / "bundle"
  out = subprocess.run(["make", "-s", "gpu-bundle", f"BUNDLE={bundle}",
                        f"GPU_PY={sys.executable}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stdout + out.stderr
  manifest = json.loads((bundle / "manifest.json").read_text())
  assert set(manifest["packages"]) == {"ml-collections", "absl-py"}
  assert manifest["total_bytes"] < 5e6  # the source and two small wheels
  src = bundle / "lpjax"
  for rel in ("lpjax/__init__.py", "lpjax/pallas/_rht.py", "benchmarks/gpu_check/__main__.py",
              "benchmarks/speed/gemm_overhead.py", "configs/llama_60m_mxfp4.py",
              "scripts/gpu_bundle.py", "Makefile"):
    assert (src / rel).is_file(), rel
  assert not (src / "tests").exists() and not (src / "docs").exists()
  for p in manifest["packages"].values():
    _wheel_is_pure_and_consistent(bundle / "wheels" / p["wheel"])

  # install --all: every wheel into the bundle's own site folder, offline, nothing else.
  inst = subprocess.run([sys.executable, "scripts/gpu_bundle.py", "install", str(bundle),
                         "--all"],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert inst.returncode == 0, inst.stdout + inst.stderr
  assert "pip install --no-index --no-deps --upgrade --target" in inst.stdout
  site = bundle / "site"
  assert sorted(p.name for p in site.iterdir() if not p.name.endswith(".dist-info")) == [
      "absl", "ml_collections"]  # never jax, flax or anything the machine has
  where = subprocess.run([sys.executable, "-c",
                          "import ml_collections; print(ml_collections.__file__)"],
                         env=dict(os.environ, PYTHONPATH=str(site)), capture_output=True, text=True)
  assert where.stdout.startswith(str(site)), where.stdout + where.stderr

  # From inside the bundle, as on the GPU machine: the bundle's lpjax and its site folder.
  check = subprocess.run(["make", "-s", "gpu-check", "BUNDLE=..", "DRY_RUN=1",
                          f"OUT={tmp_path / 'out'}", f"GPU_PY={sys.executable}",
                          "GPU_CHECK_ARGS=--stages a"],
                         cwd=src, capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
  assert check.returncode == 0, check.stdout + check.stderr
  env = json.loads((tmp_path / "out" / "dry-run-cpu.json").read_text())["env"]
  assert env["lpjax_from"] == str(src)
  assert env["ml_collections_from"] == str(site)  # PYTHONPATH puts the bundle's first
