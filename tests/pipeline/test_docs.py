"""Docs must not go stale: the config reference, docs/ARTIFACTS.md, the README, relative links."""
import os

import pytest

from pipeline import docgen


def test_config_reference_is_current():
    with open(docgen.CONFIGURATION, encoding="utf-8") as f:
        text = f.read()
    assert docgen.render(text) == text, "config reference is stale: run `make docs`"


def test_readme_shows_the_two_commands():
    with open(docgen.README, encoding="utf-8") as f:
        head = f.read()[:800]
    assert "make demo" in head and "make test" in head


def test_artifacts_doc_is_generated_from_the_schema():
    with open(docgen.ARTIFACTS, encoding="utf-8") as f:
        text = f.read()
    assert docgen.artifacts_markdown() == text, "docs/ARTIFACTS.md is stale: run `make docs`"


def test_artifacts_doc_names_every_record_key():
    from components.contract import schema
    text = docgen.artifacts_markdown()
    keys = [k for f in schema.EXAMPLE_FEATURES + schema.ANNOTATION_FEATURES for k in f.keys]
    assert keys and all(f"`{k}`" in text for k in keys)
    assert all(f"`{name}`" in text for name, _ in schema.DEAD_LETTER_FIELDS)


# Keys whose comment names some values and then an open set (any path, any runner name):
# no fixed list to check them against.
OPEN_ENDED = {"encoder.weights", "preprocess.runner"}


def _listed_choices(text: str) -> list[str]:
    """The values a key's meaning lists as `a | b (why) | c: what it does`, in order.

    An optional `qualifier: ` before the first value and a `: explanation`
    after the last are not values; nor are parentheticals. Returns [] when
    the text lists no values.
    """
    import re
    parts = text.replace("\\|", "|").split(" | ")  # `p(y|s,a)` is a formula, not a list
    if len(parts) < 2:
        return []
    cleaned = []
    for part in parts:
        while re.search(r"\([^()]*\)", part):
            part = re.sub(r"\([^()]*\)", "", part)
        cleaned.append(part.strip())
    cleaned[0] = cleaned[0].rsplit(": ", 1)[-1].strip()
    cleaned[-1] = cleaned[-1].split(": ", 1)[0].strip()
    return cleaned


def _reference_rows(markdown: str) -> dict[str, str]:
    """key -> meaning of every row of a config reference table."""
    rows = {}
    for line in markdown.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = line.split(" | ", 3)[3].rstrip(" |")
    return rows


def _docs_reference() -> str:
    with open(docgen.CONFIGURATION, encoding="utf-8") as f:
        text = f.read()
    return text[text.index(docgen.START):text.index(docgen.END)]


def test_listed_choices_reads_every_comment_style():
    assert _listed_choices("synthetic (shapes) | scenes | tfds") == ["synthetic", "scenes", "tfds"]
    assert _listed_choices("hard: sequence (paper: log p(y|s,a) per sample) | token (x)") == [
        "sequence", "token"]
    assert _listed_choices("auto | true | false: keep parsed records in memory") == [
        "auto", "true", "false"]
    assert _listed_choices("auto \\| float32") == ["auto", "float32"]
    assert _listed_choices("steps between TensorBoard scalar summaries") == []


def test_every_comment_that_lists_values_lists_exactly_the_validated_choices():
    from components.contract.config import CHOICES, describe_fields
    comments = {key: comment for key, _, _, comment in describe_fields()}
    assert set(CHOICES) <= set(comments)
    for key, comment in comments.items():
        listed = _listed_choices(comment)
        if key in CHOICES:
            assert listed == list(CHOICES[key]), (key, comment)
        elif key not in OPEN_ENDED:
            # A fixed list the validator does not know: add the key to CHOICES.
            assert listed == [], (key, comment)


@pytest.mark.parametrize("where", ["generated", "docs"])
def test_the_config_reference_lists_exactly_the_validated_choices(where):
    from components.contract.config import CHOICES
    from pipeline.cli import config_reference_markdown
    rows = _reference_rows(config_reference_markdown() if where == "generated"
                           else _docs_reference())
    assert set(CHOICES) <= set(rows), sorted(set(CHOICES) - set(rows))
    for key, choices in CHOICES.items():
        assert _listed_choices(rows[key]) == list(choices), (key, rows[key])


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    import re
    anchors = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_readme_and_docs_relative_links_resolve():
    import glob
    import re
    root = os.path.dirname(docgen.README)
    pages = [docgen.README] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    broken = []
    for page in pages:
        with open(page, encoding="utf-8") as f:
            text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(resolved):
                broken.append(f"{os.path.relpath(page, root)}: {target}")
            elif anchor and resolved.endswith(".md"):
                with open(resolved, encoding="utf-8") as f:
                    if anchor not in _anchors(f.read()):
                        broken.append(f"{os.path.relpath(page, root)}: {target} (no such heading)")
    assert not broken, broken


def test_performance_doc_stays_readable():
    # Superseded figures go to benchmarks/results/README.md, not here.
    path = os.path.join(os.path.dirname(docgen.README), "docs", "PERFORMANCE.md")
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= 500, f"docs/PERFORMANCE.md has {len(lines)} lines (at most 500)"
