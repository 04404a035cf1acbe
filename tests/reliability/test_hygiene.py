"""Security hygiene of the source tree: no unpickling, no implicit downloads, no network calls."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = sorted(p for d in ("lpjax", "benchmarks") for p in (ROOT / d).rglob("*.py")) + [ROOT / "train.py"]

FORBIDDEN = [
    (r"^\s*(import|from)\s+(pickle|cPickle|dill|cloudpickle|shelve)\b", "unpickling"),
    (r"allow_pickle\s*=\s*True", "np.load with allow_pickle=True"),
    (r"download\s*=\s*True", "an implicit dataset download"),
    (r"^\s*(import|from)\s+(urllib|requests|http\.client|socket)\b", "network access"),
    (r"\bpickle\.loads?\(", "unpickling"),
    (r"(?<![\w.])(eval|exec)\(", "eval/exec of data"),  # the builtins, not methods (nnx .eval())
]


@pytest.mark.parametrize("pattern,what", FORBIDDEN, ids=[w for _, w in FORBIDDEN])
def test_no_source_file_does(pattern, what):
  assert len(SOURCES) > 20  # the glob found the tree
  hits = [f"{p.relative_to(ROOT)}:{i + 1}" for p in SOURCES
          for i, line in enumerate(p.read_text().splitlines()) if re.search(pattern, line)]
  assert not hits, f"{what} in {hits}"


def test_tfds_sources_never_download():
  for name in ("lpjax/data/_tfds_text.py", "lpjax/data/_images.py"):
    text = (ROOT / name).read_text()
    assert "download=False" in text, name
