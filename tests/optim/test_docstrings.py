"""The Examples blocks of every lpjax.optim docstring run and give what they show."""

import doctest
import importlib

import pytest

MODULES = ["lpjax.optim", "lpjax.optim._stable_spam", "lpjax.optim._spam",
           "lpjax.optim._loss_scale", "lpjax.optim._low_precision_state"]


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples(module):
  result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
  assert result.attempted > 0
  assert result.failed == 0
