"""The package layering, read from every module's imports (AST).

models <- components <- pipeline (the runner and the CLI on top), and
serving uses models only: a component may import models and serving, serving
imports neither pipeline nor components, models imports none of the three.
Stage modules never import each other (they meet through artifacts).
"""
import os

import pytest

from pipeline import dag, imports

# package -> the project packages it must not import
FORBIDDEN = {
    "models": {"components", "pipeline", "serving"},
    "serving": {"components", "pipeline"},
    "components": {"pipeline"},
    "pipeline": set(),
}


def _modules(package):
    """(module name, path) of every .py file of a package."""
    top = os.path.join(imports.PACKAGE_ROOT, package)
    for dirpath, dirnames, files in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, name), imports.PACKAGE_ROOT)
                module = rel[:-3].replace(os.sep, ".")
                yield module.removesuffix(".__init__"), os.path.join(dirpath, name)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_packages_import_only_the_layers_below(package):
    bad = []
    for module, path in _modules(package):
        for name in imports.imported_names(path, module):
            if name.split(".")[0] in FORBIDDEN[package]:
                bad.append(f"{module} imports {name}")
    assert not bad, "\n".join(sorted(set(bad)))


def _owner(module, stage_modules):
    """The stage module that `module` belongs to (itself or a package it is in), or None."""
    for stage in stage_modules:
        if module == stage or module.startswith(stage + "."):
            return stage
    return None


def test_stage_modules_never_import_each_other():
    stage_modules = [spec.module for spec in dag.STAGES]
    bad = []
    for stage in stage_modules:
        for module in imports.import_closure(stage):
            owner = _owner(module, stage_modules)
            if owner not in (None, stage):
                bad.append(f"{stage} reaches {module}")
    assert not bad, "\n".join(bad)


def test_the_checks_see_function_level_imports(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from pipeline.config import load_config\n")
    assert "pipeline.config" in imports.imported_names(str(path), "models.m")
