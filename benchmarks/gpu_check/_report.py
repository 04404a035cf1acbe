"""The check's result: one JSON-able dict, the summary table printed last, the Markdown report."""

from __future__ import annotations

import re

GOALS = {  # issue 38, printed beside the figures they judge
    "exactness": "100% of cases bit-identical",
    "rtn_of_copy": "Pallas RTN quantize >= 70% of copy bandwidth",
    "sr_of_copy": "Pallas SR quantize >= 60% of copy bandwidth",
    "mxfp4_step": "MXFP4 step <= 1.3x bf16 (Pallas quantizers)",
    "total": "whole check <= 600 s on one H100/H200; dry run <= 120 s on 2 CPU cores",
}


def summarize(results: list[dict], *, dry_run: bool, seconds: float) -> dict:
  """The whole check as one dict (written as JSON): the stages' results and the headline facts."""
  env = next((r.get("info", {}) for r in results if r.get("stage") == "env"), {})
  passed = all(r.get("status") == "pass" for r in results)
  return dict(dry_run=dry_run, seconds=seconds, passed=passed, device=env.get("device_kind"),
              platform=env.get("platform"), env=env, goals=GOALS, stages=results)


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
  verdict = "PASSED" if check["passed"] else "FAILED"
  head = (f"lpjax GPU check{kind} on {check.get('device') or '?'}: {verdict} in "
          f"{check['seconds']:.0f} s (goal {'<= 120 s' if dry else '<= 600 s'})")
  lines = [head, "", "| stage | status | s / limit | figures (goal) |", "|---|---|---|---|"]
  for r in check["stages"]:
    figures = "; ".join(format_figure(f, dry) for f in r.get("figures", []))
    checks = r.get("checks", {})
    if checks.get("passed") or checks.get("failed"):
      figures = f"{checks['passed']}/{checks['passed'] + checks['failed']} checks ok" + (
          f"; {figures}" if figures else "")
    if r.get("error"):
      figures = f"{figures}; {r['error']}" if figures else r["error"]
    if r.get("cut_short"):
      figures += f"; {len(r['cut_short'])} case(s) not run (time limit)"
    lines.append(f"| {r['letter']} {r.get('title', r.get('stage'))} | {r['status']} | "
                 f"{r.get('seconds', 0):.1f} / {r.get('limit_s', 0):.0f} | {figures or '-'} |")
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
  """The report for docs/results/gpu/<gpu-model>.md."""
  env = check.get("env", {})
  title = check.get("device") or "unknown device"
  lines = [f"# lpjax GPU check: {title}{' (dry run)' if check['dry_run'] else ''}", ""]
  if check["dry_run"]:
    lines += ["A **dry run**: every stage on the CPU with tiny sizes and interpret-mode Pallas "
              "kernels. It shows that the check runs; its timings and bandwidths are **not GPU "
              "figures**, and the goals are not judged.", ""]
  lines += ["Written by `python -m benchmarks.gpu_check` (`make gpu-check`). Goals (issue 38): "
            + "; ".join(check["goals"].values()) + ".", ""]
  if env:
    lines += ["## Environment", ""] + [f"- {k}: {v}" for k, v in env.items()] + [""]
  lines += ["## Summary", "", summary_table(check), ""]
  for r in check["stages"]:
    lines += [f"## {r['letter']}. {r.get('title', r.get('stage'))}: {r['status']}", ""]
    if r.get("error"):
      lines += [f"Error: {r['error']}", ""]
    for fig in r.get("figures", []):
      lines.append(f"- {format_figure(fig, check['dry_run'])}")
    if r.get("figures"):
      lines.append("")
    for name, rows in r.get("tables", {}).items():
      lines += [f"### {name}", ""] + _table(rows) + [""]
    for failure in r.get("failures", [])[:50]:
      lines.append(f"- FAILED {failure['name']}: {failure['detail']}")
    for note in r.get("notes", []):
      lines.append(f"- {note}")
    if r.get("cut_short"):
      lines.append("- Not run (stage time limit): " + ", ".join(r["cut_short"]))
    lines.append("")
  return "\n".join(lines).rstrip() + "\n"
