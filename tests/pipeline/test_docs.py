"""Generated docs must not go stale: the README's config reference, docs/ARTIFACTS.md."""
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


def test_artifacts_doc_is_generated_from_the_schema():
    with open(docgen.ARTIFACTS, encoding="utf-8") as f:
        text = f.read()
    assert docgen.artifacts_markdown() == text, "docs/ARTIFACTS.md is stale: run `make docs`"


def test_artifacts_doc_names_every_record_key():
    from components import schema
    text = docgen.artifacts_markdown()
    keys = [k for f in schema.EXAMPLE_FEATURES + schema.ANNOTATION_FEATURES for k in f.keys]
    assert keys and all(f"`{k}`" in text for k in keys)
    assert all(f"`{name}`" in text for name, _ in schema.DEAD_LETTER_FIELDS)
