"""Headline figures come from stored result records (docs/results/records/*.json, written by
benchmarks/common/records.py), so that a figure in the docs cannot go stale silently.

Every `<!-- record: NAME.FIGURE -->` in README.md and docs/**/*.md must follow the number its
record holds (at the precision the doc prints it), and every figure inside a
`<!-- records: begin -->` ... `<!-- records: end -->` region must cite a record. The README's
"Where it stands" and its advisor finding are such regions. A notebook's text states no
figure its saved outputs do not show.
"""

import datetime
import doctest
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path[:0] = [os.path.join(str(ROOT / "benchmarks"), d)
                for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/

import records  # noqa: E402

RECORDS = ROOT / "docs" / "results" / "records"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _git_head():
  try:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
  except OSError:
    return None
  return out.stdout.strip() if out.returncode == 0 else None


# --- the helper the benchmarks call --------------------------------------------------------


def test_records_module_examples():
  result = doctest.testmod(records, optionflags=doctest.ELLIPSIS)
  assert result.attempted >= 4 and result.failed == 0


def test_write_record_writes_figures_command_commit_date_machine(tmp_path):
  path = records.write_record("demo_ratio", {"ratio": 0.2603, "gib": 13, "pct": -0.29},
                              "python benchmarks/memory/weight_gather.py --record", directory=str(tmp_path))
  assert path == str(tmp_path / "demo_ratio.json")
  record = json.loads(pathlib.Path(path).read_text())
  assert record["name"] == "demo_ratio"
  assert record["figures"] == {"ratio": 0.2603, "gib": 13, "pct": -0.29}
  assert record["command"] == "python benchmarks/memory/weight_gather.py --record"
  assert record["source"] == "measured"
  assert record["commit"] == _git_head()  # the tree has not moved since this test's import
  date = datetime.datetime.strptime(record["date"], "%Y-%m-%dT%H:%M:%SZ")
  assert date.year >= 2024
  assert record["machine"]["cpus"] == os.cpu_count() and record["machine"]["arch"]
  assert re.fullmatch(r"3\.\d+\.\d+", record["versions"]["python"])
  assert record["versions"]["jax"] == sys.modules["jax"].__version__  # conftest imports jax


def test_write_record_without_git(tmp_path, monkeypatch):
  assert records.git_commit(str(tmp_path)) == (None, None)  # not a repository
  monkeypatch.setenv("PATH", str(tmp_path))  # no git executable at all
  assert records.git_commit() == (None, None)
  monkeypatch.setattr(records, "AT_START", records.git_commit())
  record = json.loads(pathlib.Path(records.write_record(
      "no_git", {"x": 1.0}, "cmd", directory=str(tmp_path))).read_text())
  assert record["commit"] is None and record["dirty"] is None


def test_dirty_means_uncommitted_code_not_docs(tmp_path):
  git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
  (tmp_path / "docs").mkdir()
  for name in ("bench.py", "README.md", "docs/results.md"):
    (tmp_path / name).write_text("1\n")
  for cmd in (["init", "-q"], ["add", "."], ["commit", "-qm", "x"]):
    subprocess.run(git + cmd, cwd=tmp_path, check=True, capture_output=True)
  head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True,
                        text=True).stdout.strip()
  (tmp_path / "README.md").write_text("2\n")
  (tmp_path / "docs" / "results.md").write_text("2\n")
  assert records.git_commit(str(tmp_path)) == (head, False)
  (tmp_path / "bench.py").write_text("2\n")
  assert records.git_commit(str(tmp_path)) == (head, True)


def test_a_transcribed_record_keeps_the_commit_that_produced_it(tmp_path):
  path = records.write_record("old", {"loss": 1.8260}, "python benchmarks/x.py",
                              source="transcribed from commit 7762c06", commit="7762c06",
                              directory=str(tmp_path))
  record = json.loads(pathlib.Path(path).read_text())
  assert record["commit"] == "7762c06" and record["source"].startswith("transcribed from")


def test_the_default_command_is_this_process_command_line():
  line = records.command_line([str(ROOT / "benchmarks" / "memory" / "weight_gather.py"), "--config=a b.py"])
  assert line == "python benchmarks/memory/weight_gather.py '--config=a b.py'"


@pytest.mark.parametrize("name, figures, match", [
    ("Bad-Name", {"x": 1.0}, "record name"),
    ("ok", {}, "non-empty"),
    ("ok", {"x": float("nan")}, "finite"),
    ("ok", {"x": True}, "finite"),
    ("ok", {"x": "0.26"}, "finite"),
    ("ok", {"X y": 1.0}, "figure name"),
])
def test_write_record_rejects_what_the_docs_could_not_cite(tmp_path, name, figures, match):
  with pytest.raises(ValueError, match=match):
    records.write_record(name, figures, "cmd", directory=str(tmp_path))
  assert not list(tmp_path.iterdir())


# --- the checker, on text with a known answer ------------------------------------------------

_WG = {"name": "wg", "figures": {"ratio": 0.26031, "gib": 13.52}, "command": "python wg.py"}


def _load(name):
  if name != "wg":
    raise FileNotFoundError(name)
  return _WG


def test_a_stale_figure_is_reported_with_the_record_value():
  stale = "FP4 all-gather: **0.275x**<!-- record: wg.ratio --> of bf16"
  (problem,) = records.check_text(stale, _load)
  assert "0.275" in problem and "0.260" in problem and "python wg.py" in problem
  assert records.check_text(stale.replace("0.275", "0.260"), _load) == []
  assert records.check_text(stale.replace("0.275", "0.26"), _load) == []  # fewer digits: rounded


