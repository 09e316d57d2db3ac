"""The README's config reference is generated from the dataclasses and must not go stale."""
import os

from pipeline import docgen


def test_readme_config_reference_is_current():
    with open(docgen.README, encoding="utf-8") as f:
        text = f.read()
    assert docgen.render(text) == text, "README config reference is stale: run `make docs`"


def test_readme_shows_the_two_commands():
    with open(docgen.README, encoding="utf-8") as f:
        head = f.read()[:800]
    assert "make demo" in head and "make test" in head
