"""The bad-input tables' rows (issue 40): a case, its expected outcome, and the check of one.

Used by tests/reliability/test_bad_inputs_table.py (flags, config, data files, workdirs) and
test_bad_inputs_library.py (lpjax.quant and lpjax.optim calls).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import pytest


class Raises(NamedTuple):
  error: type
  match: str  # a substring of the message


class Holds(NamedTuple):
  what: str  # the property the call returns True for


class Case(NamedTuple):
  group: str
  name: str
  run: Callable  # run(tmp_path) -> the checked value
  expect: Raises | Holds


def check(case: Case, call: Callable):
  """`call()` raises the case's error with its message substring, or returns True."""
  if isinstance(case.expect, Raises):
    with pytest.raises(case.expect.error) as info:
      call()
    assert case.expect.match in str(info.value), str(info.value)
  else:
    assert call() is True, case.expect.what
