"""benchmarks/speed/compile_profile.py: its readers of XLA's pass log and HLO dumps, on the examples
of its docstrings and on what the installed XLA really writes for a small jitted function (the
log's format is XLA's, not ours: a change there must fail here, not print an empty profile)."""

import doctest
import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "speed"))

import compile_profile  # noqa: E402

_PROGRAM = """
import jax, jax.numpy as jnp
def inner(x):
  return jnp.where(x > 0, x * 2.0, -x)
@jax.jit
def probe(x):
  return jax.jit(inner)(x).sum() + jnp.sin(x).sum()
probe(jnp.arange(64.0)).block_until_ready()
"""


def test_the_docstring_examples():
  failed, tried = doctest.testmod(compile_profile)
  assert tried >= 3 and not failed


def test_a_real_xla_log_and_dump_are_read(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="0",
             TF_CPP_VMODULE="hlo_pass_pipeline=1", JAX_ENABLE_COMPILATION_CACHE="false")
  env["XLA_FLAGS"] = (f"--xla_dump_to={tmp_path} --xla_dump_hlo_module_re=.*probe.* "
                      "--xla_dump_hlo_pass_re=call-inliner|fusion")
  proc = subprocess.run([sys.executable, "-c", _PROGRAM], env=env, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  passes = compile_profile.pass_seconds(proc.stderr, module="jit_probe")
  assert {"algsimp", "call-inliner", "fusion"} <= set(passes), sorted(passes)
  assert all(v >= 0 for v in passes.values()) and sum(passes.values()) > 0
  assert "simplification" not in passes  # a pipeline, not counted twice
  assert not compile_profile.pass_seconds(proc.stderr, module="jit_no_such_module")
  inlined = glob.glob(str(tmp_path / "*jit_probe.*after_call-inliner*"))
  unfused = glob.glob(str(tmp_path / "*jit_probe.*.before_fusion.txt"))
  assert inlined and unfused
  text = open(unfused[0]).read()
  n = compile_profile.instructions(text)
  scopes = compile_profile.scope_counts(text)
  assert n == sum(scopes.values()) > 0
  # the nested jit's operations carry its scope (the where), the outer function's own do not
  assert scopes.get("jit(inner)", 0) + scopes.get("jit(inner)/jit(_where)", 0) > 0, scopes
  assert scopes.get("-", 0) > 0, scopes
