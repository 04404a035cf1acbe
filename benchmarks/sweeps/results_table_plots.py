"""Redraws docs/results.md's bar charts (`*_final.png`) from the tables printed in docs/results.md.

The per-run data the sweeps wrote (`runs/...`) is not in the repository, but each bar chart shows
numbers that its section prints: each row's final eval loss (± sample std where the row has
several seeds), its "vs <reference>" in % and its seeds. This script reads, for every image link
`![...](...*_final.png)` in the page, the nearest table above it in the same section that has a
"final eval loss" column, and draws that table with `ablate_report.plot_final`: labelled y axes,
n per bar and in the title, an error bar only where n > 1 and the table prints a std. Nothing is
computed that the table does not print, except the error bar of the % panel (the row's std in %
of the reference's mean, as `ablate.py`'s own reports draw it).

A table it reads has a first column with the row's name, a column whose header starts with "final
eval loss" ("2.3109 ± 0.0168", "2.7101" or "**1.8326**"), one whose header starts with "vs "
("+2.61%"; the reference is the row at 0.00%) and one headed "seeds" ("3/3": finished/run, or
"3"). The curve plots (`*_curves.png`) need per-step data and are redrawn from the runs with
`python benchmarks/sweeps/ablate.py SWEEP --out DIR --report-only`.

Usage:
  python benchmarks/sweeps/results_table_plots.py [--results docs/results.md] [--out docs/results]
      [--only NAME ...]

NAME is a PNG's file name with or without `.png` (`cpu150_format_final`); each PNG is written to
--out under its linked file name.

>>> table = '''## Demo (1 seed)
...
... | row | final eval loss | vs FP32 Adam | seeds |
... |---|---|---|---|
... | fp32_adam | 2.0000 | +0.00% | 1/1 |
... | **mxfp4** | 2.1000 | +5.00% | 1/1 |
...
... ![demo final](results/demo_final.png)
... '''
>>> [plot] = final_plots(table)
>>> plot.png, plot.reference, plot.reference_row, [(r.label, r.mean, r.n) for r in plot.rows]
('results/demo_final.png', 'FP32 Adam', 'fp32_adam', [('fp32_adam', 2.0, 1), ('mxfp4', 2.1, 1)])
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", d)
                for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/

import ablate_report  # noqa: E402

NAN = float("nan")
_IMAGE = re.compile(r"!\[[^\]]*\]\((?P<path>[^)\s]*_final\.png)\)")
_HEADING = re.compile(r"^#+\s+(?P<text>.*\S)\s*$")
_LOSS = re.compile(r"^(?P<mean>[-+]?\d+(?:\.\d+)?)(?:\s*±\s*(?P<std>\d+(?:\.\d+)?))?$")
_PCT = re.compile(r"^(?P<pct>[-+]?\d+(?:\.\d+)?)\s*%$")
_SEEDS = re.compile(r"^(?P<ok>\d+)(?:\s*/\s*(?P<of>\d+))?\b")


@dataclasses.dataclass(frozen=True)
class TableRow:
  label: str  # the first cell, markdown emphasis and code marks removed
  mean: float  # the final eval loss as printed (a mean over the row's finished seeds)
  std: float  # the printed "± std"; nan where the cell has none
  n: int  # seeds that finished: the seeds cell's "3" of "3/3"
  ratio_pct: float  # the "vs <reference>" cell in %; nan where it prints none ("—")


@dataclasses.dataclass(frozen=True)
class FinalPlot:
  png: str  # the image link's target, relative to the results page's folder
  line: int  # 1-based line of the image link in the page
  heading: str  # the text of the section heading above the table
  reference: str  # the reference as the "vs ..." header names it ("FP32 Adam")
  reference_row: str  # the label of the row the ratio column puts at 0.00%
  rows: tuple  # TableRow per table row, in the table's order


def _strip(cell: str) -> str:
  return re.sub(r"\*\*|`", "", cell).strip()


def _cells(line: str) -> list[str]:
  return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_loss(cell: str) -> tuple[float, float]:
  """'2.3109 ± 0.0168' -> (2.3109, 0.0168); '**2.7101**' -> (2.7101, nan); '—' -> (nan, nan).

  >>> parse_loss('2.3109 ± 0.0168'), parse_loss('**1.8326**')
  ((2.3109, 0.0168), (1.8326, nan))
  """
  text = _strip(cell)
  m = _LOSS.match(text)
  if not m:
    if text in ("", "—", "-"):
      return NAN, NAN
    raise ValueError(f"final eval loss cell {cell!r} is neither 'MEAN', 'MEAN ± STD' nor '—'")
  return float(m["mean"]), float(m["std"]) if m["std"] else NAN


def parse_pct(cell: str) -> float:
  """'+2.61%' -> 2.61; '—' -> nan."""
  text = _strip(cell)
  m = _PCT.match(text)
  if not m:
    if text in ("", "—", "-"):
      return NAN
    raise ValueError(f"ratio cell {cell!r} is not a percentage such as '+2.61%'")
  return float(m["pct"])


def parse_seeds(cell: str) -> int:
  """'3/3' -> 3, '2/3 (1 diverged)' -> 2, '1' -> 1: the seeds that finished."""
  m = _SEEDS.match(_strip(cell))
  if not m:
    raise ValueError(f"seeds cell {cell!r} does not start with 'N' or 'N/M'")
  return int(m["ok"])


def _column(header: list[str], test, what: str, where: str) -> int:
  found = [i for i, h in enumerate(header) if test(_strip(h).lower())]
  if not found:
    raise ValueError(f"{where}: the table has no {what} column (header: {' | '.join(header)}); "
                     f"add one to the table in the results page")
  return found[0]


def parse_table(lines: list[str], where: str) -> tuple[str, str, tuple]:
  """A markdown table (header, separator, rows) -> (reference, reference_row, rows)."""
  header = _cells(lines[0])
  where = f"{where} (table header: {lines[0].strip()})"
  loss_col = _column(header, lambda h: h.startswith("final eval loss"), "'final eval loss'", where)
  ratio_col = _column(header, lambda h: h.startswith("vs "), "'vs <reference>'", where)
  seeds_col = _column(header, lambda h: h.startswith("seeds"), "'seeds'", where)
  rows = []
  for line in lines[2:]:
    cells = _cells(line)
    mean, std = parse_loss(cells[loss_col])
    rows.append(TableRow(label=_strip(cells[0]), mean=mean, std=std,
                         n=parse_seeds(cells[seeds_col]), ratio_pct=parse_pct(cells[ratio_col])))
  zero = [r.label for r in rows if r.ratio_pct == 0.0]
  if not zero:
    raise ValueError(f"{where}: no row is at 0.00% in the ratio column, so the reference row is "
                     "unknown")
  return _strip(header[ratio_col])[3:].strip(), zero[0], tuple(rows)


def _table_above(lines: list[str], at: int) -> tuple[list[str], str]:
  """The nearest table above line index `at` with a 'final eval loss' column, within the section
  (no heading between them), and the section's heading."""
  i = at - 1
  while i >= 0 and not _HEADING.match(lines[i]):
    if lines[i].lstrip().startswith("|") and not lines[i + 1].lstrip().startswith("|"):
      end = i + 1  # the table's last line is i
      while i > 0 and lines[i - 1].lstrip().startswith("|"):
        i -= 1
      table = lines[i:end]
      if any(_strip(c).lower().startswith("final eval loss") for c in _cells(table[0])):
        heading = next((_HEADING.match(lines[k])["text"] for k in range(i, -1, -1)
                        if _HEADING.match(lines[k])), "")
        return table, heading
    i -= 1
  return [], ""


