"""Import closures: what keys a stage's cache, read from the source."""
import os
import shutil

import pytest

from pipeline import dag, imports


def _rel(paths):
    return {os.path.relpath(p, imports.PACKAGE_ROOT) for p in paths}


def test_evaluator_closure_has_what_it_really_imports():
    files = _rel(imports.import_closure("components.evaluator").values())
    # Through the grounding metric and the figures module.
    assert "components/synthetic/shapes_grammar.py" in files
    assert "serving/client/attention_figure.py" in files
    assert "models/decoding.py" in files          # imported inside a function
    assert "components/__init__.py" in files      # packages run their __init__ first
    # Stages never import each other: nothing of the Trainer package (which
    # the Trainer's own closure has) or of Preprocess.
    assert "components/trainer/loop.py" in _rel(imports.import_closure("components.trainer")
                                                 .values())
    assert "components/preprocess/stage.py" in _rel(
        imports.import_closure("components.preprocess").values())
    assert not any(f.startswith(("components/trainer/", "components/preprocess/"))
                   for f in files)
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

    def edit(*parts):
        path = tmp_path.joinpath(*parts)
        before = {m: imports.code_fingerprint(m, root=str(tmp_path)) for m in stages}
        path.write_text(path.read_text() + "\n_AN_EDIT = 1\n")
        after = {m: imports.code_fingerprint(m, root=str(tmp_path)) for m in stages}
        return {m for m in stages if after[m] != before[m]}

    # The grammar: the synthetic source, the grounding metric and the SCST box
    # term's object words (components/contract/object_words.py) read it.
    assert edit("components", "synthetic", "shapes_grammar.py") == {
        "components.evaluator", "components.example_gen", "components.trainer"}
    # The grounding metric: the Evaluator's alone.
    assert edit("components", "evaluator", "metrics", "grounding.py") == {"components.evaluator"}


@pytest.fixture
def code_copy(tmp_path):
    """A copy of the project packages in `tmp_path`, to edit."""
    for package in imports.PROJECT_PACKAGES:
        shutil.copytree(os.path.join(imports.PACKAGE_ROOT, package), tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return tmp_path


def _fingerprints(root):
    return {s.name: imports.code_fingerprint(s.module, root=str(root)) for s in dag.STAGES}


def test_comments_and_docstrings_change_no_fingerprint(code_copy):
    config = code_copy / "components" / "contract" / "config" / "sections.py"
    assert any("components.contract.config" in imports.import_closure(s.module, root=str(code_copy))
               for s in dag.STAGES)
    before = _fingerprints(code_copy)
    text = config.read_text()
    # A module, class and function docstring, a comment and blank lines.
    edited = text.replace('"""The configuration schema', '"""(Edited.) The configuration schema', 1)
    edited = edited.replace('    """Where the images and captions come from',
                            '    # a new comment\n\n    """Where, edited, the images and captions '
                            'come from', 1)
    edited = edited.replace('    """Every `section.key` that `--set` accepts.',
                            '    """Every `section.key` that `--set` accepts (edited).', 1)
    assert edited.count("edited") + edited.count("Edited") == 3
    config.write_text(edited)
    assert _fingerprints(code_copy) == before
    # The same file with a code edit does change them.
    config.write_text(edited + "\n_CODE_EDIT = 1\n")
    after = _fingerprints(code_copy)
    assert after["Trainer"] != before["Trainer"]


def test_editing_the_encoder_model_changes_preprocess(code_copy):
    # Preprocess loads `encoder.keras`, whose layers models.encoder registers:
    # it names that module in a table (ENCODER_MODULES) and imports it by name.
    before = imports.code_fingerprint("components.preprocess", root=str(code_copy))
    encoder = code_copy / "models" / "encoder.py"
    encoder.write_text(encoder.read_text() + "\n_CODE_EDIT = 1\n")
    assert imports.code_fingerprint("components.preprocess", root=str(code_copy)) != before


def test_modules_loaded_by_name_are_in_the_closure(tmp_path):
    pkg = tmp_path / "namepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import importlib\n"
        "_EXPORTS = {'Thing': 'namepkg.lazy'}\n\n"
        "def __getattr__(name):\n"
        "    return getattr(importlib.import_module(_EXPORTS[name]), name)\n")
    (pkg / "lazy.py").write_text("Thing = 1\n")
    (pkg / "by_call.py").write_text("")
    (pkg / "dunder.py").write_text("")
    (pkg / "in_table.py").write_text("")
    (pkg / "only_in_function.py").write_text("")
    (pkg / "stage.py").write_text(
        "import importlib\n"
        "MODULES = (('namepkg.in_table', 'not a module name'),)\n"
        "def run(ctx):\n"
        "    importlib.import_module('namepkg.by_call')\n"
        "    __import__('namepkg.dunder')\n"
        "    local = ['namepkg.only_in_function']\n")
    found = imports.import_closure("namepkg.stage", root=str(tmp_path))
    assert set(found) == {"namepkg", "namepkg.stage", "namepkg.lazy", "namepkg.by_call",
                          "namepkg.dunder", "namepkg.in_table"}


def test_the_real_tables_are_followed():
    preprocess = imports.import_closure("components.preprocess")
    assert "models.encoder" in preprocess  # ENCODER_MODULES, imported by name only
    # Any module importing the `models` package reaches its lazy exports.
    assert "models.show_attend_tell" in imports.import_closure("models")
