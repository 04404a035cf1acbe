"""Every repository file path that lpjax's source quotes (in an error message, a docstring or a
comment) exists: a message that sends the user to a file must not send them nowhere after a
module moves (issue 40: errors cited `lpjax/quant/recipe_spec.py`, gone since it became
`recipes/variants.py`)."""

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUFFIXES = r"(?:py|md|ipynb|json|toml|txt|cfg)"
# A path from the repository root ("lpjax/train/schema/_validate.py", "docs/numerics.md") ...
ROOTED = re.compile(r"(?<![\w/.-])((?:lpjax|docs|configs|tests|benchmarks|notebooks)/[\w./-]*?\w\."
                    + SUFFIXES + r")(?![\w/])")
# ... or from inside the package ("train/step/_sharding.py", as a comment in lpjax/train/ may say).
IN_PACKAGE = re.compile(r"(?<![\w/.-])((?:quant|train|data|optim|nn|models|pallas|eval)/"
                        r"[\w./-]*?\w\.py)(?![\w/])")


def _sources():
  for top in ("lpjax", "benchmarks", "configs"):
    for folder, _, files in os.walk(os.path.join(ROOT, top)):
      yield from (os.path.join(folder, f) for f in files if f.endswith(".py"))
  yield os.path.join(ROOT, "train.py")


def _quoted_paths(text):
  for m in ROOTED.finditer(text):
    yield m.group(1), m.group(1)
  for m in IN_PACKAGE.finditer(text):
    yield m.group(1), os.path.join("lpjax", m.group(1))


def test_the_scanner_finds_paths_in_messages_and_docstrings():
  text = ('raise ValueError("see lpjax/quant/recipes/variants.py and docs/numerics.md §5")\n'
          '"""Rules: train/step/_sharding.py; not a path: a/b.py or lpjax.quant."""')
  assert [p for _, p in _quoted_paths(text)] == [
      "lpjax/quant/recipes/variants.py", "docs/numerics.md", "lpjax/train/step/_sharding.py"]


def test_every_quoted_repository_path_exists():
  missing = []
  for path in _sources():
    with open(path, encoding="utf-8") as f:
      text = f.read()
    ast.parse(text)  # a source file, read whole: messages, docstrings and comments
    for quoted, target in _quoted_paths(text):
      if not os.path.exists(os.path.join(ROOT, target)):
        missing.append(f"{os.path.relpath(path, ROOT)} quotes {quoted}")
  assert not missing, "\n".join(missing)
