"""The layers of lpjax, every import pointing down, no import circles, and a repository that stands
on its own.

The layer order is written once, in `LAYERS` (packages, lowest first), `QUANT_LAYERS` (the
sub-packages of lpjax.quant, lowest first) and `TRAIN_LAYERS` (the sub-packages of lpjax.train,
lowest first). A module may import:
- modules of its own package (lpjax.quant and lpjax.train: of its own layer or a lower one);
- packages of a lower layer (never one of the same layer: data, optim, quant and eval stand apart).
Loads by name count as imports: `importlib.import_module("...")`, `__import__("...")`, and a
dotted lpjax module path given to a registry's `provide`, `find_spec` or `patch`.
The registries of lpjax.quant (lpjax/quant/backends.py) are filled from the top, lpjax/__init__.py.
No file of the repository points at a path outside it (the numerics contract cited everywhere
is docs/numerics.md).
"""

from __future__ import annotations

import ast
import collections
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LPJAX = ROOT / "lpjax"
# lpjax's packages, lowest layer first; "lpjax" itself (lpjax/__init__.py) is the top.
LAYERS = (("data", "eval", "optim", "quant"), ("nn", "pallas"), ("models",), ("train",))
PACKAGES = tuple(p for layer in LAYERS for p in layer)
# Inside lpjax.quant, lowest first; "__init__" (the public API) is the top of quant.
QUANT_LAYERS = ("backends", "numerics", "formats", "codec", "schemes", "recipes", "policy", "gemm",
                "intercept", "monitor", "export")
# Inside lpjax.train, lowest first; "__init__" (the public API) is the top of train. `config` is
# the public config module (lpjax/train/config.py), the others are sub-packages.
TRAIN_LAYERS = ("schema", "config", "outputs", "state", "step", "model", "tasks", "monitor", "loop",
                "cli")
# A package whose inside is layered: its layer order.
INNER_LAYERS = {"quant": QUANT_LAYERS, "train": TRAIN_LAYERS}
NO_FLAX = ("quant", "optim", "pallas")


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts.pop()
  return ".".join(parts)


def _all_modules() -> dict[str, pathlib.Path]:
  return {_module_name(p): p for p in sorted(LPJAX.rglob("*.py"))}


MODULES = _all_modules()
_DOTTED = re.compile(r"lpjax(\.\w+)+")


# Calls whose string arguments name a module to load: a registry's provider, a module spec, a
# mock target (a logger's name, "lpjax.train", is no import).
_NAMING_CALLS = ("provide", "find_spec", "patch")


def _call_name(call: ast.Call) -> str | None:
  return getattr(call.func, "attr", None) or getattr(call.func, "id", None)


def _load_target(call: ast.Call) -> str | None:
  """The module a `import_module(...)` / `__import__(...)` call loads (an f-string: its constant
  start, e.g. "lpjax." for f"lpjax.{name}")."""
  if _call_name(call) not in ("import_module", "__import__") or not call.args:
    return None
  arg = call.args[0]
  if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
    return arg.value
  if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
    return str(arg.values[0].value).rstrip(".")
  return None


def _imports(path: pathlib.Path) -> set[str]:
  """Every module a file imports or loads by name, at any depth (lazy imports inside functions
  count too); `from a import b` gives a.b (module b of a, or name b of module a)."""
  tree = ast.parse(path.read_text(), str(path))
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names.update(f"{node.module}.{a.name}" for a in node.names)  # a module, or a name of one
    elif isinstance(node, ast.Call) and (target := _load_target(node)):
      names.add(target)
    elif isinstance(node, ast.Call) and _call_name(node) in _NAMING_CALLS:
      names.update(a.value for a in node.args
                   if isinstance(a, ast.Constant) and isinstance(a.value, str)
                   and _DOTTED.fullmatch(a.value))
  return names


def _lpjax_edges(path: pathlib.Path) -> set[str]:
  """The lpjax modules a file depends on: each imported name resolved to the longest module path
  that exists (`from lpjax.quant import recipes` -> lpjax.quant.recipes; `... import QuantPolicy`
  -> lpjax.quant)."""
  out = set()
  for name in _imports(path):
    parts = name.split(".")
    if parts[0] != "lpjax":
      continue
    for n in range(len(parts), 0, -1):
      candidate = ".".join(parts[:n])
      if candidate in MODULES:
        out.add(candidate)
        break
  out.discard(_module_name(path))
  return out


