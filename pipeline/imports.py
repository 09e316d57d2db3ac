"""What a module imports inside the project, read from its source (AST), not by running it.

The runner keys a stage's cache on the source of every project file the
stage's module can import (its import closure), and the layering test checks
which package imports which. Both read imports the same way: every `import`
and `from ... import` statement anywhere in the file (imports inside
functions count: they run when the function does), relative imports
resolved against the file's package.
"""
from __future__ import annotations

import ast
import hashlib
import os
from typing import Iterable

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The packages whose sources are followed; everything else (TensorFlow, the
# standard library) is outside the project and versioned by its installer.
PROJECT_PACKAGES = ("pipeline", "components", "models", "serving")


def module_file(name: str, root: str = PACKAGE_ROOT) -> str | None:
    """The source file of module `name` (a package's `__init__.py`), or None if there is none."""
    base = os.path.join(root, *name.split("."))
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


def imported_names(path: str, module: str) -> set[str]:
    """Dotted names that the file `path` (module `module`) imports.

    `from a.b import c` gives both `a.b` and `a.b.c` (c may be a submodule);
    names that are not modules are dropped by whoever looks them up.

    Args:
      path: the source file.
      module: its dotted module name (used to resolve relative imports).
    Returns:
      The set of absolute dotted names.
    """
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                base = ".".join(parts[:len(parts) - (node.level - 1)])
                source = ".".join(p for p in (base, node.module) if p)
            else:
                source = node.module or ""
            if not source:
                continue
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def _with_parents(name: str) -> list[str]:
    """`a.b.c` -> `a`, `a.b`, `a.b.c`: importing a module runs its packages' `__init__` first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def import_closure(module: str, packages: Iterable[str] = PROJECT_PACKAGES,
                   root: str = PACKAGE_ROOT) -> dict[str, str]:
    """Every project module that `module` can import, directly or through others.

    Args:
      module: a dotted module name (a stage's component module).
      packages: top-level packages to follow; the module's own top-level
        package is always followed.
      root: the folder holding the packages.
    Returns:
      Module name -> source file, the module itself included.
    """
    follow = set(packages) | {module.split(".")[0]}
    found: dict[str, str] = {}
    frontier = _with_parents(module)
    while frontier:
        name = frontier.pop()
        if name in found or name.split(".")[0] not in follow:
            continue
        path = module_file(name, root)
        if path is None:
            continue
        found[name] = path
        for imported in imported_names(path, name):
            frontier.extend(n for n in _with_parents(imported) if n not in found)
    return found


def code_fingerprint(module: str, packages: Iterable[str] = PROJECT_PACKAGES,
                     root: str = PACKAGE_ROOT) -> str:
    """A hash of the source of `module`'s import closure (paths and contents).

    Returns:
      16 hex digits; any edit to any file the module can import changes it.
    """
    h = hashlib.sha256()
    for path in sorted(import_closure(module, packages, root).values()):
        h.update(os.path.relpath(path, root).encode())
        h.update(b"\0")
        with open(path, "rb") as f:
            h.update(f.read())
        h.update(b"\0")
    return h.hexdigest()[:16]
