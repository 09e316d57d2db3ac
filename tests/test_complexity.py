"""Size limits on the project's code, read from every module's syntax tree (AST).

A module over `MAX_MODULE_LINES` lines, a function over `MAX_FUNCTION_LINES`
lines, or a function with more than `MAX_PARAMETERS` parameters (`self` and
`cls` not counted; `*args` and `**kwargs` count one each) fails, unless it is
in `ALLOWED`. Dataclass constructors are generated at run time and never
appear in the tree, so a dataclass of many fields is no offence: an options
object is the way to pass many settings.
"""
import ast
import os

import pytest

from pipeline import imports

PACKAGES = ("components", "models", "pipeline", "serving", "benchmarks")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
MAX_PARAMETERS = 8

# Offences tolerated: "module" (a path) or "path:function" (the function's
# qualified name), each with the reason. None.
ALLOWED: set[str] = set()


def _sources():
    """(path relative to the project, source) of every module of `PACKAGES`."""
    for package in PACKAGES:
        top = os.path.join(imports.PACKAGE_ROOT, package)
        for dirpath, dirnames, files in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    with open(path, encoding="utf-8") as f:
                        yield os.path.relpath(path, imports.PACKAGE_ROOT), f.read()


def _functions(tree):
    """(qualified name, node) of every function and method, nested ones included."""
    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + child.name, child
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)
    yield from walk(tree, "")


def parameter_count(node) -> int:
    """Parameters of a function, `self` and `cls` not counted."""
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return sum(1 for n in names if n not in ("self", "cls"))


def offences(path: str, source: str) -> list[tuple[str, str]]:
    """(allow-list key, description) of every limit a module breaks."""
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append((path, f"{path}: {lines} lines (limit {MAX_MODULE_LINES})"))
    for name, node in _functions(ast.parse(source, filename=path)):
        key = f"{path}:{name}"
        length = node.end_lineno - node.lineno + 1
        if length > MAX_FUNCTION_LINES:
            found.append((key, f"{key} (line {node.lineno}): {length} lines "
                               f"(limit {MAX_FUNCTION_LINES})"))
        count = parameter_count(node)
        if count > MAX_PARAMETERS:
            found.append((key, f"{key} (line {node.lineno}): {count} parameters "
                               f"(limit {MAX_PARAMETERS})"))
    return found


def test_no_module_or_function_is_too_long_or_takes_too_many_parameters():
    bad = [text for path, source in _sources() for key, text in offences(path, source)
           if key not in ALLOWED]
    assert not bad, "over the limits (split them, or pass an options object):\n  " + \
        "\n  ".join(bad)


@pytest.mark.parametrize("package", ["components", "pipeline"])
def test_components_and_pipeline_have_no_allowances(package):
    assert not [key for key in ALLOWED if key.startswith(package + "/")]


def test_the_measures(tmp_path):
    source = ("class A:\n"
              "    def m(self, a, b, c, d, e, f, g, h, i):\n"
              + "        x = 1\n" * 80
              + "def short(a, *args, **kwargs):\n    return a\n")
    found = dict(offences("m.py", source))
    assert set(found) == {"m.py:A.m"}
    assert "9 parameters" in " ".join(
        text for key, text in offences("m.py", source) if key == "m.py:A.m")
    assert "81 lines" in " ".join(text for _, text in offences("m.py", source))
    assert parameter_count(ast.parse(source).body[1]) == 3
    assert offences("big.py", "x = 1\n" * 501) == [("big.py", "big.py: 501 lines (limit 500)")]
