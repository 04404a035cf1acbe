"""The offline bundle for a GPU machine with its own CUDA JAX and no package index.

    python scripts/gpu_bundle.py build DIR      # here (make gpu-bundle BUNDLE=DIR)
    python scripts/gpu_bundle.py install DIR    # there (make gpu-check BUNDLE=DIR does it first)
    python scripts/gpu_bundle.py site DIR       # prints DIR/site[:$PYTHONPATH], for PYTHONPATH

`build` writes DIR/lpjax (lpjax's source, benchmarks, configs, scripts, Makefile: what
`make gpu-check` runs), DIR/wheels (wheels of the pure-Python packages the check imports that a
stock CUDA-JAX image lacks: ml_collections, and absl-py, which it needs; each repacked from this
environment's installed copy, so no network is needed and the versions are the pinned ones),
DIR/manifest.json and DIR/README.txt.

`install` installs, with `pip install --no-index --no-deps --target DIR/site`, only the wheels
whose module the machine's Python cannot import already, into DIR/site (a folder of the bundle,
never the machine's site-packages: its JAX, jaxlib, CUDA plugins, flax, optax and orbax are left
as they are); then it checks that everything stages a-g import is importable and names what is
not. Without pip it unpacks the wheels (a pure-Python wheel is its site-packages layout).

Examples:
  >>> wheel_name("ml-collections", "1.1.0")
  'ml_collections-1.1.0-py3-none-any.whl'
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Distribution -> module: the pure-Python packages stages a-g import beyond what a stock CUDA-JAX
# image brings (jax, jaxlib, the CUDA plugins, numpy, ml_dtypes, scipy, flax with PyYAML, optax,
# orbax-checkpoint with absl-py, tqdm). absl-py is there for ml_collections, in case.
BUNDLED = {"ml-collections": "ml_collections", "absl-py": "absl"}
# What the check imports from the machine (`install` checks each; none is installed by it).
REQUIRED = ("jax", "jaxlib", "numpy", "ml_dtypes", "flax", "optax", "orbax.checkpoint", "yaml",
            "ml_collections", "absl")
# The source the check runs: everything else (docs, tests, notebooks) stays home.
SOURCE = ("lpjax", "benchmarks", "configs", "scripts", "train.py", "Makefile", "pyproject.toml",
          "requirements.txt", "requirements-py312.txt", "README.md")


def wheel_name(dist: str, version: str) -> str:
  return f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"


def _record_line(name: str, data: bytes) -> str:
  digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
  return f"{name},sha256={digest},{len(data)}"


def repack(dist_name: str, out_dir: str) -> str:
  """A py3-none-any wheel of the installed distribution `dist_name` (pure Python only)."""
  dist = importlib.metadata.distribution(dist_name)
  wheel_meta = dist.read_text("WHEEL") or ""
  if "Root-Is-Purelib: true" not in wheel_meta:
    raise SystemExit(f"{dist_name} is not a pure-Python distribution here (its WHEEL file says "
                     "Root-Is-Purelib is not true): the bundle carries pure-Python wheels only.")
  info = next(str(f).split("/")[0] for f in dist.files if str(f).endswith(".dist-info/METADATA"))
  path = os.path.join(out_dir, wheel_name(dist.metadata["Name"], dist.version))
  records = []
  with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
    for f in sorted(dist.files, key=str):
      name = str(f)
      if (name.startswith("..") or "__pycache__" in name or name.endswith(".pyc")
          or name.endswith((".so", ".pyd")) or name in (f"{info}/RECORD", f"{info}/INSTALLER",
                                                        f"{info}/REQUESTED",
                                                        f"{info}/direct_url.json")):
        continue
      data = f.locate().read_bytes()
      zf.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
      records.append(_record_line(name, data))
    records.append(f"{info}/RECORD,,")
    zf.writestr(zipfile.ZipInfo(f"{info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0)),
                "\n".join(records) + "\n")
  return path


def _source_files() -> list[str]:
  """The repository's files under SOURCE: tracked and untracked-but-not-ignored (git), else all."""
  try:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", *SOURCE],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\n")
    return [f for f in out if f and os.path.isfile(os.path.join(ROOT, f))]
  except (OSError, subprocess.CalledProcessError):
    files = []
    for top in SOURCE:
      if os.path.isfile(os.path.join(ROOT, top)):
        files.append(top)
      for base, dirs, names in os.walk(os.path.join(ROOT, top)):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        files += [os.path.relpath(os.path.join(base, n), ROOT) for n in names]
    return files


def _size(path: str) -> int:
  return sum(os.path.getsize(os.path.join(b, n)) for b, _, ns in os.walk(path) for n in ns)


