"""Every benchmark command the docs name runs against this tree: `python benchmarks/<dir>/<x>.py`
and `python -m benchmarks.<pkg>` in README.md, docs/, the notebooks and benchmarks' own READMEs
name a file or module that exists (a moved benchmark must not leave a command pointing nowhere,
issue 61), and a few cheap ones answer `--help`.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# "python benchmarks/memory/llama_memory.py", ".venv/bin/python3 benchmarks/x.py", "python -m
# benchmarks.gpu_check"
SCRIPT = re.compile(r"\bpython3?\s+(benchmarks/[\w./-]+\.py)\b")
MODULE = re.compile(r"\bpython3?\s+-m\s+(benchmarks(?:\.\w+)+)")


def _documents():
  yield ROOT / "README.md"
  yield from sorted((ROOT / "docs").rglob("*.md"))
  yield from sorted((ROOT / "benchmarks").rglob("README.md"))
  for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
    yield nb


def _text(path: pathlib.Path) -> str:
  if path.suffix != ".ipynb":
    return path.read_text()
  cells = json.loads(path.read_text())["cells"]
  return "\n".join("".join(c.get("source", [])) for c in cells)


def commands(text: str) -> tuple[list[str], list[str]]:
  """The benchmark scripts and modules a text runs.

  >>> commands("run `.venv/bin/python benchmarks/speed/timing.py --x` or python -m benchmarks.gpu_check")
  (['benchmarks/speed/timing.py'], ['benchmarks.gpu_check'])
  """
  return SCRIPT.findall(text), MODULE.findall(text)


def _module_exists(module: str) -> bool:
  path = ROOT.joinpath(*module.split("."))
  return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


def _named():
  scripts, modules = {}, {}
  for doc in _documents():
    s, m = commands(_text(doc))
    for x in s:
      scripts.setdefault(x, doc.relative_to(ROOT))
    for x in m:
      modules.setdefault(x, doc.relative_to(ROOT))
  return scripts, modules


def test_the_docs_name_benchmark_commands():
  scripts, modules = _named()
  assert len(scripts) >= 10 and "benchmarks.gpu_check" in modules, (scripts, modules)


def test_every_benchmark_command_in_the_docs_names_a_file_of_the_tree():
  scripts, modules = _named()
  missing = [f"{doc}: python {s}" for s, doc in scripts.items() if not (ROOT / s).is_file()]
  missing += [f"{doc}: python -m {m}" for m, doc in modules.items() if not _module_exists(m)]
  assert not missing, "\n".join(missing)


def test_the_checker_sees_a_moved_script():
  s, m = commands("python benchmarks/no_such_benchmark.py --devices=8\npython -m benchmarks.nothing")
  assert not (ROOT / s[0]).is_file() and not _module_exists(m[0])


# Cheap to start: argparse answers before JAX loads.
HELP = [["benchmarks/common/hlo_fingerprint.py"], ["benchmarks/sweeps/ablate.py"],
        ["benchmarks/speed/speed_report.py"], ["benchmarks/speed/compile_profile.py"],
        ["benchmarks/memory/llama_memory.py"],
        ["-m", "benchmarks.gpu_check"]]


@pytest.mark.parametrize("command", HELP, ids=lambda c: c[-1])
def test_named_benchmarks_answer_help(command):
  assert any(" ".join(command).replace("-m ", "") in " ".join(v for v in _named()[i])
             for i in (0, 1)), f"{command} is no longer named in the docs"
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, *command, "--help"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0 and "usage:" in out.stdout, out.stderr[-2000:]
