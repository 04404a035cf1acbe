"""Result records: the stored source of every headline figure in README.md and docs/results.md.

A benchmark that produces a headline figure writes a small JSON record into `docs/results/records/`
(`--record` on the benchmark): the figures, the exact command, the git commit, the date, the
machine and the versions. The docs name the record next to each figure they state, as an HTML
comment right after the number, which a reader of the rendered page does not see:

    **0.260x**<!-- record: weight_gather.gather_vs_bf16 --> the bytes of bf16 gathers

`tests/benchmarks/common/test_result_records.py` reads every such comment in README.md and docs/*.md, checks that the
number just before it equals the record's figure at the precision the doc prints, and fails on
any figure inside a `<!-- records: begin -->` ... `<!-- records: end -->` region that names no
record. Figures of runs too long to repeat (training sweeps) are records written from the stored
tables, with `source` saying where they were transcribed from.

Example (a record written into a temporary folder; no jax needed):

>>> import json, tempfile
>>> folder = tempfile.mkdtemp()
>>> path = write_record("demo", {"ratio": 0.2603}, "python benchmarks/memory/weight_gather.py", directory=folder)
>>> record = json.load(open(path))
>>> record["figures"], record["command"], sorted(record)[:3]
({'ratio': 0.2603}, 'python benchmarks/memory/weight_gather.py', ['command', 'commit', 'date'])
>>> read_record("demo", directory=folder)["name"]
'demo'
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORDS_DIR = os.path.join(ROOT, "docs", "results", "records")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_]*$")


# Paths whose uncommitted edits do not make a measurement "dirty" (they are not code).
_NOT_CODE = ("docs", "notebooks", "*.md")


def git_commit(root: str | None = None) -> tuple[str | None, bool | None]:
  """(HEAD's commit, whether tracked code has uncommitted changes: edits under docs/, notebooks/
  and of *.md files do not count) of `root` (default: this repository); (None, None) without git
  or outside a git repository."""
  root = root or ROOT
  try:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                            text=True, timeout=30)
    if commit.returncode != 0:
      return None, None
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                             *(f":(exclude){p}" for p in _NOT_CODE)], cwd=root,
                            capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.SubprocessError):
    return None, None
  dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
  return commit.stdout.strip(), dirty


# The commit of the code this process loaded: a benchmark imports this module at its start, and the
# tree may move on while it runs (minutes to hours).
AT_START = git_commit()


def machine() -> dict:
  """What ran the benchmark: OS, CPU architecture and name, core count (no host name)."""
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    cpu = names[0] if names else cpu
  except OSError:
    pass
  return {"system": platform.system(), "arch": platform.machine(), "cpu": cpu,
          "cpus": os.cpu_count()}


def versions() -> dict:
  """Python's version and, where they are imported already, jax's and jaxlib's."""
  out = {"python": platform.python_version()}
  for module in ("jax", "jaxlib"):
    if module in sys.modules:
      out[module] = getattr(sys.modules[module], "__version__", None)
  return out


def command_line(argv: list[str] | None = None) -> str:
  """The command that ran this process, with the script's path relative to the repository."""
  argv = list(sys.argv if argv is None else argv)
  script = os.path.abspath(argv[0]) if argv else ""
  if script.startswith(ROOT + os.sep):
    argv[0] = os.path.relpath(script, ROOT)
  return " ".join(["python", *(shlex.quote(a) for a in argv)])


def _check_figures(figures: dict) -> dict:
  if not isinstance(figures, dict) or not figures:
    raise ValueError(f"figures must be a non-empty dict of name -> number, got {figures!r}.")
  out = {}
  for key, value in figures.items():
    if not isinstance(key, str) or not _NAME.match(key):
      raise ValueError(f"figure name {key!r}: use lower-case letters, digits and '_'.")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
      raise ValueError(f"figure {key!r} is {value!r}; a figure is a finite int or float "
                       "(store it in the unit the docs print: %, GiB, x).")
    out[key] = int(value) if isinstance(value, int) else float(value)
  return out