def _rank(module: str) -> tuple[int, int] | None:
  """(package layer, layer inside quant or train) of a module; None for lpjax itself and its
  top-level modules (lpjax/export.py, lpjax/plot.py, lpjax/advise.py: the top, like
  lpjax/__init__.py)."""
  parts = module.split(".")
  if len(parts) == 1 or parts[1] not in PACKAGES:
    return None
  layer = next(i for i, names in enumerate(LAYERS) if parts[1] in names)
  inner = INNER_LAYERS.get(parts[1])
  if inner is None:
    return layer, 0
  if len(parts) == 2:  # lpjax/quant/__init__.py, the public API: the top of quant (train: same)
    return layer, len(inner)
  return layer, inner.index(parts[2])


def _violation(src: str, dst: str) -> str | None:
  """Why src importing dst breaks the layering, or None."""
  s, d = _rank(src), _rank(dst)
  if s is None:  # the top may import anything
    return None
  if d is None:
    return "imports lpjax itself (the top)"
  src_pkg, dst_pkg = src.split(".")[1], dst.split(".")[1]
  if src_pkg != dst_pkg:
    if d[0] >= s[0]:
      return f"{src_pkg} may not import {dst_pkg} (same or higher layer)"
    return None
  if src_pkg in INNER_LAYERS and d[1] > s[1]:
    return f"{src_pkg}'s {INNER_LAYERS[src_pkg][s[1]]} may not import the higher layer {dst}"
  return None


