"""Import closures: what keys a stage's cache, read from the source."""
import os
import shutil

from pipeline import imports


def _rel(paths):
    return {os.path.relpath(p, imports.PACKAGE_ROOT) for p in paths}


def test_evaluator_closure_has_what_it_really_imports():
    files = _rel(imports.import_closure("components.evaluator").values())
    # Through the grounding metric and the figures module.
    assert "components/sources/shapes_grammar.py" in files
    assert "serving/attention_figure.py" in files
    assert "models/decoding.py" in files          # imported inside a function
    assert "components/__init__.py" in files      # packages run their __init__ first
    assert "components/trainer.py" not in files   # stages never import each other
    assert not any(f.startswith("pipeline/") for f in files)


def test_relative_and_from_imports_resolve(tmp_path):
    pkg = tmp_path / "relpkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import leaf\n")
    (pkg / "sub" / "leaf.py").write_text("from ..top import X\n")
    (pkg / "top.py").write_text("X = 1\nimport json\n")
    (pkg / "stage.py").write_text("def run(ctx):\n    from relpkg.sub import leaf\n")
    found = imports.import_closure("relpkg.stage", root=str(tmp_path))
    assert set(found) == {"relpkg", "relpkg.stage", "relpkg.sub", "relpkg.sub.leaf",
                          "relpkg.top"}


def test_editing_an_imported_file_changes_only_the_stages_that_import_it(tmp_path):
    for package in imports.PROJECT_PACKAGES:
        shutil.copytree(os.path.join(imports.PACKAGE_ROOT, package), tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    stages = ("components.evaluator", "components.example_gen", "components.trainer",
              "components.pusher")
    before = {m: imports.code_fingerprint(m, root=str(tmp_path)) for m in stages}
    grammar = tmp_path / "components" / "sources" / "shapes_grammar.py"
    grammar.write_text(grammar.read_text() + "\n# an edit\n")
    after = {m: imports.code_fingerprint(m, root=str(tmp_path)) for m in stages}
    assert after["components.evaluator"] != before["components.evaluator"]
    assert after["components.example_gen"] != before["components.example_gen"]
    assert after["components.trainer"] == before["components.trainer"]
    assert after["components.pusher"] == before["components.pusher"]
