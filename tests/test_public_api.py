"""Every package's public API is declared (`__all__`), importable, and listed in docs/api.md."""

import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("quant", "optim", "nn", "data", "eval", "pallas", "train")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_exists_and_is_documented(package):
  module = importlib.import_module(f"lpjax.{package}")
  page = (ROOT / "docs" / "api.md").read_text()
  section = page.split(f"## `lpjax.{package}`")[1].split("\n## ")[0]
  for name in module.__all__:
    assert hasattr(module, name), f"lpjax.{package}.{name} is in __all__ but missing"
    assert f"| `{name}` |" in section, f"lpjax.{package}.{name} is not listed in docs/api.md"
  assert not any(n.startswith("_") for n in module.__all__)


def test_quant_has_no_flax_and_exports_the_policy_route():
  from lpjax import quant
  assert {"QuantPolicy", "get_recipe", "dot_general", "GemmRecipe"} <= set(quant.__all__)
  assert "recipe_override" not in dir(quant) and "PrecisionSchedule" not in dir(quant)
