"""The registries that packages above lpjax.quant fill: kernel backends and model adapters.

lpjax.quant imports nothing of lpjax above it, not even by name. Where it can hand work to a
higher package, it owns a table here, and the higher package registers itself into it:

- `KERNELS`: kernel implementations by name. `lpjax.pallas` registers "pallas" (an object with
  `unsupported(fmt)`, `check_supported(fmt)`, `quantize` / `dequantize` / `fake_quant`, and the
  FP4 GEMM's `fp4_matmul`, `fp4_gemm_reason`, `fp4_gemm_compatible`). `quantize(..., impl=...)`
  (`codec.qarray`) and the GEMM's kernel dispatch (`gemm.kernel_dispatch`) look it up.
- `MODEL_ADAPTERS`: how `quantize_model` wraps a model of some framework. `lpjax.nn` registers
  "linen" and "nnx": functions `adapter(model, policy, **kwargs)` that return the wrapped model,
  or `NotImplemented` for a model that is not theirs.

Who fills a table is declared once, at `import lpjax` (lpjax/__init__.py, the top of the package):
`KERNELS.provide("pallas", "<the package>")` names the module to import the first time the entry
is needed, so `import lpjax.quant` loads neither Flax nor the Pallas kernels, and every import
order works (`import lpjax.pallas` first registers at once; a later lookup finds it).

Examples:
  >>> from lpjax.quant import backends
  >>> table = backends.Registry("demo backend")
  >>> table.register("fast", "the fast one")
  >>> table["fast"], "slow" in table
  ('the fast one', False)
  >>> table["slow"]
  Traceback (most recent call last):
  ...
  LookupError: No demo backend 'slow' is registered (registered: 'fast').
"""

from __future__ import annotations

import importlib


class Registry(dict):
  """A name -> entry table whose missing entries are loaded from their declared provider module.

  It is a dict (tests may `monkeypatch.setitem` an entry); `table[name]` imports the provider
  declared for `name` when the entry is not registered yet, and `load_all()` imports every
  provider (for lookups that try each entry, as `quantize_model` does).
  """

  def __init__(self, what: str):
    super().__init__()
    self.what = what  # what an entry is, for error messages ("kernel backend")
    self.providers: dict[str, str] = {}  # entry name -> module whose import registers it

  def register(self, name: str, entry) -> None:
    """Registers `entry` under `name` (a later registration replaces an earlier one)."""
    self[name] = entry

  def provide(self, name: str, module: str) -> None:
    """Declares that importing `module` registers the entry `name`."""
    self.providers[name] = module

  def load_all(self) -> None:
    """Imports every declared provider whose entry is not registered yet."""
    for name, module in list(self.providers.items()):
      if name not in self:
        importlib.import_module(module)

  def __missing__(self, name):
    module = self.providers.get(name)
    if module is not None:
      importlib.import_module(module)  # registers itself on import
      if dict.__contains__(self, name):
        return dict.__getitem__(self, name)
      raise LookupError(f"Importing {module} did not register the {self.what} {name!r}.")
    have = ", ".join(map(repr, sorted(set(self) | set(self.providers)))) or "none"
    raise LookupError(f"No {self.what} {name!r} is registered (registered: {have}).")


KERNELS = Registry("kernel backend")
MODEL_ADAPTERS = Registry("model adapter")
