"""The dependency directions of lpjax's packages, and a repository that stands on its own.

- quant imports no Flax and nothing of lpjax but itself (pallas is loaded only by module name,
  through the implementation registry of `lpjax.quant.quantize(..., impl=...)`);
- optim imports nothing of lpjax; nn only quant; models only nn, quant and models;
- data imports no model, layer or training code; pallas only quant; eval nothing of train;
- no file of the repository points at a path outside it (the numerics contract cited everywhere
  is docs/numerics.md).
"""

import ast
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("quant", "pallas", "optim", "nn", "models", "data", "eval", "train")
# package -> the lpjax packages it may import (itself always allowed)
ALLOWED = {
    "quant": set(),
    "pallas": {"quant"},
    "optim": set(),
    "nn": {"quant"},
    "models": {"nn", "quant"},
    "data": set(),
    "eval": set(),
    "train": set(PACKAGES),
}
NO_FLAX = ("quant", "optim", "pallas")


def _imports(path: pathlib.Path) -> set[str]:
  """Every module a file imports, at any depth (lazy imports inside functions count too)."""
  tree = ast.parse(path.read_text(), str(path))
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names.add(node.module)
      names.update(f"{node.module}.{a.name}" for a in node.names)
  return names


def _package_files(package: str):
  return sorted((ROOT / "lpjax" / package).rglob("*.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_only_what_it_may(package):
  bad = []
  for path in _package_files(package):
    for name in _imports(path):
      parts = name.split(".")
      if parts[0] == "lpjax" and len(parts) > 1 and parts[1] in PACKAGES:
        if parts[1] != package and parts[1] not in ALLOWED[package]:
          bad.append(f"{path.relative_to(ROOT)} imports {name}")
      if package in NO_FLAX and parts[0] == "flax":
        bad.append(f"{path.relative_to(ROOT)} imports {name} (no Flax in {package})")
  assert not bad, "\n".join(bad)


def test_the_checker_sees_lazy_imports(tmp_path):
  f = tmp_path / "m.py"
  f.write_text("def g():\n  from lpjax.train import config\n  import flax.nnx\n")
  assert {"lpjax.train", "lpjax.train.config", "flax.nnx"} <= _imports(f)


def test_quant_loads_pallas_only_by_name_through_its_registry():
  text = (ROOT / "lpjax" / "quant" / "_quantize.py").read_text()
  assert re.search(r"import_module\(\s*[\"']lpjax\.pallas[\"']", text)
  for path in _package_files("quant"):
    assert not any(n.startswith("lpjax.pallas") for n in _imports(path)), path


def _tracked_text_files():
  out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                       capture_output=True, text=True, check=True).stdout.split()
  for name in out:
    path = ROOT / name
    if path.suffix in (".py", ".md", ".ipynb", ".txt", ".toml", ".cfg") or name in (
        "Makefile", ".ci/run"):
      if path.is_file():
        yield path


# A path that climbs out of a folder, an absolute path of a machine, or the team's private
# numerics reference (lpjax's own is docs/numerics.md).
_OUTSIDE = re.compile(r"(\.\./[\w.-]|(?<![\w.])/(work|home|Users|root|tmp/lpjax)/|\bNUMERICS\.md\b"
                      r"|\bshared/(DESIGN|STYLE|NUMERICS)\b)")
_MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_no_file_points_outside_the_repository():
  bad = []
  for path in _tracked_text_files():
    if path == pathlib.Path(__file__):
      continue
    for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
      if _OUTSIDE.search(line):
        bad.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
  assert not bad, "\n".join(bad)


def test_markdown_links_resolve_inside_the_repository():
  bad = []
  for path in _tracked_text_files():
    if path.suffix != ".md":
      continue
    for target in _MD_LINK.findall(path.read_text()):
      if re.match(r"[a-z]+:", target):  # http(s):, mailto:
        continue
      resolved = (path.parent / target).resolve()
      if ROOT not in resolved.parents and resolved != ROOT or not resolved.exists():
        bad.append(f"{path.relative_to(ROOT)}: {target}")
  assert not bad, "\n".join(bad)


@pytest.mark.parametrize("package", PACKAGES)
def test_public_api_is_declared_and_modules_are_private(package):
  init = ROOT / "lpjax" / package / "__init__.py"
  tree = ast.parse(init.read_text())
  exported = [n for n in ast.walk(tree) if isinstance(n, ast.Assign)
              and any(getattr(t, "id", None) == "__all__" for t in n.targets)]
  if package == "models":  # one public module per model (lpjax.models.llama, ...)
    return
  assert exported, f"lpjax/{package}/__init__.py declares no __all__"
  public_modules = {"quant": {"recipes"}, "train": {"config"}}.get(package, set())
  for path in (ROOT / "lpjax" / package).glob("*.py"):
    if path.name != "__init__.py" and not path.name.startswith("_"):
      assert path.stem in public_modules, f"{path.relative_to(ROOT)} should be private (_{path.name})"