@pytest.mark.parametrize("text, expected", [
    ("13.5 GiB<!-- record: wg.gib -->", None),
    ("13.6 GiB<!-- record: wg.gib -->", "says 13.6"),
    ("1.0<!-- record: wg.nope -->", "no figure 'nope'"),
    ("1.0<!-- record: other.x -->", "no record 'other'"),
    ("see the table <!-- record: wg.gib -->", "no number"),
    ("13.5 of something much longer<!-- record: wg.gib -->", "no number"),
    ("<!-- records: begin -->\n0.275x of bf16\n<!-- records: end -->", "0.275 in a records region"),
    ("<!-- records: begin -->\n+4.4% against\n<!-- records: end -->", "+4.4 in a records region"),
    ("<!-- records: begin -->\n1000 steps, 3 seeds, [a](b.md#at-1.5)\n<!-- records: end -->", None),
    ("0.275x outside a region", None),
    ("<!-- records: begin -->\n0.3", "without"),
])
def test_the_checker_cases(text, expected):
  problems = records.check_text(text, _load)
  if expected is None:
    assert problems == []
  else:
    assert len(problems) == 1 and expected in problems[0], problems


# --- the repository's records and docs ------------------------------------------------------


def _stored():
  return sorted(RECORDS.glob("*.json"))


def test_every_stored_record_says_what_made_it():
  assert _stored(), "docs/results/records/ holds no record"
  for path in _stored():
    record = json.loads(path.read_text())
    assert record["name"] == path.stem, path.name
    assert record["figures"] and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in record["figures"].values())
    assert record["command"].startswith("python "), path.name
    assert re.fullmatch(r"[0-9a-f]{7,40}", record["commit"] or ""), f"{path.name}: no commit"
    datetime.datetime.strptime(record["date"], "%Y-%m-%dT%H:%M:%SZ")
    source = record["source"]
    assert source == "measured" or source.startswith("transcribed from "), path.name
    if source == "measured":
      assert record["dirty"] is False, f"{path.name} was measured on uncommitted code"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_figure_matches_its_record(doc):
  problems = records.check_text(doc.read_text())
  assert not problems, f"{doc.relative_to(ROOT)}:\n  " + "\n  ".join(problems)


def test_every_record_is_cited_by_the_docs():
  cited = {c["record"] for doc in DOCS for c in records.cited_figures(doc.read_text())}
  assert {p.stem for p in _stored()} <= cited


def _region_of(text, start, stop):
  part = text.split(start, 1)[1].split(stop, 1)[0]
  return part


def test_the_readme_headlines_are_guarded_regions():
  readme = (ROOT / "README.md").read_text()
  stands = _region_of(readme, "**Where it stands**", "**GPU status")
  assert records.GUARD_BEGIN in stands and records.GUARD_END in stands
  body = stands.split(records.GUARD_BEGIN, 1)[1].split(records.GUARD_END, 1)[0]
  assert body.count("\n- ") >= 4  # every bullet inside
  cited = {c["record"] for c in records.cited_figures(body)}
  assert {"fp4_recipes_1000", "stable_spam_vs_adam_fp4", "llama_memory_1b",
          "weight_gather"} <= cited
  hurts = _region_of(readme, "## Where FP4 hurts", "\n## ")
  assert records.GUARD_BEGIN in hurts
  assert "advisor_vs_defaults_1000" in {c["record"] for c in records.cited_figures(hurts)}
  results = (ROOT / "docs" / "results.md").read_text()
  summary = _region_of(results, "## Summary", "\n## ")
  assert records.GUARD_BEGIN in summary
  gather = _region_of(results, "## FP4 weight all-gather", "\n## ")
  assert records.GUARD_BEGIN in gather


# --- the notebooks: their text states what their saved outputs show ---------------------------

# Notebooks whose prose restates figures of their own saved outputs.
OUTPUT_FIGURES = ("train_llama_fp4",)


@pytest.mark.parametrize("name", OUTPUT_FIGURES)
def test_a_notebook_states_only_figures_its_outputs_show(name):
  nb = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
  shown = set()
  for cell in nb["cells"]:
    for out in cell.get("outputs", []):
      text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
      shown.update(re.findall(r"\d+\.\d+", text))
  for cell in nb["cells"]:
    if cell["cell_type"] != "markdown":
      continue
    prose = re.sub(r"\]\([^)]*\)|arXiv \d+\.\d+", "", "".join(cell["source"]))
    for number in re.findall(r"(?<![\w.])\d+\.\d{2,}(?![\w.])", prose):
      assert any(records.printed(float(s), number) == number for s in shown), (
          f"{name}.ipynb says {number}, which no saved output shows; read it from the output")


# --- the docs speak to users, who never see this project's issue tracker ----------------------


def test_docs_name_no_issue_of_the_tracker():
  texts = {str(p.relative_to(ROOT)): p.read_text() for p in DOCS}
  for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
    cells = json.loads(nb.read_text())["cells"]
    texts[nb.name] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
  for name, text in texts.items():
    found = re.findall(r"\b[Ii]ssues? \d+|\bthe issue's\b|\bthis issue\b", text)
    assert not found, f"{name} names {found}: say what the goal or finding is instead"
