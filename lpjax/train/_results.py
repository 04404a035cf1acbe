"""<workdir>/results.json: written atomically as strict JSON, read back for an "already complete" rerun.

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
