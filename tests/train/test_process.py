"""lpjax.train.use_compilation_cache: where JAX's persistent cache goes, and what wins."""

import os

import jax
import pytest

from lpjax.train import use_compilation_cache


@pytest.fixture
def no_cache_dir():
  before = (jax.config.jax_compilation_cache_dir,
            jax.config.jax_persistent_cache_min_compile_time_secs)
  jax.config.update("jax_compilation_cache_dir", None)
  yield
  jax.config.update("jax_compilation_cache_dir", before[0])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])


def test_sets_an_absolute_expanded_directory(no_cache_dir, tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path))
  got = use_compilation_cache(os.path.join("~", "cache"))
  assert got == os.path.join(str(tmp_path), "cache") == jax.config.jax_compilation_cache_dir
  assert jax.config.jax_persistent_cache_min_compile_time_secs == 1.0


def test_empty_turns_it_off_and_a_directory_already_set_wins(no_cache_dir, tmp_path):
  assert use_compilation_cache("") is None and not jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "set_before"))
  assert use_compilation_cache(str(tmp_path / "other")) == str(tmp_path / "set_before")
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "set_before")
