"""The notebooks in notebooks/: their layout, and an end-to-end run of each with nbclient.

Each notebook runs in a fresh kernel of this interpreter ("python3" kernelspec, checked below),
on the CPU with one device (the 8 virtual devices of conftest.py would only slow it down), with
its working directory, TMPDIR and token cache under pytest's tmp_path: nothing is written into
the repository and nothing is downloaded.
"""

import ast
import os
import sys
import tempfile
import time
from pathlib import Path

import jax
import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
NAMES = ("quickstart", "train_llama_fp4", "stable_spam", "your_own_model", "where_fp4_hurts")
# Saved with the outputs of a full run, so that a code host shows their plots and tables without
# running them (CI still runs each one below).
SAVED_WITH_OUTPUTS = NAMES
REPO_URL = "https://github.com/lpjax/lpjax"
CELL_TIMEOUT_S = 300  # a whole notebook takes < 3 minutes on a 2-core CPU


def _load(name: str) -> nbformat.NotebookNode:
  return nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)


def _code_cells(nb):
  return [c for c in nb.cells if c.cell_type == "code"]


def test_every_notebook_is_tested():
  assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_first_markdown_cell_has_the_colab_badge(name):
  nb = _load(name)
  nbformat.validate(nb)
  first = nb.cells[0]
  assert first.cell_type == "markdown"
  assert first.source.startswith("# "), "the first cell starts with the notebook's title"
  link = f"https://colab.research.google.com/github/lpjax/lpjax/blob/main/notebooks/{name}.ipynb"
  assert f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({link})" \
      in first.source


@pytest.mark.parametrize("name", NAMES)
def test_first_code_cell_installs_lpjax_only_when_missing(name):
  source = _code_cells(_load(name))[0].source
  tree = ast.parse(source)  # plain Python (no %pip line), so it runs in any kernel
  assert len(tree.body) == 1 and isinstance(tree.body[0], ast.Try)
  guard = tree.body[0]
  assert [ast.unparse(s) for s in guard.body] == ["import lpjax"]
  (handler,) = guard.handlers
  assert ast.unparse(handler.type) == "ImportError"
  install = ast.unparse(handler)
  assert "pip" in install and f"lpjax @ git+{REPO_URL}" in install
  assert "pip" not in "".join(ast.unparse(s) for s in guard.body + guard.orelse + guard.finalbody)


@pytest.mark.parametrize("name", SAVED_WITH_OUTPUTS)
def test_saved_with_the_outputs_of_one_full_run(name):
  nb = _load(name)
  assert nb.metadata.kernelspec.name == "python3"
  cells = _code_cells(nb)
  assert [c.execution_count for c in cells] == list(range(1, len(cells) + 1)), (
      f"{name}.ipynb is saved with outputs: save it after one Run All in a fresh kernel")
  outputs = [o for c in cells for o in c.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  assert any("image/png" in o.get("data", {}) for o in outputs), "saved without its figure"


def _kernel_env(tmp_path: Path) -> dict:
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device
  env["JAX_PLATFORMS"] = "cpu"
  env["LPJAX_CACHE_DIR"] = str(tmp_path / "token_cache")
  (tmp_path / "tmp").mkdir()
  env["TMPDIR"] = str(tmp_path / "tmp")  # the notebooks' tempfile workdirs go with tmp_path
  # the suite's compile cache (tests/conftest.py; LPJAX_TEST_CACHE_DIR makes a cold run cold)
  env["JAX_COMPILATION_CACHE_DIR"] = (jax.config.jax_compilation_cache_dir
                                      or os.path.join(tempfile.gettempdir(), "lpjax_jax_cache"))
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
  env.pop("MPLBACKEND", None)  # the kernel's inline backend renders the figures
  return env


# Shorter runs for CI: {notebook: [(its line, the replacement), ...]}. The test fails if a line is
# gone. The fewest steps the notebooks' cells take: a metrics line every 5 steps (train_llama_fp4),
# a 10-step moving average and a mean of the last 20 steps (your_own_model, where_fp4_hurts).
# your_own_model trains its TinyLM in two of its four recipes (bf16, the baseline the plots
# subtract, and mxfp4): each recipe compiles its own train and eval steps from the same cells, and
# nvfp4 and quartet through quantize_model are checked bit for bit in tests/quant/test_intercept.py.
SHORTER = {"train_llama_fp4": [("STEPS = 80\n", "STEPS = 10\n")],
           "your_own_model": [("STEPS = 200\n", "STEPS = 20\n"),
                              ('RECIPES = ["bf16", "mxfp4", "nvfp4", "quartet"]\n',
                               'RECIPES = ["bf16", "mxfp4"]\n')],
           "where_fp4_hurts": [("STEPS = 200\n", "STEPS = 20\n")]}


def _shortened(nb, name):
  for line, replacement in SHORTER.get(name, ()):
    cells = [c for c in _code_cells(nb) if line in c.source]
    assert len(cells) == 1, f"{name}.ipynb has no line {line!r} to shorten; update SHORTER"
    cells[0].source = cells[0].source.replace(line, replacement)
  return nb


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_end_to_end(name, tmp_path):
  nb = _shortened(_load(name), name)
  n_cells = len(nb.cells)
  # A last cell that reports which interpreter and devices the kernel had.
  nb.cells.append(nbformat.v4.new_code_cell(
      "import sys, jax\nprint(sys.prefix)\nprint(jax.default_backend(), jax.device_count())"))
  workdir = tmp_path / "cwd"
  workdir.mkdir()
  before = sorted(p.name for p in NOTEBOOKS.iterdir())
  client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                          resources={"metadata": {"path": str(workdir)}})
  start = time.perf_counter()
  client.execute(env=_kernel_env(tmp_path))  # raises on a failing cell
  print(f"{name}.ipynb ran in {time.perf_counter() - start:.0f} s")

  prefix, devices = nb.cells[-1].outputs[0].text.split("\n")[:2]
  assert prefix == sys.prefix, (
      f"the python3 kernel runs {prefix}, not this environment ({sys.prefix}); register it with "
      f"`{sys.executable} -m ipykernel install --sys-prefix`")
  assert devices == "cpu 1"
  outputs = [o for c in nb.cells[:n_cells] if c.cell_type == "code" for o in c.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  assert any("image/png" in o.get("data", {}) for o in outputs), "no figure was rendered"
  assert sorted(p.name for p in NOTEBOOKS.iterdir()) == before, "the notebook wrote into the repo"