def test_the_layer_order_names_every_package_and_quant_subpackage():
  on_disk = {p.name for p in LPJAX.iterdir() if (p / "__init__.py").exists()}
  assert on_disk == set(PACKAGES), on_disk ^ set(PACKAGES)
  quant = {p.stem for p in (LPJAX / "quant").iterdir()
           if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").exists())}
  assert quant == set(QUANT_LAYERS), quant ^ set(QUANT_LAYERS)
  train = {p.stem for p in (LPJAX / "train").iterdir()
           if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").exists())}
  assert train == set(TRAIN_LAYERS), train ^ set(TRAIN_LAYERS)


def test_every_import_points_down():
  bad = []
  for module, path in MODULES.items():
    for dst in sorted(_lpjax_edges(path)):
      why = _violation(module, dst)
      if why:
        bad.append(f"{path.relative_to(ROOT)} imports {dst}: {why}")
  assert not bad, "\n".join(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan), each sorted."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def test_no_import_circles():
  graph = {m: _lpjax_edges(p) for m, p in MODULES.items()}
  assert not _cycles(graph), "import circles:\n" + "\n".join(" <-> ".join(c) for c in _cycles(graph))


def test_no_flax_below_nn():
  bad = [f"{p.relative_to(ROOT)} imports {n}" for m, p in MODULES.items()
         if m.split(".")[1:2] and m.split(".")[1] in NO_FLAX
         for n in _imports(p) if n.split(".")[0] == "flax"]
  assert not bad, "\n".join(bad)


def test_nothing_outside_quant_reaches_its_private_modules():
  """pallas, nn, models, train and the benchmarks use quant's documented modules (each
  sub-package's docstring lists them), never a `_private` one."""
  files = [p for m, p in MODULES.items() if not m.startswith("lpjax.quant")]
  files += sorted((ROOT / "benchmarks").rglob("*.py"))
  bad = [f"{p.relative_to(ROOT)} imports {n}" for p in files for n in _imports(p)
         if n.startswith("lpjax.quant.") and any(s.startswith("_") for s in n.split(".")[2:])]
  assert not bad, "\n".join(bad)


def test_quant_subpackages_document_what_they_offer_and_shadow_no_public_name():
  import lpjax.quant as quant
  for name in QUANT_LAYERS:
    path = LPJAX / "quant" / name
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert len(doc) > 100, f"{path.relative_to(ROOT)} does not say what it offers"
    assert name not in quant.__all__ or name == "recipes", f"lpjax.quant.{name} shadows a public name"
  for sub in (LPJAX / "quant").iterdir():
    if sub.is_dir() and (sub / "__init__.py").exists():
      doc = ast.get_docstring(ast.parse((sub / "__init__.py").read_text()))
      for mod in sub.glob("*.py"):
        if mod.name != "__init__.py":
          assert f"`{mod.stem}`" in doc, f"lpjax/quant/{sub.name}/__init__.py omits `{mod.stem}`"


def test_train_subpackages_say_what_they_own_and_list_their_modules():
  import lpjax.train as train
  for name in TRAIN_LAYERS:
    path = LPJAX / "train" / name
    if not path.is_dir():
      continue
    doc = ast.get_docstring(ast.parse((path / "__init__.py").read_text())) or ""
    assert len(doc) > 100, f"lpjax/train/{name}/__init__.py does not say what it owns"
    assert name not in train.__all__, f"lpjax.train.{name} shadows a public name"
    for mod in path.glob("*.py"):
      if mod.name != "__init__.py":
        assert f"`{mod.stem}`" in doc, f"lpjax/train/{name}/__init__.py omits `{mod.stem}`"


# --- the checker itself -----------------------------------------------------------------------

def test_the_checker_sees_lazy_imports_and_loads_by_name(tmp_path):
  f = tmp_path / "m.py"
  f.write_text('"""lpjax.train in a docstring is no import."""\n'
               "import importlib, logging\n"
               "LOG = logging.getLogger('lpjax.data')\n"
               "def g():\n  from lpjax.train import config\n  import flax.nnx\n"
               "  importlib.import_module('lpjax.pallas')\n  __import__('lpjax.nn')\n"
               "  importlib.import_module(f'lpjax.models.{g}')\n"
               "  REG.provide('x', 'lpjax.eval')\n")
  assert _imports(f) == {"importlib", "logging", "lpjax.train.config", "flax.nnx",
                         "lpjax.pallas", "lpjax.nn", "lpjax.models", "lpjax.eval"}


def test_the_checker_finds_circles_and_upward_arrows():
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert _cycles({"a": {"b"}, "b": set()}) == []
  assert _violation("lpjax.quant.codec.qarray", "lpjax.pallas")
  assert _violation("lpjax.quant.codec.qarray", "lpjax.quant.gemm.operand")
  assert _violation("lpjax.quant.codec.qarray", "lpjax.quant")  # the public API is quant's top
  assert _violation("lpjax.nn._layers", "lpjax.pallas")  # same layer
  assert _violation("lpjax.data._pipeline", "lpjax.optim")
  assert _violation("lpjax.models.llama", "lpjax.train.config")
  assert _violation("lpjax.quant.backends", "lpjax")
  assert not _violation("lpjax.quant.gemm.operand", "lpjax.quant.codec.qarray")
  assert not _violation("lpjax.pallas._ops", "lpjax.quant.codec.scales_exact")
  assert not _violation("lpjax", "lpjax.pallas")
  assert not _violation("lpjax.train.loop._trainer", "lpjax.models.llama")
  assert _violation("lpjax.train.step._step", "lpjax.train.loop._trainer")  # up inside train
  assert _violation("lpjax.train.schema._validate", "lpjax.train.config")
  assert _violation("lpjax.train.cli._cli", "lpjax.train")  # the public API is train's top
  assert not _violation("lpjax.train.loop._trainer", "lpjax.train.step._step")
  assert not _violation("lpjax.train.config", "lpjax.train.schema._validate")


# --- a repository that stands on its own ------------------------------------------------------

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


# The modules of a package that are not `_private`: public ones, and quant's documented layers.
_NAMED_MODULES = {"quant": {"backends", "policy", "export"}, "train": {"config"}}


@pytest.mark.parametrize("package", PACKAGES)
def test_public_api_is_declared_and_modules_are_private(package):
  init = ROOT / "lpjax" / package / "__init__.py"
  tree = ast.parse(init.read_text())
  exported = [n for n in ast.walk(tree) if isinstance(n, ast.Assign)
              and any(getattr(t, "id", None) == "__all__" for t in n.targets)]
  if package == "models":  # one public module per model (lpjax.models.llama, ...)
    return
  assert exported, f"lpjax/{package}/__init__.py declares no __all__"
  for path in (ROOT / "lpjax" / package).glob("*.py"):
    if path.name != "__init__.py" and not path.name.startswith("_"):
      assert path.stem in _NAMED_MODULES.get(package, set()), (
          f"{path.relative_to(ROOT)} should be private (_{path.name})")


def test_test_files_have_unique_basenames():
  """pytest imports test modules by basename (rootdir import mode, no __init__.py): two files of
  one name in different folders make the second fail to collect in a whole-suite run only."""
  tests = pathlib.Path(__file__).resolve().parent
  names = collections.Counter(p.name for p in tests.rglob("test_*.py"))
  assert not [n for n, k in names.items() if k > 1], names.most_common(3)
