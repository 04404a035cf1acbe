"""Runs the docstring examples of every lpjax module (they are part of the documentation)."""

import doctest
import importlib
import pkgutil

import pytest

import lpjax


def _modules():
  names = []
  for info in pkgutil.walk_packages(lpjax.__path__, prefix="lpjax."):
    names.append(info.name)
  return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
  module = importlib.import_module(name)
  result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
