"""The package layering, read from every module's imports (AST).

models <- components <- pipeline (the runner and the CLI on top), and
serving uses models only: a component may import models and serving, serving
imports neither pipeline nor components, models imports none of the three.
Stage modules never import each other (they meet through artifacts), the
contract they share (`components/contract/`) and the synthetic data
(`components/synthetic/`) import no stage, and no two modules anywhere in the
project import each other, directly or through others.
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


# Shared packages of `components`: every stage may import them, they import no stage.
SHARED = ("components.contract", "components.synthetic", "components.beam")


@pytest.mark.parametrize("shared", SHARED)
def test_shared_packages_import_no_stage(shared):
    stage_modules = [spec.module for spec in dag.STAGES]
    bad = [f"{shared} reaches {module}" for module in imports.import_closure(shared)
           if _owner(module, stage_modules) is not None]
    assert not bad, "\n".join(sorted(bad))


# Components the CLI runs outside the DAG (`captioner caption --model`): they
# import no stage, and no stage imports them.
TOOLS = ("components.bulk_inferrer",)


def _in_package(module, package):
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("tool", TOOLS)
def test_tools_import_no_stage_and_no_stage_imports_them(tool):
    stage_modules = [spec.module for spec in dag.STAGES]
    modules = [module for module, _ in _modules("components") if _in_package(module, tool)]
    bad = [f"{module} reaches {other}" for module in modules
           for other in imports.import_closure(module)
           if _owner(other, stage_modules) is not None]
    bad += [f"{stage} reaches {other}" for stage in stage_modules
            for other in imports.import_closure(stage) if _in_package(other, tool)]
    assert modules, f"{tool} holds no module"
    assert not bad, "\n".join(sorted(bad))


def test_components_holds_only_stages_and_shared_packages():
    stage_modules = {spec.module for spec in dag.STAGES}
    loose = [module for module, _ in _modules("components")
             if module != "components" and _owner(module, stage_modules) is None
             and not module.startswith(SHARED + TOOLS)]
    assert not loose, "modules of components/ outside a stage, the shared packages and " \
        "the tools: " + ", ".join(loose)


PROJECT = ("benchmarks", "components", "models", "pipeline", "serving", "tests")


def import_graph(packages=PROJECT, root=imports.PACKAGE_ROOT):
    """Module -> the project modules it imports (names that are not modules dropped)."""
    files = {}
    for package in packages:
        top = os.path.join(root, package)
        for dirpath, dirnames, names in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(names):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    module = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                    files[module.removesuffix(".__init__")] = path
    return {module: sorted(name for name in imports.imported_names(path, module, packages)
                           if name in files and name != module)
            for module, path in files.items()}


def find_cycle(graph):
    """One import cycle as a list of modules (first == last), or None."""
    done, path, on_path = set(), [], set()

    def visit(node):
        path.append(node)
        on_path.add(node)
        for nxt in graph.get(node, ()):
            if nxt in on_path:
                return path[path.index(nxt):] + [nxt]
            if nxt not in done:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        on_path.discard(path.pop())
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_no_import_cycle_between_modules():
    # A package importing its own submodules (a re-export in `__init__`) is no cycle.
    graph = {module: [name for name in names if not name.startswith(module + ".")]
             for module, names in import_graph().items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle(tmp_path):
    package = tmp_path / "components"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from components import b\n")
    (package / "b.py").write_text("from components.a import f\n")
    (package / "c.py").write_text("import components.a\n")
    graph = import_graph(("components",), root=str(tmp_path))
    assert find_cycle(graph) == ["components.a", "components.b", "components.a"]
    assert find_cycle({"x": ["y"], "y": []}) is None


# serving/'s subpackages and the serving modules each may import: the shared
# base (errors, tensors, cli_help, protos) below everything, the server on top, and
# the client beside it, never reaching into the server.
SERVING_BASE = ("serving.errors", "serving.tensors", "serving.cli_help", "serving.protos")
SERVING_ALLOWED = {
    "serving.signature": (),
    "serving.limits": (),
    "serving.versions": ("serving.limits",),
    "serving.ui": ("serving.signature",),
    "serving.client": ("serving.signature",),
    "serving.server": ("serving.signature", "serving.limits", "serving.versions", "serving.ui"),
}


def _serving_part(module):
    """The subpackage (or base module) of `serving` that `module` belongs to, or None."""
    for part in (*SERVING_ALLOWED, *SERVING_BASE):
        if _in_package(module, part):
            return part
    return None


def test_serving_subpackages_import_only_what_they_may():
    bad = []
    for module, path in _modules("serving"):
        part = _serving_part(module)
        if module == "serving":
            continue
        if part is None:
            bad.append(f"{module} is in no subpackage of serving ({', '.join(SERVING_ALLOWED)}) "
                       f"and is not a shared module ({', '.join(SERVING_BASE)})")
            continue
        allowed = {part, *SERVING_ALLOWED.get(part, ()), *SERVING_BASE}
        for name in imports.imported_names(path, module):
            if name.split(".")[0] != "serving" or name == "serving":
                continue
            target = _serving_part(name)
            if target not in allowed:
                bad.append(f"{module} imports {name}")
    assert not bad, "\n".join(sorted(set(bad)))


def test_the_serving_check_names_the_layers_it_knows():
    assert _serving_part("serving.server.rest") == "serving.server"
    assert _serving_part("serving.tensors") == "serving.tensors"
    assert _serving_part("serving.loose") is None
    assert "serving.server" not in SERVING_ALLOWED["serving.client"]
