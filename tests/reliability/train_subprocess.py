"""train.py in a child process, for the kill-and-resume tests: CPU only, one device, a shared
persistent compilation cache (so a restarted run does not compile again), output piped."""

import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(REPO, "configs", "llama_tiny_mxfp4.py")


def suite_cache_dir() -> str:
  """The suite's compile cache folder (tests/conftest.py exports it as LPJAX_TEST_CACHE_DIR)."""
  return (os.environ.get("LPJAX_TEST_CACHE_DIR")
          or os.path.join(tempfile.gettempdir(), "lpjax_jax_cache"))


def train_env(*extra_paths: str) -> dict:
  """The child's environment; `extra_paths` go on PYTHONPATH after the repository."""
  env = dict(os.environ)
  env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="", PYTHONPATH=os.pathsep.join([REPO, *extra_paths]),
             JAX_COMPILATION_CACHE_DIR=suite_cache_dir(),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  return env


def start_train(workdir: str, flags, *extra_paths: str) -> subprocess.Popen:
  """`python train.py --config=<llama_tiny_mxfp4> --workdir=workdir *flags`, started."""
  cmd = [sys.executable, os.path.join(REPO, "train.py"), f"--config={CONFIG}",
         f"--workdir={workdir}", *flags]
  return subprocess.Popen(cmd, cwd=REPO, env=train_env(*extra_paths), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
