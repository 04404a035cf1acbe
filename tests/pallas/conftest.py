"""GPU runs of the kernel tests are opt-in: `LPJAX_TEST_GPU=1 pytest tests/pallas`.

The root conftest pins JAX to the CPU (JAX_PLATFORMS=cpu) for the whole suite; this undoes that
for tests/pallas before any backend starts, so the Triton-compiled test classes run on the GPU.
"""

import os

import jax

if os.environ.get("LPJAX_TEST_GPU") == "1":
  jax.config.update("jax_platforms", None)
