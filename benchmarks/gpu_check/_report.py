"""The check's result: one JSON-able dict, the summary table printed last, the Markdown report."""

from __future__ import annotations

import re

GOALS = {  # issue 38, printed beside the figures they judge
    "exactness": "100% of cases bit-identical",
    "rtn_of_copy": "Pallas RTN quantize >= 70% of copy bandwidth",
    "sr_of_copy": "Pallas SR quantize >= 60% of copy bandwidth",
    "mxfp4_step": "MXFP4 step <= 1.3x bf16 (Pallas quantizers)",
    "total": ("whole check <= 540 s on one H100/H200 (one 600 s call); dry run <= 120 s on 2 CPU "
              "cores"),
}


def summarize(results: list[dict], *, dry_run: bool, seconds: float,
              total_limit_s: float | None = None, plan: str | None = None,
              finished: bool = True) -> dict:
  """The whole check as one dict (written as JSON): the stages' results (listed a-g, whatever the
  order they ran in) and the headline facts. `finished` is False while the run goes on (and in a
  report left by a run that was killed): the report then says it is partial."""
  env = next((r.get("info", {}) for r in results if r.get("stage") == "env"), {})
  stages = sorted(results, key=lambda r: r.get("letter", "~"))
  skipped = skipped_for_time(stages)
  # Passed: every stage ran every case and passed (a check cut short by time has not passed).
  passed = finished and not skipped and all(r.get("status") == "pass" for r in stages)
  return dict(dry_run=dry_run, seconds=seconds, passed=passed, finished=finished,
              total_limit_s=total_limit_s, plan=plan, device=env.get("device_kind"),
              platform=env.get("platform"), env=env, goals=GOALS, stages=stages,
              skipped_for_time=skipped)


def skipped_for_time(stages: list[dict]) -> list[str]:
  """What time cut out: stages not started for lack of time, stages killed at their limit, and
  the cases a stage did not start before its deadline.

  Examples:
    >>> for line in skipped_for_time([
    ...     dict(letter="f", status="not run", error="skipped for time: 2 s left"),
    ...     dict(letter="d", status="fail", killed=True, cut_short=["256M"])]):
    ...   print(line)
    stage f: not run (skipped for time: 2 s left)
    stage d: killed at its time limit
    stage d: 256M
  """
  out = []
  for r in stages:
    if r.get("status") == "not run":
      out.append(f"stage {r['letter']}: not run ({r.get('error') or 'time limit'})")
    if r.get("killed"):
      out.append(f"stage {r['letter']}: killed at its time limit")
    out += [f"stage {r['letter']}: {what}" for what in r.get("cut_short", [])]
  return out


def file_stem(check: dict) -> str:
  """docs/results/gpu/<this>.md: the GPU model in lower case, e.g. 'nvidia-h200'.

  Examples:
    >>> file_stem(dict(device="NVIDIA H200", dry_run=False))
    'nvidia-h200'
    >>> file_stem(dict(device="cpu", dry_run=True))
    'dry-run-cpu'
  """
  name = re.sub(r"[^a-z0-9]+", "-", (check.get("device") or "unknown-device").lower()).strip("-")
  return f"dry-run-{name}" if check.get("dry_run") else name


def format_figure(fig: dict, dry_run: bool) -> str:
  """'name value unit (goal: ..., met)'.

  Examples:
    >>> format_figure(dict(name="RTN", value=0.812, unit="of copy", goal=">= 70%", met=True), False)
    'RTN 0.812 of copy (goal >= 70%: met)'
    >>> format_figure(dict(name="RTN", value=0.1, unit="", goal=">= 70%", met=False), True)
    'RTN 0.1 (goal >= 70%: not judged, dry run)'
  """
  value = fig.get("value")
  text = f"{value:.3g}" if isinstance(value, float) else ("not measured" if value is None
                                                           else str(value))
  out = f"{fig['name']} {text}" + (f" {fig['unit']}" if fig.get("unit") and value is not None
                                    else "")
  if fig.get("goal"):
    verdict = ("not judged, dry run" if dry_run else
               {True: "met", False: "MISSED", None: "not judged"}[fig.get("met")])
    out += f" (goal {fig['goal']}: {verdict})"
  return out


def summary_table(check: dict) -> str:
  """The table printed last: one row per stage with its status, time and headline figures."""
  dry = check["dry_run"]
  kind = (" (DRY RUN: CPU, tiny sizes, interpret-mode kernels; figures are not GPU figures)"
          if dry else "")
  failed = any(r.get("status") == "fail" and not r.get("killed") for r in check["stages"])
  skipped = len(check.get("skipped_for_time", []))
  verdict = ("PARTIAL (running, or the run was cut off)" if not check.get("finished", True) else
             "PASSED" if check["passed"] else "FAILED" if failed else
             f"INCOMPLETE ({skipped} skipped for time, nothing failed)")
  total = check.get("total_limit_s")
  head = (f"lpjax GPU check{kind} on {check.get('device') or '?'}: {verdict} in "
          f"{check['seconds']:.0f} s (limit {total:.0f} s)" if total else
          f"lpjax GPU check{kind} on {check.get('device') or '?'}: {verdict} in "
          f"{check['seconds']:.0f} s")
  lines = [head, "", "| stage | status | s / limit (compile, run) | figures (goal) |",
           "|---|---|---|---|"]
  for r in check["stages"]:
    parts = [format_figure(f, dry) for f in r.get("figures", [])]
    checks = r.get("checks", {})
    if checks.get("passed") or checks.get("failed"):
      parts.insert(0, f"{checks['passed']}/{checks['passed'] + checks['failed']} checks ok")
    if r.get("error"):
      parts.append(r["error"])
    if r.get("cut_short"):
      parts.append(f"{len(r['cut_short'])} case(s) not run (time limit)")
    figures = "; ".join(parts)
    split = (f" ({r.get('compile_s', 0):.0f}, {r.get('run_s', 0):.0f})"
             if r.get("compile_s") or r.get("run_s") else "")
    lines.append(f"| {r['letter']} {r.get('title', r.get('stage'))} | {r['status']} | "
                 f"{r.get('seconds', 0):.1f} / {r.get('limit_s', 0):.0f}{split} | "
                 f"{figures or '-'} |")
  return "\n".join(lines)


