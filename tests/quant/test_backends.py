"""lpjax.quant's registries (lpjax/quant/backends.py): filled from above, found in any import order.

quant never names lpjax.pallas or lpjax.nn; `import lpjax` declares them as the providers of the
"pallas" kernel backend and the "linen" / "nnx" model adapters. Each import order runs in a fresh
interpreter, since a module once imported stays imported.
"""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from lpjax.quant import backends

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_a_registry_loads_a_declared_provider_on_first_lookup(tmp_path, monkeypatch):
  (tmp_path / "lpjax_demo_provider.py").write_text(
      "from lpjax.quant import backends\nbackends.DEMO.register('x', 42)\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  table = backends.Registry("demo backend")
  monkeypatch.setattr(backends, "DEMO", table, raising=False)
  table.provide("x", "lpjax_demo_provider")
  assert "x" not in table  # nothing imported yet
  assert table["x"] == 42 and "lpjax_demo_provider" in sys.modules


def test_a_registry_names_what_is_missing():
  table = backends.Registry("kernel backend")
  table.register("a", 1)
  table.provide("b", "json")  # importing json registers nothing
  with pytest.raises(LookupError, match="Importing json did not register the kernel backend 'b'"):
    table["b"]
  with pytest.raises(LookupError, match=r"No kernel backend 'c' is registered \(registered: 'a', 'b'\)"):
    table["c"]


def test_lpjax_declares_the_providers_of_quants_registries():
  import lpjax  # noqa: F401
  assert backends.KERNELS.providers == {"pallas": "lpjax.pallas"}
  assert backends.MODEL_ADAPTERS.providers == {"nnx": "lpjax.nn", "linen": "lpjax.nn"}


def _run(code: str):
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout


# What every order must give: the kernel path's bits (impl="pallas", interpret mode on CPU) equal
# to XLA's, and quantize_model wrapping linen and NNX models.
_CHECKS = """
import jax, jax.numpy as jnp
from flax import linen, nnx
from lpjax import quant
x = jax.random.normal(jax.random.key(0), (4, 64))
assert (quant.quantize(x, "mxfp4", impl="pallas").codes == quant.quantize(x, "mxfp4", impl="xla").codes).all()
m = quant.quantize_model(nnx.Linear(64, 8, rngs=nnx.Rngs(0)), "mxfp4_naive")
assert type(m).__name__ == "QuantizedModel" and m(x).shape == (4, 8)
d = quant.quantize_model(linen.Dense(8), "mxfp4_naive")
assert d.apply(d.init(jax.random.key(1), x), x).shape == (4, 8)
try:
  quant.quantize_model(lambda v: v, "mxfp4")
except TypeError as e:
  assert "quantize_model takes a Flax linen or NNX module, got function" in str(e), e
else:
  raise AssertionError("a function was accepted")
print("ok")
"""


@pytest.mark.parametrize("first", ["import lpjax.quant", "import lpjax.pallas", "import lpjax.nn",
                                   "from lpjax.quant import backends", "import lpjax"])
def test_every_import_order_finds_the_kernels_and_adapters(first):
  assert _run(first + "\n" + _CHECKS).strip().endswith("ok")


def test_import_lpjax_quant_loads_neither_flax_nor_the_kernels():
  out = _run("""
      import sys
      import lpjax.quant
      print(sorted({m.split('.')[0] for m in sys.modules} & {'flax'}),
            [m for m in sys.modules if m.startswith(('lpjax.pallas', 'lpjax.nn'))])
      """)
  assert out.strip() == "[] []"
