"""The README's first screen says what lpjax is and where it stands: headline numbers that are
docs/results.md's own, each linked to a section that exists; the GPU status; the peers; the two
commands. Then training, monitoring and your own model, the GPU check later; every notebook
listed; docs/api.md linked."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FIRST_SCREEN = "\n".join(README.splitlines()[:70])


def _slug(heading: str) -> str:
  """GitHub's anchor of a Markdown heading."""
  text = heading.strip().lower()
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def _anchors(path: pathlib.Path) -> set:
  return {_slug(m.group(1)) for m in re.finditer(r"(?m)^#+ (.*)$", path.read_text())}


def test_links_into_docs_resolve_to_a_heading():
  for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
    for target, anchor in re.findall(r"\]\(([^)#\s]*\.md)#([^)\s]+)\)", md.read_text()):
      page = (md.parent / target).resolve()
      assert anchor in _anchors(page), f"{md.name}: {target}#{anchor} has no such heading"
  for page in (ROOT / "README.md", ROOT / "docs" / "results.md"):
    for anchor in re.findall(r"\]\(#([^)\s]+)\)", page.read_text()):
      assert anchor in _anchors(page), f"{page.name}: #{anchor}"


def test_the_first_screen_has_the_headline_numbers_linked_to_results():
  stands = FIRST_SCREEN.split("**Where it stands**")[1].split("**GPU status")[0]
  bullets = [b for b in stands.split("\n- ")[1:]]
  assert 3 <= len(bullets) <= 5
  results = (ROOT / "docs" / "results.md").read_text()
  for bullet in bullets:
    links = re.findall(r"\]\(([^)]+)\)", bullet)
    assert links, bullet
    for number in re.findall(r"[+-]?\d+\.\d+%?", bullet):
      assert number in results, f"{number} is not a number of docs/results.md"


def test_the_first_screen_has_gpu_status_peers_papers_and_the_two_commands():
  assert "GPU status: no GPU figure exists yet" in FIRST_SCREEN
  for peer in ("TransformerEngine", "torchao", "Qwix", "AQT", "microxcaling"):
    assert f"[{peer}](https://github.com/" in FIRST_SCREEN
  assert FIRST_SCREEN.count("https://arxiv.org/abs/") >= 5
  assert re.search(r"(?m)^make train\s", FIRST_SCREEN) and re.search(r"(?m)^make test\s",
                                                                     FIRST_SCREEN)


def test_sections_come_in_a_newcomers_order():
  order = [m.group(1) for m in re.finditer(r"(?m)^## (.*)$", README)]
  at = order.index
  assert at("Quickstart") < at("Training") < at("Looking at a run") < at("Your own model")
  assert at("Your own model") < at("On a GPU machine that already has JAX")


def test_every_notebook_is_listed_with_colab_and_local_instructions():
  for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
    assert f"](notebooks/{nb.name})" in README, nb.name
    assert f"colab.research.google.com/github/lpjax/lpjax/blob/main/notebooks/{nb.name}" in README
  assert "jupyter lab notebooks/" in README


def test_the_api_reference_is_linked():
  assert "](docs/api.md)" in README
