"""benchmarks/sweeps/results_table_plots.py: the table parser against a hand-written snippet, every bar
chart of docs/results.md has a parseable table above it, and the drawn chart has error bars only
where n > 1 (matplotlib only for the drawing tests)."""

import doctest
import math
import os
import pathlib
import re
import sys

import pytest

sys.path[:0] = [os.path.join(os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmarks"), d)
                for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/

import ablate_report  # noqa: E402
import results_table_plots as rtp  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[3]
RESULTS = ROOT / "docs" / "results.md"

SNIPPET = """# Page

## Earlier section (3 seeds)

| row | final eval loss | vs FP32 Adam | seeds |
|---|---|---|---|
| fp32_adam | 9.0000 ± 0.5000 | +0.00% | 3/3 |

![earlier curves](results/earlier_curves.png)

## Demo sweep (300 steps, 3 seeds)

| row | recipe | final eval loss | eval loss, quant off | vs FP32 Adam | seeds |
|---|---|---|---|---|---|
| fp32_adam | `fp32` | 2.5000 ± 0.0200 | 2.5000 ± 0.0200 | +0.00% | 3/3 |
| **mxfp4 + SR** | `mxfp4` | **2.6000 ± 0.0500** | 2.5900 | +4.00% | 2/3 (1 diverged) |
| one_seed | `nvfp4` | 2.4000 | 2.4100 | -4.00% | 1/3 |
| not_run | `bf16` | — | — | — | 0/3 |

Some prose, then another table without a loss column (it is skipped):

| GEMM | SNR dB |
|---|---|
| fwd | 18.8 |

![demo final](results/demo_final.png)

### Memory rows

| row | final eval loss | vs FP32 Adam (same seeds) | seeds |
|---|---|---|---|
| FP32 Adam (reference) | 3.0000 ± 0.1000 | +0.00% | 3 |
| bf16 moments | 2.9000 ± 0.0300 | -3.33% | 3 |

![memory final](results/mem_final.png)
"""


def test_the_parser_reads_the_printed_numbers_of_the_table_above_each_bar_chart():
  demo, mem = rtp.final_plots(SNIPPET)
  assert (demo.png, demo.heading, demo.reference, demo.reference_row) == (
      "results/demo_final.png", "Demo sweep (300 steps, 3 seeds)", "FP32 Adam", "fp32_adam")
  assert demo.line == SNIPPET.splitlines().index("![demo final](results/demo_final.png)") + 1
  assert [r.label for r in demo.rows] == ["fp32_adam", "mxfp4 + SR", "one_seed", "not_run"]
  assert [r.n for r in demo.rows] == [3, 2, 1, 0]
  assert [r.mean for r in demo.rows[:3]] == [2.5, 2.6, 2.4]
  assert demo.rows[0].std == 0.02 and demo.rows[1].std == 0.05
  assert math.isnan(demo.rows[2].std)  # one seed: the table prints no std
  assert [r.ratio_pct for r in demo.rows[:3]] == [0.0, 4.0, -4.0]
  assert math.isnan(demo.rows[3].mean) and math.isnan(demo.rows[3].ratio_pct)
  assert (mem.heading, mem.reference, mem.reference_row) == (
      "Memory rows", "FP32 Adam (same seeds)", "FP32 Adam (reference)")
  assert [(r.mean, r.std, r.n, r.ratio_pct) for r in mem.rows] == [
      (3.0, 0.1, 3, 0.0), (2.9, 0.03, 3, -3.33)]
  summary = rtp.summary_of(mem)
  assert summary["reference"] == "FP32 Adam (reference)"
  assert [r["n_ok"] for r in summary["rows"]] == [3, 3]


def test_a_table_is_not_taken_from_another_section_and_bad_tables_are_named():
  with pytest.raises(ValueError, match=r"x_final\.png \(line 7\).*no table"):
    rtp.final_plots("## A\n\n| row | final eval loss | vs B | seeds |\n|---|---|---|---|\n"
                    "| b | 1.0 | +0.00% | 1 |\n## C\n![x](results/x_final.png)\n")
  with pytest.raises(ValueError, match="'seeds' column"):
    rtp.final_plots("## A\n\n| row | final eval loss | vs B |\n|---|---|---|\n"
                    "| b | 1.0 | +0.00% |\n\n![x](results/x_final.png)\n")
  with pytest.raises(ValueError, match="no row is at 0.00%"):
    rtp.final_plots("## A\n\n| row | final eval loss | vs B | seeds |\n|---|---|---|---|\n"
                    "| b | 1.0 | +1.00% | 1 |\n\n![x](results/x_final.png)\n")
  with pytest.raises(ValueError, match="'abc'"):
    rtp.parse_loss("abc")
  assert rtp.parse_seeds("2/3 (1 diverged)") == 2 and rtp.parse_pct("**-0.12%**") == -0.12


def test_every_bar_chart_of_the_results_page_has_a_parseable_table_above_it():
  text = RESULTS.read_text()
  linked = re.findall(r"\]\((results/[\w.-]+_final\.png)\)", text)
  plots = rtp.final_plots(text)
  assert [p.png for p in plots] == linked and len(linked) >= 10
  for plot in plots:
    assert (RESULTS.parent / plot.png).is_file(), plot.png
    assert len(plot.rows) >= 2, plot.png
    assert all(math.isfinite(r.mean) and r.n >= 1 for r in plot.rows), plot.png
    ref = next(r for r in plot.rows if r.label == plot.reference_row)
    assert ref.ratio_pct == 0.0
    for r in plot.rows:  # the printed ratio is the printed means' ratio, to the print's rounding
      assert r.ratio_pct == pytest.approx((r.mean / ref.mean - 1) * 100, abs=0.02), (plot.png, r)
      assert (r.n > 1) == math.isfinite(r.std), (plot.png, r)  # a std exactly where n > 1
    stated = re.search(r"(\d+) seeds?\)", plot.heading)
    if stated:  # a heading's "(150 steps, 1 seed)" is every row's n
      assert {r.n for r in plot.rows} == {int(stated.group(1))}, plot.png


def test_docstring_examples():
  assert doctest.testmod(rtp).failed == 0
  assert doctest.testmod(ablate_report).failed == 0


def _drawn_figure(monkeypatch, summary, tmp_path):
  """Draws `summary` with plot_final and returns the figure (its closing is intercepted)."""
  plt = ablate_report._pyplot()
  figures = []
  monkeypatch.setattr(plt, "close", figures.append)
  ablate_report.plot_final(summary, str(tmp_path / "bars.png"))
  monkeypatch.undo()  # the caller closes the figure with plt.close
  assert (tmp_path / "bars.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  return figures[0]


def _error_bars(ax):
  from matplotlib.container import ErrorbarContainer

  return [c for c in ax.containers if isinstance(c, ErrorbarContainer)]


def test_bars_have_labelled_axes_n_and_error_bars_only_where_n_is_above_one(monkeypatch, tmp_path):
  pytest.importorskip("matplotlib")
  [demo, _] = rtp.final_plots(SNIPPET)
  fig = _drawn_figure(monkeypatch, rtp.summary_of(demo), tmp_path)
  loss_ax, ratio_ax = fig.axes
  assert loss_ax.get_ylabel().startswith("final eval loss")
  assert ratio_ax.get_ylabel() == "vs FP32 Adam (%)"
  [loss_bars] = _error_bars(loss_ax)
  segments = loss_bars.lines[2][0].get_segments()  # one vertical segment per error bar
  # fp32_adam and the 2-seed row; not the 1-seed row, not the row that did not run
  drawn = [float(v) for s in segments for v in (s[0][0], s[0][1], s[1][1])]
  assert drawn == pytest.approx([0, 2.48, 2.52, 1, 2.55, 2.65])
  assert len(_error_bars(ratio_ax)) == 1
  title = fig._suptitle.get_text()
  assert "Demo sweep" in title and "n = 1-3 seeds per row" in title
  ticks = [t.get_text().replace("\n", " ") for t in ratio_ax.get_xticklabels()]
  assert ticks[:3] == ["fp32_adam (n=3)", "mxfp4 + SR (n=2)", "one_seed (n=1)"]
  ablate_report._pyplot().close(fig)


def test_one_seed_tables_draw_no_error_bar_and_say_so(monkeypatch, tmp_path):
  pytest.importorskip("matplotlib")
  text = RESULTS.read_text()
  plot = next(p for p in rtp.final_plots(text) if p.png.endswith("cpu150_format_final.png"))
  fig = _drawn_figure(monkeypatch, rtp.summary_of(plot), tmp_path)
  assert all(not _error_bars(ax) for ax in fig.axes)
  assert "n = 1 seed per row (no error bar)" in fig._suptitle.get_text()
  assert [t.get_text() for t in fig.axes[1].get_xticklabels()] == [r.label for r in plot.rows]
  ablate_report._pyplot().close(fig)


def test_the_command_writes_the_chosen_pngs(tmp_path):
  pytest.importorskip("matplotlib")
  page = tmp_path / "results.md"
  page.write_text(SNIPPET)
  written = rtp.main(["--results", str(page), "--out", str(tmp_path / "out"),
                      "--only", "mem_final.png"])
  assert written == [str(tmp_path / "out" / "mem_final.png")]
  assert (tmp_path / "out" / "mem_final.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  with pytest.raises(SystemExit):
    rtp.main(["--results", str(page), "--out", str(tmp_path / "out"), "--only", "nope"])


def test_curves_of_more_than_ten_rows_get_distinct_colours(monkeypatch, tmp_path):
  """The default colour cycle repeats after 10 lines: docs/results.md's 12-row optimizer plot
  drew two rows in one blue."""
  pytest.importorskip("matplotlib")
  rows = [{"label": f"row{i}", "n_ok": 1,
           "curve": {"steps": [1, 2], "mean": [3.0 + i, 2.0 + i], "std": [math.nan] * 2}}
          for i in range(13)]
  plt = ablate_report._pyplot()
  figures = []
  monkeypatch.setattr(plt, "close", figures.append)
  ablate_report.plot_curves({"sweep": "demo", "reference": "row0", "rows": rows},
                            str(tmp_path / "curves.png"))
  monkeypatch.undo()
  colors = [tuple(line.get_color()) if not isinstance(line.get_color(), str) else line.get_color()
            for line in figures[0].axes[0].get_lines()]
  assert len(colors) == 13 and len(set(colors)) == 13
  plt.close(figures[0])


def test_every_curve_plot_of_the_results_page_states_its_n():
  """The stored curve plots cannot be redrawn without their runs, so the page says n for them:
  in the image's alt text or in the paragraph right under it."""
  text = RESULTS.read_text()
  images = list(re.finditer(r"!\[(?P<alt>[^\]]*)\]\((?P<png>results/[\w.-]+_curves\.png)\)", text))
  assert len(images) >= 10
  for m in images:
    after = text[m.end():].lstrip("\n").split("\n\n")[0]
    assert re.search(r"\bn = \d", m["alt"] + "\n" + after), m["png"]
