"""lpjax.train.loop._process: where JAX's persistent cache goes (and what wins); the CPU allocator hint."""

import os

import jax
import pytest

from lpjax.train import use_compilation_cache
from lpjax.train.loop._process import HUGEPAGE_TUNABLE, cpu_allocator_hint


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


# --- cpu_allocator_hint: when the glibc huge-page tunable is suggested -------------------------

GLIBC = ("glibc", "2.36")


@pytest.fixture
def thp(tmp_path):
  """A stand-in for /sys/kernel/mm/transparent_hugepage/enabled with the given mode selected."""
  def write(selected):
    path = tmp_path / "enabled"
    path.write_text(" ".join(f"[{m}]" if m == selected else m for m in ("always", "madvise", "never")) + "\n")
    return str(path)
  return write


def test_hint_names_the_tunable_where_huge_pages_are_madvise_only(thp):
  hint = cpu_allocator_hint(environ={}, thp_mode_file=thp("madvise"), libc=GLIBC)
  assert hint is not None and f"GLIBC_TUNABLES={HUGEPAGE_TUNABLE}" in hint
  # Other tunables in the variable do not count as this one.
  other = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
  assert cpu_allocator_hint(environ=other, thp_mode_file=thp("madvise"), libc=GLIBC) == hint


@pytest.mark.parametrize("environ, mode, libc", [
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}, "madvise", GLIBC),
    ({}, "always", GLIBC),  # huge pages already
    ({}, "never", GLIBC),  # the tunable would do nothing
    ({}, "madvise", ("glibc", "2.34")),  # no such tunable before 2.35
    ({}, "madvise", ("", "")),  # not glibc (musl, macOS)
])
def test_no_hint_where_it_would_not_help(thp, environ, mode, libc):
  assert cpu_allocator_hint(environ=environ, thp_mode_file=thp(mode), libc=libc) is None


def test_no_hint_without_the_kernel_file(tmp_path):
  assert cpu_allocator_hint(environ={}, thp_mode_file=str(tmp_path / "absent"), libc=GLIBC) is None
