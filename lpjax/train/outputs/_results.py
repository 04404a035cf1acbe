"""<workdir>/results.json: written atomically as strict JSON, read back for an "already complete" rerun;
`format_summary`: the plain-text summary train.py prints at the end of a run.

Examples:
  >>> import tempfile
  >>> d = tempfile.mkdtemp()
  >>> write_results(d, {"steps": 2, "final_train_loss": float("nan")})
  {'steps': 2, 'final_train_loss': None}
  >>> read_results(d)
  {'steps': 2, 'final_train_loss': None}
"""

from __future__ import annotations

import json
import math
import os

FILENAME = "results.json"


def _json_number(v):
  """NaN and +-Inf as None (JSON has no token for them); everything else unchanged."""
  if isinstance(v, float) and not math.isfinite(v):
    return None
  return v


def write_results(workdir: str, results: dict) -> dict:
  """Writes `results` (non-finite numbers as null) through a temporary file and a rename."""
  results = {k: _json_number(v) for k, v in results.items()}
  tmp = os.path.join(workdir, FILENAME + ".tmp")
  with open(tmp, "w") as f:
    json.dump(results, f, indent=2, allow_nan=False)
  os.replace(tmp, os.path.join(workdir, FILENAME))
  return results


def read_results(workdir: str) -> dict | None:
  """The saved results, or None when there are none or they do not parse."""
  try:
    with open(os.path.join(workdir, FILENAME)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


# What each file of a workdir holds, for the summary.
WORKDIR_FILES = (
    ("results.json", "these numbers"),
    ("metrics.jsonl", "every logged step (loss, lr, throughput) and each evaluation, one JSON line"),
    ("tensorboard", "the same scalars for TensorBoard"),
    ("checkpoints", "the latest checkpoints: the same command resumes, or says already complete"),
    ("config.json", "the resolved config of the run"),
    ("samples", "the sample grid of each evaluation"),
)


def _number(v) -> str:
  if v is None:
    return "nan"
  if isinstance(v, float):
    return f"{v:.4f}" if abs(v) < 1e4 else f"{v:,.0f}"
  return f"{v:,}" if isinstance(v, int) else str(v)


def _hms(seconds) -> str:
  if not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
    return "?"
  seconds = int(round(seconds))
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


_ENDED = {"finished": "finished", "stopped": "stopped (stop_after)",
          "killed": "killed or crashed (counted up to its last checkpoint)"}


def _segment(s: dict) -> str:
  """One segment of a resumed run: "steps 0 -> 160: 0:07:03 (31.0 s compiling), interrupted by
  SIGINT"."""
  ended = s.get("ended", "?")
  ended = (f"interrupted by {s['signal']}" if ended == "interrupted" and s.get("signal")
           else _ENDED.get(ended, ended))
  return (f"steps {s.get('start_step', '?')} -> {s.get('end_step', '?')}: "
          f"{_hms(s.get('wall_s'))} ({s.get('compile_s', 0) or 0:.1f} s compiling), {ended}")


def format_summary(results: dict, workdir: str, next_commands=()) -> str:
  """The end-of-run summary: what ran and for how long, the final train loss, each evaluation
  metric with the run's quantization beside the same weights in full precision (and their
  difference: what the low-precision recipe costs at evaluation), the workdir's files, and the
  commands to try next (`next_commands`: (command, what it does) pairs). The time is the whole
  run's; a run resumed after a stop or a kill lists its segments (results.json's `segments`).

  Examples:
    >>> r = {"steps": 300, "tokens": 1228800, "final_train_loss": 2.31, "final_eval_loss": 2.2954,
    ...      "final_eval_ppl": 9.929, "final_eval_loss_fp": 2.2901, "final_eval_ppl_fp": 9.876,
    ...      "wall_time_s": 182.4, "compile_time_s": 31.0, "task": "lm", "recipe": "mxfp4",
    ...      "optimizer": "stable_spam", "model": "tiny"}
    >>> text = format_summary(r, "/nonexistent/run")
    >>> print(text.split("Files")[0].strip())
    Finished: 300 steps (1,228,800 tokens) of lm model tiny, recipe mxfp4, optimizer stable_spam,
    in 0:03:02 (of which 31.0 s compiling).
    <BLANKLINE>
      final train loss: 2.3100 (last logged step)
      eval metric    mxfp4        full precision   difference
      loss           2.2954       2.2901           +0.23%
      ppl            9.9290       9.8760           +0.54%
      (full precision: the same weights evaluated with quantization off)
  """
  unit = next((k for k in ("tokens", "images", "examples") if k in results), None)
  amount = f" ({_number(results[unit])} {unit})" if unit else ""
  what = f"{results.get('task', '?')} model {results.get('model', '?')}"
  segments = [s for s in results.get("segments") or () if isinstance(s, dict)]
  lines = [f"Finished: {results.get('steps', '?')} steps{amount} of {what}, recipe "
           f"{results.get('recipe', '?')}, optimizer {results.get('optimizer', '?')},",
           f"in {_hms(results.get('wall_time_s'))} (of which "
           f"{results.get('compile_time_s', 0) or 0:.1f} s compiling)"
           + (f", over {len(segments)} segments:" if len(segments) > 1 else ".")]
  if len(segments) > 1:
    lines += [f"  {_segment(s)}" for s in segments]
  lines.append("")
  if "final_train_loss" in results:
    lines.append(f"  final train loss: {_number(results['final_train_loss'])} (last logged step)")
  pairs = [k[len("final_eval_"):] for k in results
           if k.startswith("final_eval_") and not k.endswith("_fp")]
  if pairs:
    recipe = str(results.get("recipe", "quantized"))
    lines.append(f"  {'eval metric':<14} {recipe:<12} {'full precision':<16} difference")
    for name in pairs:
      q, fp = results[f"final_eval_{name}"], results.get(f"final_eval_{name}_fp")
      diff = ""
      if isinstance(q, (int, float)) and isinstance(fp, (int, float)) and fp:
        diff = f"{100 * (q - fp) / abs(fp):+.2f}%"
      lines.append(f"  {name:<14} {_number(q):<12} {_number(fp) if fp is not None else '-':<16} "
                   f"{diff}".rstrip())
    lines.append("  (full precision: the same weights evaluated with quantization off)")
  if results.get("skipped_steps") or results.get("rollbacks"):
    lines.append(f"  skipped steps: {results.get('skipped_steps', 0)}, rollbacks: "
                 f"{results.get('rollbacks', 0)} (docs/reliability.md)")
  lines += ["", f"Files in {workdir}:"]
  for name, meaning in WORKDIR_FILES:
    if os.path.exists(os.path.join(workdir, name)):
      shown = name + ("/" if os.path.isdir(os.path.join(workdir, name)) else "")
      lines.append(f"  {shown:<15} {meaning}")
  if next_commands:
    lines += ["", "Next:"]
    for command, what in next_commands:
      lines += [f"  # {what}", f"  {command}"]
  return "\n".join(lines) + "\n"
