"""Test setup: 8 virtual CPU devices and a persistent compile cache, before jax is imported."""

import os
import tempfile

import pytest

os.environ["JAX_PLATFORMS"] = "cpu"
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402  (must come after the environment above)

# LPJAX_TEST_CACHE_DIR overrides the cache folder (benchmarks/speed/speed_report.py --suite: a cold run).
_CACHE_DIR = (os.environ.get("LPJAX_TEST_CACHE_DIR")
              or os.path.join(tempfile.gettempdir(), "lpjax_jax_cache"))
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
# Child processes (train.py runs, notebooks) read the same folder from here, so a cold run
# (LPJAX_TEST_CACHE_DIR set to an empty folder) is cold for them too. JAX_COMPILATION_CACHE_DIR
# gives it to every child whose test does not set another (a train.py run, `python -m
# lpjax.advise`, a benchmark): a child compiling what another test already compiled with the same
# device count loads it, and no test writes into the user's ~/.cache/lpjax (train.py's default).
os.environ["LPJAX_TEST_CACHE_DIR"] = _CACHE_DIR
os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE_DIR
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# The pinned stack's jax (requirements.txt); a newer one is the current stack (requirements-py312.txt).
PINNED_JAX = (0, 10)


def pytest_configure(config):
  """On the current stack, a DeprecationWarning that lpjax's own code triggers (a deprecated JAX,
  Flax or NumPy API that it calls) fails the test: the next release removes that API."""
  if tuple(int(p) for p in jax.__version__.split(".")[:2]) > PINNED_JAX:
    config.addinivalue_line("filterwarnings", "error::DeprecationWarning:lpjax")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
  """`--dist loadfile` starts the slowest files first (tests/xdist_order.py); other modes as xdist."""
  if config.getoption("dist", None) != "loadfile":
    return None
  from xdist.scheduler import LoadFileScheduling  # noqa: PLC0415  (only under xdist)
  import xdist_order  # noqa: PLC0415  (tests/ is on the path: conftest's folder)
  return xdist_order.make_scheduler(LoadFileScheduling)(config, log)
