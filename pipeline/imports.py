"""What a module imports inside the project, read from its source (AST), not by running it.

The runner keys a stage's cache on the code of every project file the
stage's module can import (its import closure), and the layering test checks
which package imports which. Both read imports the same way, from the
file's syntax tree:

- every `import` and `from ... import` statement anywhere in the file
  (imports inside functions count: they run when the function does),
  relative imports resolved against the file's package;
- `importlib.import_module("a.b")` and `__import__("a.b")` with a literal
  string argument (a name computed at run time cannot be read here);
- string literals in module-level tables (a constant, or a tuple, list, set
  or dict of them) that are the dotted name of a module of a project package,
  such as `ENCODER_MODULES = ("models.encoder",)` or the lazy exports of
  `models/__init__.py` (`{"ShowAttendTell": "models.show_attend_tell"}`):
  modules loaded by name later on.

The code fingerprint hashes each file's syntax tree with docstrings removed
(comments never reach the tree), so editing prose changes no cache key.
"""
from __future__ import annotations

import ast
import hashlib
import os
import re
from typing import Iterable

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The packages whose sources are followed; everything else (TensorFlow, the
# standard library) is outside the project and versioned by its installer.
PROJECT_PACKAGES = ("pipeline", "components", "models", "serving")

_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
# Calls whose first (string) argument is a module that gets imported.
_IMPORT_CALLS = {"import_module", "__import__"}


def module_file(name: str, root: str = PACKAGE_ROOT) -> str | None:
    """The source file of module `name` (a package's `__init__.py`), or None if there is none."""
    base = os.path.join(root, *name.split("."))
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


def _parse(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), filename=path)


def _call_name(func: ast.expr) -> str:
    """`importlib.import_module` -> `import_module`; `__import__` -> `__import__`."""
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _table_strings(node: ast.expr) -> Iterable[str]:
    """String constants of a literal table: a constant, or nested tuples, lists, sets, dicts."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for item in node.elts:
            yield from _table_strings(item)
    elif isinstance(node, ast.Dict):
        for item in (*node.keys, *node.values):
            if item is not None:  # `**other` has no key
                yield from _table_strings(item)


def imported_names(path: str, module: str,
                   packages: Iterable[str] = PROJECT_PACKAGES) -> set[str]:
    """Dotted names that the file `path` (module `module`) imports.

    `from a.b import c` gives both `a.b` and `a.b.c` (c may be a submodule);
    names that are not modules are dropped by whoever looks them up.

    Args:
      path: the source file.
      module: its dotted module name (used to resolve relative imports).
      packages: top-level packages whose module names, written as strings in
        module-level tables, count as imports (the module's own top-level
        package always does). Import statements and literal
        `importlib.import_module` calls count whatever they name.
    Returns:
      The set of absolute dotted names.
    """
    tree = _parse(path)
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
        elif isinstance(node, ast.Call) and _call_name(node.func) in _IMPORT_CALLS:
            first = node.args[0] if node.args else None
            if (isinstance(first, ast.Constant) and isinstance(first.value, str)
                    and not first.value.startswith(".")):
                names.add(first.value)
    # Only top-level statements: a table a function builds is not a module table.
    tops = set(packages) | {module.split(".")[0]}
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if value is None:
            continue
        names.update(s for s in _table_strings(value)
                     if _DOTTED.fullmatch(s) and s.split(".")[0] in tops)
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
        for imported in imported_names(path, name, follow):
            frontier.extend(n for n in _with_parents(imported) if n not in found)
    return found


def _without_docstrings(tree: ast.AST) -> ast.AST:
    """`tree` with the docstring of its module, classes and functions removed (in place)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                node.body = body[1:]
    return tree


def normalized_source(path: str) -> str:
    """The code of `path` without its comments, docstrings and layout: a dump of its syntax tree.

    Args:
      path: a Python source file.
    Returns:
      `ast.dump` of the file's tree with docstrings removed (no line
      numbers), equal for two files that differ only in prose and layout.
    """
    return ast.dump(_without_docstrings(_parse(path)))


def code_fingerprint(module: str, packages: Iterable[str] = PROJECT_PACKAGES,
                     root: str = PACKAGE_ROOT) -> str:
    """A hash of the code of `module`'s import closure (paths and normalized syntax trees).

    Args:
      module: a dotted module name (a stage's component module).
      packages: top-level packages to follow (see `import_closure`).
      root: the folder holding the packages.
    Returns:
      16 hex digits; an edit to the code of any file the module can import
      changes it, an edit to a comment or docstring does not.
    """
    h = hashlib.sha256()
    for path in sorted(import_closure(module, packages, root).values()):
        h.update(os.path.relpath(path, root).encode())
        h.update(b"\0")
        h.update(normalized_source(path).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]
