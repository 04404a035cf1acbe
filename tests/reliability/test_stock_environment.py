"""lpjax in a stock CUDA JAX environment: installed with `pip install --no-deps -e .`, without
TFDS, grain, array_record, TensorFlow or tensorboardX (README, "On a GPU machine that already has
JAX"; issue 38).

Every subprocess here starts with a `sitecustomize` that hides those packages from the import
system (a meta-path wrapper: `import grain` fails and `importlib.util.find_spec("grain")` is None,
as when it is not installed), and so does every process they start (PYTHONPATH is inherited). In
that environment: lpjax imports, `data.source='tfds'` says what to install, `train.py` trains a
few steps on the embedded corpus, and the GPU check's whole dry run (`make gpu-check DRY_RUN=1`,
every stage on the CPU) passes; that last run is also what keeps the GPU check from rotting in CI.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from train_subprocess import suite_cache_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCKED = ("tensorflow_datasets", "grain", "array_record", "tensorflow", "tensorboardX")
SITECUSTOMIZE = f"""
import importlib.abc
import sys

BLOCKED = {BLOCKED!r}
BLOCKED_DISTRIBUTIONS = ("tensorflow_datasets", "grain", "array_record", "tensorflow",
                         "tensorboardX")


class _Hidden(importlib.abc.MetaPathFinder):
  # Wraps each finder: the blocked packages are simply not found, as if never installed.
  def __init__(self, inner):
    self.inner = inner

  def find_spec(self, name, path=None, target=None):
    if name.partition(".")[0] in BLOCKED:
      return None
    find = getattr(self.inner, "find_spec", None)
    return find(name, path, target) if find else None

  def find_distributions(self, *args, **kwargs):  # importlib.metadata asks here
    find = getattr(self.inner, "find_distributions", None)
    return [d for d in find(*args, **kwargs) if (d.metadata["Name"] or "").replace("-", "_")
            not in BLOCKED_DISTRIBUTIONS] if find else []

  def invalidate_caches(self):
    getattr(self.inner, "invalidate_caches", lambda: None)()


sys.meta_path[:] = [_Hidden(f) for f in sys.meta_path]
"""


@pytest.fixture(scope="module")
def stock_env(tmp_path_factory):
  site = tmp_path_factory.mktemp("stock_site")
  (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTHONPATH")}
  env.update(PYTHONPATH=f"{site}{os.pathsep}{ROOT}", JAX_PLATFORMS="cpu",
             # the suite's compile cache (tests/conftest.py): a re-run loads the dry run's programs
             JAX_COMPILATION_CACHE_DIR=suite_cache_dir())
  return env


def _python(env, *args, timeout=600):
  return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=timeout)


def test_lpjax_imports_and_tfds_says_what_to_install(stock_env):
  code = textwrap.dedent(f"""
      import importlib.util, sys
      assert all(importlib.util.find_spec(m) is None for m in {BLOCKED!r})
      import lpjax, lpjax.data, lpjax.pallas, lpjax.quant, lpjax.train, lpjax.models
      assert not [m for m in sys.modules if m.partition(".")[0] in {BLOCKED!r}]
      try:
        lpjax.data.make_dataset("tfds", tfds_name="c4/en")
      except ModuleNotFoundError as e:
        print("ERROR:", e)
      """)
  out = _python(stock_env, "-c", code, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "tensorflow_datasets" in out.stdout
  assert "pip install tensorflow-datasets array-record" in out.stdout


@pytest.mark.slow
def test_train_py_runs_a_few_steps_on_embedded_data(stock_env, tmp_path):
  workdir = tmp_path / "run"
  out = _python(stock_env, "train.py", "--config=configs/llama_tiny_mxfp4.py",
                f"--workdir={workdir}", "--config.steps=3", "--config.batch_size=4",
                "--config.seq_len=32", "--config.eval_every=3", "--config.eval_steps=1",
                "--config.checkpoint_every=3",
                f"--compilation_cache={stock_env['JAX_COMPILATION_CACHE_DIR']}")
  assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
  results = json.loads((workdir / "results.json").read_text())
  assert results["steps"] == 3 and results["final_train_loss"] > 0
  assert (workdir / "metrics.jsonl").read_text().count("\n") >= 1
  assert "pip install tensorboardX" in out.stderr  # metrics went to metrics.jsonl only


@pytest.mark.slow
def test_the_gpu_check_dry_run_passes(stock_env, tmp_path):
  out = _python(stock_env, "-m", "benchmarks.gpu_check", "--dry-run", "--out", str(tmp_path))
  assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
  check = json.loads((tmp_path / "dry-run-cpu.json").read_text())
  assert check["passed"] and check["dry_run"]
  assert [s["letter"] for s in check["stages"]] == list("abcdefg")
  assert all(s["status"] == "pass" for s in check["stages"]), [
      (s["letter"], s["status"], s.get("error")) for s in check["stages"]]
  # The blocker reached the stage processes: they saw none of the optional packages.
  assert set(BLOCKED) <= set(check["env"]["optional_packages_missing"])
  stages = {s["stage"]: s for s in check["stages"]}
  assert stages["exactness"]["checks"]["passed"] >= 50
  assert stages["kernels"]["checks"]["failed"] == 0 and stages["kernels"]["checks"]["passed"] >= 10
  assert {r["recipe"] for r in stages["steps"]["tables"]["steps"]} == {"bf16", "mxfp4"}
  lines = out.stdout.strip().splitlines()
  assert lines[-1].startswith("| g block-scaled GEMMs")  # the summary table comes last
  assert any(line.startswith("| f LLaMA train steps | pass |") for line in lines[-9:])
  print(out.stdout[out.stdout.index("lpjax GPU check"):])  # the report (pytest -s shows it)