def build(bundle: str) -> dict:
  """Writes the bundle folder (see the module docstring); returns its manifest."""
  if os.path.exists(bundle) and os.listdir(bundle):
    for sub in ("lpjax", "wheels", "site"):
      shutil.rmtree(os.path.join(bundle, sub), ignore_errors=True)
  src, wheels = os.path.join(bundle, "lpjax"), os.path.join(bundle, "wheels")
  os.makedirs(wheels, exist_ok=True)
  for rel in _source_files():
    os.makedirs(os.path.dirname(os.path.join(src, rel)), exist_ok=True)
    shutil.copy2(os.path.join(ROOT, rel), os.path.join(src, rel))
  packages = {}
  for dist_name, module in BUNDLED.items():
    try:
      path = repack(dist_name, wheels)
    except importlib.metadata.PackageNotFoundError:
      raise SystemExit(f"{dist_name} is not installed here: `make venv` (or pip install -r "
                       "requirements.txt) first; the bundle repacks the installed copy.") from None
    packages[dist_name] = dict(module=module, version=importlib.metadata.version(dist_name),
                               wheel=os.path.basename(path), bytes=os.path.getsize(path))
  try:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or None
  except OSError:
    commit = None
  manifest = dict(lpjax_commit=commit, source_bytes=_size(src), packages=packages,
                  total_bytes=None)
  with open(os.path.join(bundle, "README.txt"), "w") as f:
    f.write(README)
  manifest["total_bytes"] = _size(bundle)
  with open(os.path.join(bundle, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=1)
  return manifest


README = """lpjax GPU-check bundle (written by `make gpu-bundle`; scripts/gpu_bundle.py)

On the GPU machine (its own CUDA JAX; no package index needed):

  cd lpjax
  make gpu-check BUNDLE=.. OUT=/path/to/out    # or, without make:
  python3 scripts/gpu_bundle.py install .. && \\
    PYTHONPATH=$(python3 scripts/gpu_bundle.py site ..) \\
    python3 -m benchmarks.gpu_check --out /path/to/out

`install` puts only the wheels whose module is missing into the bundle's site folder with
`pip install --no-index --no-deps --target`; the machine's JAX and everything else installed
there stay as they are. The check runs stages a g b c e d f within 540 s and keeps
/path/to/out/report.md up to date as it goes.
"""


def site(bundle: str) -> str:
  return os.path.abspath(os.path.join(bundle, "site"))


def missing_modules(modules, extra_path: str | None = None) -> list[str]:
  """The modules a fresh Python (with `extra_path` first on sys.path) cannot import; one
  process for all of them (importing jax on a GPU machine takes seconds)."""
  code = ("import importlib, json, sys\n"
          f"sys.path.insert(0, {extra_path!r})\n" if extra_path else
          "import importlib, json, sys\n") + (
      "missing = []\n"
      f"for m in {list(modules)!r}:\n"
      "  try:\n"
      "    importlib.import_module(m)\n"
      "  except Exception:\n"
      "    missing.append(m)\n"
      "print(json.dumps(missing))\n")
  env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", ""))
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
  try:
    return json.loads(out.stdout.strip().splitlines()[-1])
  except (IndexError, ValueError):
    return list(modules)


def install(bundle: str, *, everything: bool = False, log=print) -> list[str]:
  """Installs the missing bundled packages into the bundle's site folder (see the module
  docstring); returns the distributions installed. `everything` installs all of them."""
  with open(os.path.join(bundle, "manifest.json")) as f:
    manifest = json.load(f)
  target = site(bundle)
  os.makedirs(target, exist_ok=True)
  todo = [(name, p) for name, p in manifest["packages"].items()
          if everything or importlib.util.find_spec(p["module"]) is None]
  for name, p in manifest["packages"].items():
    if (name, p) not in todo:
      log(f"[gpu-bundle] {name}: already importable here, left as it is")
  wheels = [os.path.join(bundle, "wheels", p["wheel"]) for _, p in todo]
  if wheels:
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--upgrade",
           "--target", target, *wheels]
    has_pip = importlib.util.find_spec("pip") is not None
    if has_pip:
      log("[gpu-bundle] " + " ".join(cmd))
      subprocess.run(cmd, check=True)
    else:  # a pure-Python wheel is its site-packages layout
      log(f"[gpu-bundle] no pip here: unpacking {len(wheels)} wheel(s) into {target}")
      for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
          zf.extractall(target)
  missing = missing_modules(REQUIRED, target)
  if missing:
    raise SystemExit(f"[gpu-bundle] still not importable: {', '.join(missing)}. jax / jaxlib / "
                     "flax / optax / orbax / PyYAML must come with the machine's image (the "
                     "bundle never installs them); install them there, or add a pure-Python one "
                     "to BUNDLED in scripts/gpu_bundle.py and rebuild the bundle.")
  log(f"[gpu-bundle] ready: {len(wheels)} package(s) in {target}; everything stages a-g import "
      "is importable")
  return [name for name, _ in todo]


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python scripts/gpu_bundle.py", description=__doc__.split(
      "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("command", choices=("build", "install", "site"))
  p.add_argument("bundle", help="the bundle folder")
  p.add_argument("--all", action="store_true",
                 help="install: every bundled wheel, even where the module is importable")
  args = p.parse_args(argv)
  if args.command == "build":
    manifest = build(args.bundle)
    log = ", ".join(f"{n} {q['version']}" for n, q in manifest["packages"].items())
    print(f"[gpu-bundle] {args.bundle}: lpjax source ({manifest['source_bytes'] / 1e6:.2f} MB) "
          f"and wheels of {log}; {manifest['total_bytes'] / 1e6:.2f} MB in all")
  elif args.command == "install":
    install(args.bundle, everything=args.all)
  else:  # the value for PYTHONPATH: the bundle's site folder first
    print(os.pathsep.join(p for p in (site(args.bundle), os.environ.get("PYTHONPATH")) if p))
  return 0


if __name__ == "__main__":
  sys.exit(main())