def final_plots(text: str) -> list[FinalPlot]:
  """Every `*_final.png` linked from the page, with the table above it parsed.

  Raises ValueError naming the image and its line where no such table is found or a cell does
  not parse."""
  lines = text.splitlines()
  plots = []
  in_code = False
  for at, line in enumerate(lines):
    if line.lstrip().startswith("```"):
      in_code = not in_code
    if in_code:
      continue
    for m in _IMAGE.finditer(line):
      where = f"{m['path']} (line {at + 1})"
      table, heading = _table_above(lines, at)
      if not table:
        raise ValueError(f"{where}: no table with a 'final eval loss' column above it in its "
                         "section; the bar chart is drawn from that table")
      reference, reference_row, rows = parse_table(table, where)
      plots.append(FinalPlot(png=m["path"], line=at + 1, heading=heading, reference=reference,
                             reference_row=reference_row, rows=rows))
  return plots


def summary_of(plot: FinalPlot) -> dict:
  """The plot as `ablate_report.plot_final` takes a sweep's summary."""
  return {"sweep": plot.heading, "title": f"{plot.heading} (docs/results.md)",
          "reference": plot.reference_row, "reference_name": plot.reference,
          "rows": [{"label": r.label, "mean": r.mean, "std": r.std, "n_ok": r.n,
                    "ratio_pct": r.ratio_pct} for r in plot.rows]}


def _name(path: str) -> str:
  return os.path.splitext(os.path.basename(path))[0]


def main(argv=None) -> list[str]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--results", default=os.path.join("docs", "results.md"),
                      help="the results page whose tables are drawn")
  parser.add_argument("--out", default=os.path.join("docs", "results"),
                      help="folder the PNGs are written to, under their linked file names")
  parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                      help="only these PNGs (file name, with or without .png)")
  args = parser.parse_args(argv)
  with open(args.results) as f:
    plots = final_plots(f.read())
  if args.only:
    wanted = {_name(n) for n in args.only}
    unknown = wanted - {_name(p.png) for p in plots}
    if unknown:
      parser.error(f"--only {', '.join(sorted(unknown))}: not a *_final.png linked from "
                   f"{args.results}; linked: {', '.join(_name(p.png) for p in plots)}")
    plots = [p for p in plots if _name(p.png) in wanted]
  written = []
  for plot in plots:
    path = os.path.join(args.out, os.path.basename(plot.png))
    os.makedirs(args.out, exist_ok=True)
    ablate_report.plot_final(summary_of(plot), path)
    written.append(path)
    n = sorted({r.n for r in plot.rows})
    print(f"{path}: {len(plot.rows)} rows, n = {'/'.join(map(str, n))}, vs {plot.reference} "
          f"(image at line {plot.line})")
  return written


if __name__ == "__main__":
  main()
