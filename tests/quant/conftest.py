"""`arithmetic`: runs a test module on both element paths of lpjax.quant (fast float, integer reference).

The quantizers read the path when they are traced, so each test runs inside the context.
test_oracle_parity.py's random sweeps run on the reference path for a fixed third of their
cases (by a hash of the test id; the fast path runs them all, and the fast path is compared
with the reference bit for bit in test_fast_codec.py): LPJAX_FULL_REFERENCE=1 runs every case.
"""

import contextlib
import os
import zlib

import pytest

from lpjax import quant


@pytest.fixture(params=["fast", "reference"])
def arithmetic(request):
  """Runs the test with the fast element path, then again under `quant.reference_arithmetic()`."""
  context = quant.reference_arithmetic() if request.param == "reference" else contextlib.nullcontext()
  with context:
    yield request.param


_SAMPLED_MODULES = ("test_oracle_parity.py",)


def pytest_collection_modifyitems(config, items):
  del config
  if os.environ.get("LPJAX_FULL_REFERENCE") == "1":
    return
  skip = pytest.mark.skip(reason="reference path sampled (a third of the oracle sweep; "
                                 "LPJAX_FULL_REFERENCE=1 runs all)")
  for item in items:
    if (item.fspath.basename in _SAMPLED_MODULES and "[reference-" in item.nodeid
        and zlib.crc32(item.nodeid.encode()) % 3 != 0):
      item.add_marker(skip)