def write_record(name: str, figures: dict, command: str | None = None, *, source: str = "measured",
                 notes: str = "", commit: str | None = None, machine_info: dict | str | None = None,
                 version_info: dict | None = None, directory: str | None = None) -> str:
  """Writes `<directory>/<name>.json` and returns its path (default directory: $LPJAX_RECORDS_DIR,
  else docs/results/records/).

  name: the record's name, as the docs cite it (`<!-- record: NAME.FIGURE -->`).
  figures: figure name -> number, in the unit the docs print (a ratio, %, GiB).
  command: the exact command that produced the figures (default: this process's command line).
  source: "measured" when this process measured them; for a record written from stored output,
    where it came from (e.g. "transcribed from commit 7762c06, docs/numerics_monitor.md").
  notes: free text (what the figures are, the setting).
  commit: the commit that produced the figures, for a transcribed record; by default HEAD's when
    this module was imported, i.e. when the benchmark started (None without git; `dirty` says
    whether its code had uncommitted changes then).
  machine_info, version_info: what ran a transcribed record's figures (as its source states);
    a measured record takes this process's machine and Python / jax versions.
  The record adds the UTC date (of the measurement, or of the transcription).
  """
  if not isinstance(name, str) or not _NAME.match(name):
    raise ValueError(f"record name {name!r}: use lower-case letters, digits and '_' (it is the "
                     "file name and the docs cite it).")
  dirty = None
  if commit is None:
    commit, dirty = AT_START
  record = {
      "name": name,
      "figures": _check_figures(figures),
      "command": command if command is not None else command_line(),
      "source": source,
      "commit": commit,
      "dirty": dirty,
      "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
      "machine": machine_info if machine_info is not None or source != "measured" else machine(),
      "versions": version_info if version_info is not None or source != "measured" else versions(),
  }
  if notes:
    record["notes"] = notes
  directory = directory or os.environ.get("LPJAX_RECORDS_DIR") or RECORDS_DIR
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, f"{name}.json")
  with open(path + ".tmp", "w") as f:
    json.dump(record, f, indent=2)
    f.write("\n")
  os.replace(path + ".tmp", path)
  return path


def read_record(name: str, directory: str | None = None) -> dict:
  """The record `name` (docs/results/records/<name>.json unless `directory`)."""
  path = os.path.join(directory or RECORDS_DIR, f"{name}.json")
  with open(path) as f:
    return json.load(f)


def add_record_argument(parser, default_name: str) -> None:
  """`--record [NAME]`: write this run's figures as record NAME (default `default_name`)."""
  parser.add_argument("--record", nargs="?", const=default_name, default=None, metavar="NAME",
                      help=f"write the figures to docs/results/records/<NAME>.json (default name "
                           f"{default_name}); the docs' headline figures are checked against it")


# --- The docs' side: which figure cites which record -------------------------------------------

# `<!-- record: NAME.FIGURE -->` right after a number (at most a unit and markup in between).
CITATION = re.compile(r"<!--\s*record:\s*([a-z0-9_]+)\.([a-z0-9_]+)\s*-->")
# A region of a doc where every figure must cite a record.
GUARD_BEGIN, GUARD_END = "<!-- records: begin -->", "<!-- records: end -->"
_NUMBER = re.compile(r"(?<![\w.])([+\-\u2212]?)(\d+(?:\.\d+)?)")
_UNIT_GAP = 8  # characters allowed between a number and its citation: "x**", " GiB", "%"


def _masked(text: str) -> str:
  """`text` with HTML comments and link targets blanked (same length), so that their digits are
  never read as figures."""
  blank = lambda m: " " * len(m.group(0))
  text = re.sub(r"<!--.*?-->", blank, text, flags=re.S)
  return re.sub(r"\]\([^)\s]*\)", lambda m: "]" + " " * (len(m.group(0)) - 1), text)


