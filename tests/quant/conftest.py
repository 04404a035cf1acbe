"""`arithmetic`: runs a test module on both element paths of lpjax.quant (fast float, integer reference).

The quantizers read the path when they are traced, so each test runs inside the context.
"""

import contextlib

import pytest

from lpjax import quant


@pytest.fixture(params=["fast", "reference"])
def arithmetic(request):
  """Runs the test with the fast element path, then again under `quant.reference_arithmetic()`."""
  context = quant.reference_arithmetic() if request.param == "reference" else contextlib.nullcontext()
  with context:
    yield request.param