def _table(rows: list[dict]) -> list[str]:
  columns = list(dict.fromkeys(k for row in rows for k in row))
  out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  for row in rows:
    out.append("| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |")
  return out


def _cell(value) -> str:
  if value is None:
    return "-"  # not measured here (e.g. device memory statistics on a CPU)
  if isinstance(value, bool):
    return "yes" if value else "NO"
  if isinstance(value, float):
    return f"{value:.4g}"
  return str(value).replace("|", "/")


def markdown(check: dict) -> str:
  """The report (the OUT folder's report.md; commit it as docs/results/gpu/<gpu-model>.md)."""
  env = check.get("env", {})
  title = check.get("device") or "unknown device"
  lines = [f"# lpjax GPU check: {title}{' (dry run)' if check['dry_run'] else ''}", ""]
  if not check.get("finished", True):
    order = check.get("plan") or "abcdefg"
    by = {r["letter"]: r.get("status") for r in check["stages"]}
    running = [x for x in order if by.get(x) in ("running", "interrupted")]
    waiting = [x for x in order if by.get(x) == "not started"]
    lines += [f"**PARTIAL REPORT**: written while the check ran (rewritten as each case is "
              f"recorded); if it still says so, the run was cut off. Running: "
              f"{', '.join(running) or 'none'}. Not started: {', '.join(waiting) or 'none'}.", ""]
  if check["dry_run"]:
    lines += ["A **dry run**: every stage on the CPU with tiny sizes and interpret-mode Pallas "
              "kernels. It shows that the check runs; its timings and bandwidths are **not GPU "
              "figures**, and the goals are not judged.", ""]
  lines += ["Written by `python -m benchmarks.gpu_check` (`make gpu-check`). Goals: "
            + "; ".join(check["goals"].values()) + ".", ""]
  if check.get("plan"):
    lines += [f"Plan: stages in the order {', '.join(check['plan'])} within "
              f"{check.get('total_limit_s') or 0:.0f} s; each stage's time is split into compile "
              "(trace, lower, compile, first-run Triton compiles) and run.", ""]
  if env:
    lines += ["## Environment", ""] + [f"- {k}: {v}" for k, v in env.items()] + [""]
  lines += ["## Summary", "", summary_table(check), ""]
  lines += ["## Skipped for time", ""] + ([f"- {s}" for s in check.get("skipped_for_time", [])]
                                         or ["- nothing"]) + [""]
  for r in check["stages"]:
    lines += [f"## {r['letter']}. {r.get('title', r.get('stage'))}: {r['status']}", ""]
    if r.get("error"):
      lines += [f"Error: {r['error']}", ""]
    if r.get("compile_s") or r.get("run_s"):
      lines += [f"Time: {r.get('seconds', 0):.1f} s of {r.get('limit_s', 0):.0f} s; compile "
                f"{r.get('compile_s', 0):.1f} s, run {r.get('run_s', 0):.1f} s (the rest: "
                "process start, imports, data).", ""]
    for fig in r.get("figures", []):
      lines.append(f"- {format_figure(fig, check['dry_run'])}")
    if r.get("figures"):
      lines.append("")
    for name, rows in r.get("tables", {}).items():
      lines += [f"### {name}", ""] + _table(rows) + [""]
    for failure in r.get("failures", [])[:50]:
      lines.append(f"- FAILED {failure['name']}: {failure['detail']}")
    if len(r.get("failures", [])) > 50:
      lines.append(f"- ... and {len(r['failures']) - 50} more failures (the stage's JSON)")
    if r.get("passed_checks"):
      lines.append(f"- Passed ({len(r['passed_checks'])}): " + "; ".join(r["passed_checks"]))
    for note in r.get("notes", []):
      lines.append(f"- {note}")
    if r.get("cut_short"):
      lines.append("- Not run (stage time limit): " + ", ".join(r["cut_short"]))
    lines.append("")
  return "\n".join(lines).rstrip() + "\n"


def write(out: str, check: dict, report: str | None = None) -> tuple[str, str]:
  """Writes `<out>/<file_stem>.json` and the Markdown report (default `<out>/report.md`), each
  atomically (a reader, or a run killed while writing, never leaves half a file). Returns the
  two paths."""
  import json
  import os
  os.makedirs(out, exist_ok=True)
  json_path = os.path.join(out, file_stem(check) + ".json")
  report = report or os.path.join(out, "report.md")
  os.makedirs(os.path.dirname(os.path.abspath(report)), exist_ok=True)
  for path, text in ((json_path, json.dumps(check, indent=1, default=str)),
                     (report, markdown(check))):
    with open(path + ".tmp", "w") as f:
      f.write(text)
    os.replace(path + ".tmp", path)
  return json_path, report