def cited_figures(text: str) -> list[dict]:
  """Every citation of `text`: {record, figure, number (as printed, sign included), line}.

  The number is the last one before the citation on its line, ending at most a few characters
  (a unit, `**`) before it; a citation with no such number is returned with number None.

  >>> [(c["record"], c["figure"], c["number"]) for c in cited_figures(
  ...     "gathers **0.260x**<!-- record: wg.ratio --> of bf16, -0.29%<!-- record: r.nv -->")]
  [('wg', 'ratio', '0.260'), ('r', 'nv', '-0.29')]
  """
  out = []
  masked = _masked(text)
  for m in CITATION.finditer(text):
    line_start = text.rfind("\n", 0, m.start()) + 1
    numbers = list(_NUMBER.finditer(masked, line_start, m.start()))
    number = None
    if numbers and m.start() - numbers[-1].end() <= _UNIT_GAP:
      sign, digits = numbers[-1].groups()
      number = ("-" if sign in ("-", "\u2212") else "") + digits
    out.append({"record": m.group(1), "figure": m.group(2), "number": number,
                "line": text.count("\n", 0, m.start()) + 1})
  return out


def uncited_figures(text: str) -> list[tuple[int, str]]:
  """(line, figure) of every figure inside a guarded region that cites no record. A figure is a
  number with a decimal point, or one followed by % or x; counts of steps, seeds, devices are not.

  >>> uncited_figures("a 1.5x<!-- record: r.a --> b\\n<!-- records: begin -->\\n"
  ...                 "3 seeds: 0.275x, +4.4%<!-- record: r.b -->, see [x](y.md#v1.2)\\n"
  ...                 "<!-- records: end -->\\n0.9 outside")
  [(3, '0.275')]
  """
  masked = _masked(text)
  out = []
  for begin in re.finditer(re.escape(GUARD_BEGIN), text):
    end = text.find(GUARD_END, begin.end())
    if end < 0:
      out.append((text.count("\n", 0, begin.start()) + 1, f"{GUARD_BEGIN} without {GUARD_END}"))
      continue
    for m in _NUMBER.finditer(masked, begin.end(), end):
      after = masked[m.end():m.end() + 1]
      if "." not in m.group(2) and after not in ("%", "x"):
        continue
      if not CITATION.match(text, m.end() + len(re.match(r"[^\d\n<]{0,%d}" % _UNIT_GAP,
                                                              text[m.end():]).group(0))):
        out.append((text.count("\n", 0, m.start()) + 1, m.group(1) + m.group(2)))
  return out


def printed(value: float, number: str) -> str:
  """`value` printed as the doc prints `number` (its decimals): 0.2603 as '0.260' for '0.275'.

  >>> printed(0.26031, "0.275"), printed(-0.2904, "-0.29"), printed(104.3, "104")
  ('0.260', '-0.29', '104')
  """
  decimals = len(number.split(".")[1]) if "." in number else 0
  text = f"{value:.{decimals}f}"
  return "0" + text[2:] if text.startswith("-0") and float(text) == 0 else text


def check_text(text: str, load=read_record) -> list[str]:
  """The problems of a doc's figures: a citation whose number differs from its record's figure
  (at the doc's precision), names a missing record or figure, or follows no number; a figure in a
  guarded region that cites no record. `load(name)` returns a record (default: read_record)."""
  problems = []
  cache = {}
  for c in cited_figures(text):
    where = f"line {c['line']} ({c['record']}.{c['figure']})"
    if c["number"] is None:
      problems.append(f"{where}: no number right before the citation")
      continue
    if c["record"] not in cache:
      try:
        cache[c["record"]] = load(c["record"])
      except FileNotFoundError:
        cache[c["record"]] = None
    record = cache[c["record"]]
    if record is None:
      problems.append(f"{where}: no record {c['record']!r} in docs/results/records/")
      continue
    figures = record.get("figures", {})
    if c["figure"] not in figures:
      problems.append(f"{where}: record {c['record']!r} has no figure {c['figure']!r} (it has "
                      f"{', '.join(sorted(figures))})")
      continue
    want = printed(figures[c["figure"]], c["number"])
    if want != c["number"].lstrip("+"):
      problems.append(f"{where}: the doc says {c['number']}, the record says {want} "
                      f"({figures[c['figure']]!r}, from `{record.get('command')}`)")
  for line, figure in uncited_figures(text):
    problems.append(f"line {line}: {figure} in a records region cites no record (add "
                    "<!-- record: NAME.FIGURE --> after it)")
  return problems
