"""Bytes moved by the collectives of a compiled XLA program, per execution, from its HLO text.

Each collective's bytes are its result's (an all-gather's result is the gathered array each device
ends up with) times how often it runs: the product of the known trip counts of the while loops
around it (XLA annotates `known_trip_count`; a loop without one counts once and is reported).

Examples:
  >>> hlo = '''
  ... %body (p: (s32[], u8[4])) -> (s32[], u8[4]) {
  ...   %ag = u8[64,32]{1,0} all-gather(%x), replica_groups={}, dimensions={0}
  ... }
  ... ENTRY %main (a: f32[2]) -> f32[2] {
  ...   %w = (s32[], u8[4]) while(%t), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"24"}}
  ...   %g = bf16[128,16]{1,0} all-gather(%y), dimensions={0}
  ... }'''
  >>> sorted(collective_bytes(hlo, "all-gather").items())
  [('bf16', 4096), ('u8', 49152)]
"""

from __future__ import annotations

import collections
import re

_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->.*\{\s*$")
_CALLEE = re.compile(r"(?:condition|body|calls|to_apply)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_ARRAY = re.compile(r"\b(pred|[a-z]+\d+)\[([\d,]*)\]")
_BITS = {"pred": 8}


def _computations(hlo: str):
  """{name: [instruction lines]} and the name of the entry computation."""
  comps, entry, current = {}, None, None
  for line in hlo.splitlines():
    m = _COMPUTATION.match(line.strip())
    if m and line.rstrip().endswith("{"):
      current = m.group(1)
      comps[current] = []
      if line.lstrip().startswith("ENTRY"):
        entry = current
    elif current is not None and line.strip() == "}":
      current = None
    elif current is not None:
      comps[current].append(line)
  return comps, entry


def _multipliers(comps, entry):
  """How many times each computation runs per execution of the entry (known trip counts)."""
  edges = collections.defaultdict(list)  # caller -> [(callee, runs per caller run)]
  callers = collections.Counter()
  for name, lines in comps.items():
    for line in lines:
      trip = _TRIP.search(line)
      n = int(trip.group(1)) if (trip and " while(" in line) else 1
      callees = _CALLEE.findall(line)
      for group in _BRANCHES.findall(line):
        callees += [c.strip().lstrip("%") for c in group.split(",")]
      for callee in callees:
        if callee in comps:
          edges[name].append((callee, n))
          callers[callee] += 1
  mult = collections.Counter({entry: 1})
  ready = [c for c in comps if not callers[c]]
  while ready:  # topological order: a computation's count is final before it passes it on
    name = ready.pop()
    for callee, n in edges[name]:
      mult[callee] += mult[name] * n
      callers[callee] -= 1
      if not callers[callee]:
        ready.append(callee)
  return mult


def _arrays(result_type: str):
  """(dtype, bytes) of each array in an HLO result type (a tuple lists several)."""
  out = []
  for dtype, dims in _ARRAY.findall(result_type):
    bits = _BITS.get(dtype) or int(re.sub(r"\D", "", dtype) or 8)
    count = 1
    for d in filter(None, dims.split(",")):
      count *= int(d)
    out.append((dtype, count * bits // 8))
  return out


def collective_bytes(hlo: str, op: str = "all-gather") -> dict[str, int]:
  """{element dtype: bytes per execution} of the `op` collectives (sync or async start) in `hlo`."""
  comps, entry = _computations(hlo)
  if entry is None:
    raise ValueError("No ENTRY computation in this HLO text.")
  mult = _multipliers(comps, entry)
  out = collections.Counter()
  pattern = re.compile(rf"=\s*(.*?)\s+{re.escape(op)}(-start)?\(")
  for name, lines in comps.items():
    for line in lines:
      m = pattern.search(line)
      if not m:
        continue
      arrays = _arrays(m.group(1))
      if m.group(2):  # an async start's result is (operand, result[, context]): count the result
        arrays = arrays[1:2]
      for dtype, nbytes in arrays:
        out[dtype] += nbytes * mult[name]
  return dict(out)
