"""The suite's own hygiene, read from every test module's syntax tree (AST).

A test must be able to fail. Flagged:

- an `assert` that holds whatever the code does: of a constant (the literal
  `True`, a non-empty string), of a non-empty tuple (a condition and its
  message in parentheses), of a value compared with itself, of membership
  in both booleans, of `x or not x`, or of a project file that does not
  exist being absent from a list;
- a test function that checks nothing: no `assert`, no `pytest.raises`,
  `pytest.warns` or `pytest.fail`, no `raise AssertionError` of its own (one
  in a fake it defines does not count, and raising any other exception is
  not an assertion), no library assertion (`np.testing.assert_allclose`,
  unittest's `self.assertEqual`, a mock's `assert_called_once_with`, ...: the
  fixed list in `_library_assertion`), and no call to a checking helper. A
  helper checks when it is a function of the test tree, found by name (the
  same module, including `self.`/`cls.` methods of its classes, or imported
  from a `tests.` module), that checks, directly or through such helpers.
  A name proves nothing: `check_alive()` counts only if the `check_alive`
  it resolves to asserts, and a project function such as
  `config.check_paths()` never does (a test that only calls it asserts
  nothing about what it returned).

`ALLOWED` lists the few tests that are right without a check of their own,
each with the reason.
"""
from __future__ import annotations

import ast
import os
import re
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)

# "path relative to the repo::test name" -> why it needs no check of its own.
ALLOWED: Dict[str, str] = {}

RAISING_PYTEST = {"raises", "warns", "fail", "deprecated_call"}
# Assertion methods of library objects, by exact name: unittest.mock's, and those of
# the status tf.train.Checkpoint.read/restore returns.
LIBRARY_ASSERT_METHODS = {
    "assert_called", "assert_called_once", "assert_called_with", "assert_called_once_with",
    "assert_any_call", "assert_has_calls", "assert_not_called", "assert_awaited",
    "assert_awaited_once", "assert_awaited_with", "assert_awaited_once_with",
    "assert_any_await", "assert_has_awaits", "assert_not_awaited",
    "assert_consumed", "assert_existing_objects_matched", "assert_nontrivial_match"}
UNITTEST_ASSERT = re.compile(r"^(assert[A-Z]\w*|fail)$")


def _test_tree_files(tests: str) -> Iterator[str]:
    for dirpath, dirnames, files in os.walk(tests):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(dirpath, name)


def _module_name(path: str, repo: str) -> str:
    rel = os.path.relpath(path, repo)[:-3].replace(os.sep, ".")
    return rel.removesuffix(".__init__")


def _is_test_module(path: str) -> bool:
    return os.path.basename(path).startswith("test_")


def _parse(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), filename=path)


# -- always-true assertions -------------------------------------------------------------


def _same(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a) == ast.dump(b)


def _both_booleans(node: ast.AST) -> bool:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
        return len(values) == len(node.elts) and {True, False} <= set(values) \
            and all(isinstance(v, bool) for v in values)
    return False


def _missing_path(node: ast.AST, repo: str) -> bool:
    """A string naming a project file (`pkg/module.py`) that the tree does not hold."""
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)
            and re.fullmatch(r"[\w./-]+/[\w-]+\.py", node.value) is not None
            and not os.path.exists(os.path.join(repo, node.value)))


def tautology(test: ast.expr, repo: str = REPO) -> Optional[str]:
    """Why the asserted expression `test` always holds, or None."""
    if isinstance(test, ast.Constant):
        return f"asserts the constant {test.value!r}" if test.value else None
    if isinstance(test, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
        elements = test.keys if isinstance(test, ast.Dict) else test.elts
        return "asserts a non-empty literal (always true)" if elements else None
    if isinstance(test, ast.Compare):
        left = test.left
        for op, right in zip(test.ops, test.comparators, strict=True):
            if isinstance(op, (ast.Eq, ast.Is, ast.LtE, ast.GtE)) and _same(left, right):
                return "compares a value with itself"
            if isinstance(op, ast.In) and _both_booleans(right):
                return "accepts both True and False"
            if isinstance(op, ast.NotIn) and _missing_path(left, repo):
                return f"asserts that {left.value}, which does not exist, is absent"
            left = right
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        plain = [v for v in test.values if not isinstance(v, ast.UnaryOp)]
        negated = [v.operand for v in test.values
                   if isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.Not)]
        if any(_same(p, n) for p in plain for n in negated):
            return "asserts `x or not x`"
        if _accepts_both_identities(test.values):
            return "accepts both `is True` and `is False`"
    return None


def _accepts_both_identities(values: List[ast.expr]) -> bool:
    seen: Dict[str, Set[bool]] = {}
    for v in values:
        if (isinstance(v, ast.Compare) and len(v.ops) == 1
                and isinstance(v.ops[0], (ast.Is, ast.Eq))
                and isinstance(v.comparators[0], ast.Constant)
                and isinstance(v.comparators[0].value, bool)):
            seen.setdefault(ast.dump(v.left), set()).add(v.comparators[0].value)
    return any(s == {True, False} for s in seen.values())


def always_true_assertions(tree: ast.AST, repo: str = REPO) -> List[Tuple[int, str]]:
    """(line, reason) of every `assert` in `tree` that cannot fail."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            reason = tautology(node.test, repo)
            if reason:
                found.append((node.lineno, reason))
    return found


# -- tests that check nothing -----------------------------------------------------------


def _called_name(call: ast.Call) -> Tuple[Optional[str], Optional[str]]:
    """(object name or None, function name) of a call such as `f()` or `mod.f()`."""
    func = call.func
    if isinstance(func, ast.Name):
        return None, func.id
    if isinstance(func, ast.Attribute):
        owner = func.value.id if isinstance(func.value, ast.Name) else None
        return owner, func.attr
    return None, None


class Module:
    """A module of the test tree: its functions and what its imported names refer to."""

    def __init__(self, path: str, repo: str):
        self.path = path
        self.rel = os.path.relpath(path, repo)
        self.name = _module_name(path, repo)
        self.tree = _parse(path)
        self.functions: Dict[str, ast.AST] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, node)
        self.imported: Dict[str, Tuple[str, Optional[str]]] = {}  # local -> (module, name)
        for node in self.tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    self.imported[alias.asname or alias.name] = (node.module, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    self.imported[alias.asname or alias.name.split(".")[0]] = (alias.name, None)


def _own_raises(function: ast.AST) -> Iterator[ast.Raise]:
    """The `raise` statements of a function, not of the functions it defines (fakes)."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Raise):
            yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                 ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def _raises_assertion_error(node: ast.AST) -> bool:
    if isinstance(node, ast.Raise) and node.exc is not None:
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        return isinstance(exc, ast.Name) and exc.id in ("AssertionError", "Failed")
    return False


def _dotted(node: ast.AST) -> Optional[List[str]]:
    """`a.b.c` as ["a", "b", "c"]; None for anything but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _library_assertion(call: ast.Call) -> bool:
    """Whether `call` is a library's assertion (a fixed list, not any name that looks like one).

    `<...>.testing.assert_*` (numpy, pandas, torch), `tf.debugging.assert_*`,
    unittest's `self.assert*` / `self.fail`, and the `LIBRARY_ASSERT_METHODS`
    of mocks and checkpoint statuses (on any object).
    """
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in LIBRARY_ASSERT_METHODS:
        return True
    parts = _dotted(func)
    if not parts or len(parts) < 2:
        return False
    name = parts[-1]
    if name.startswith("assert") and ("testing" in parts[:-1] or "debugging" in parts[:-1]):
        return True
    return parts[0] == "self" and len(parts) == 2 and UNITTEST_ASSERT.match(name) is not None


def _direct_check(node: ast.AST) -> bool:
    """Whether a function asserts, raises AssertionError (itself), uses pytest's raising
    helpers, or calls a library's assertion (`_library_assertion`)."""
    if any(_raises_assertion_error(r) for r in _own_raises(node)):
        return True
    for sub in ast.walk(node):
        if isinstance(sub, ast.Assert) or _raises_assertion_error(sub):
            return True
        if isinstance(sub, ast.Call):
            owner, name = _called_name(sub)
            if owner == "pytest" and name in RAISING_PYTEST:
                return True
            if _library_assertion(sub):
                return True
    return False


class Suite:
    """Every module of the test tree, and which of their functions check something."""

    def __init__(self, tests: str = TESTS, repo: str = REPO):
        self.modules = {m.name: m for m in (Module(p, repo) for p in _test_tree_files(tests))}
        checks = {(m.name, f): _direct_check(node)
                  for m in self.modules.values() for f, node in m.functions.items()}
        changed = True
        while changed:  # checking through helpers, to a fixed point
            changed = False
            for (module, function), known in checks.items():
                if not known and self._calls_a_checker(module, function, checks):
                    checks[(module, function)] = changed = True
        self.checks = checks

    def _resolve(self, module: Module, owner: Optional[str], name: str) -> Optional[tuple]:
        """The (module, function) of the test tree that a call refers to, or None."""
        if owner is None or owner in ("self", "cls"):  # a method: one of the module's classes
            if name in module.functions:
                return module.name, name
            if owner is not None:
                return None
            source = module.imported.get(name)
            if source and source[1] and source[0] in self.modules:
                return source[0], source[1]
            return None
        source = module.imported.get(owner)
        if source is None:
            return None
        target = source[0] if source[1] is None else f"{source[0]}.{source[1]}"
        return (target, name) if target in self.modules else None

    def _calls_a_checker(self, module_name: str, function: str, checks) -> bool:
        module = self.modules[module_name]
        for sub in ast.walk(module.functions[function]):
            if isinstance(sub, ast.Call):
                owner, name = _called_name(sub)
                target = self._resolve(module, owner, name) if name else None
                if target is not None and checks.get(target):
                    return True
        return False

    def test_functions(self) -> Iterator[Tuple[Module, ast.AST]]:
        for module in self.modules.values():
            if not _is_test_module(module.path):
                continue
            for node in module.tree.body:
                bodies = [node]
                if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                    bodies = node.body
                for item in bodies:
                    if (isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                            and item.name.startswith("test")):
                        yield module, item

    def checks_something(self, module: Module, function: ast.AST) -> bool:
        if _direct_check(function):
            return True
        for sub in ast.walk(function):
            if isinstance(sub, ast.Call):
                owner, name = _called_name(sub)
                target = self._resolve(module, owner, name) if name else None
                if target is not None and self.checks.get(target):
                    return True
        return False


@pytest.fixture(scope="module")
def suite() -> Suite:
    return Suite()


def _key(module: Module, name: str) -> str:
    return f"{module.rel}::{name}"


def test_no_assertion_in_the_test_tree_is_always_true(suite):
    found = [f"{m.rel}:{line}: {reason}"
             for m in suite.modules.values() for line, reason in always_true_assertions(m.tree)]
    assert not found, "\n".join(found)


def test_every_test_checks_something(suite):
    unchecked = [_key(m, f.name) for m, f in suite.test_functions()
                 if not suite.checks_something(m, f) and _key(m, f.name) not in ALLOWED]
    assert not unchecked, ("tests with no assert, no pytest.raises/warns and no checking "
                           "helper:\n" + "\n".join(unchecked))


def test_the_allow_list_names_real_tests_that_need_it(suite):
    tests = {_key(m, f.name): suite.checks_something(m, f) for m, f in suite.test_functions()}
    assert all(key in tests for key in ALLOWED), sorted(set(ALLOWED) - set(tests))
    assert not [key for key in ALLOWED if tests[key]], "allowed, but they check something now"
    assert all(reason.strip() for reason in ALLOWED.values())


# -- the rules themselves, on small sources ---------------------------------------------


@pytest.mark.parametrize("source, flagged", [
    ("assert True", True), ("assert 1", True), ("assert 'message'", True),
    ("assert (x, 'message')", True), ("assert x == x", True), ("assert x.y is x.y", True),
    ("assert flag in (True, False)", True), ("assert flag in [False, True]", True),
    ("assert x or not x", True), ("assert f() is True or f() is False", True),
    ("assert x", False), ("assert not x", False), ("assert x in (True, None)", False),
    ("assert x == y", False), ("assert ()", False), ("assert x is True or y is False", False),
    ("assert False", False), ("assert 0 < x <= 1", False),
    ("assert 'components/no_such_stage.py' not in files", True),
    ("assert 'pipeline/runner.py' not in files", False),
    ("assert 'components/no_such_stage.py' in files", False),
])
def test_tautologies_are_recognized(source, flagged):
    assert bool(always_true_assertions(ast.parse(source))) is flagged, source


def _suite_of(tmp_path, files: Dict[str, str]) -> Suite:
    for rel, text in files.items():
        path = tmp_path / "tests" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Suite(str(tmp_path / "tests"), str(tmp_path))


def test_checks_are_found_through_helpers(tmp_path):
    suite = _suite_of(tmp_path, {
        "__init__.py": "",
        "helpers.py": "def contract(x):\n    _inner(x)\n\ndef _inner(x):\n    assert x\n\n"
                      "def quiet(x):\n    return x\n\n"
                      "def check_quietly(x):\n    return x\n\n"
                      "def plain_name(x):\n    assert x\n",
        "test_a.py": (
            "import pytest\nimport numpy as np\nfrom unittest import mock\n"
            "from tests import helpers\n"
            "from tests.helpers import contract, quiet, check_quietly, plain_name\n"
            "from project.config import check_paths\n\n"
            "def test_asserts():\n    assert 1 + 1 == 2\n\n"
            "def test_raises():\n    with pytest.raises(ValueError):\n        int('x')\n\n"
            "def test_numpy():\n    np.testing.assert_allclose(1, 1)\n\n"
            "def test_mock():\n    m = mock.Mock()\n    m(1)\n"
            "    m.assert_called_once_with(1)\n\n"
            "def test_checker_name():\n    check_alive(1)\n\n"
            "def test_checker_name_in_tests():\n    check_quietly(1)\n\n"
            "def test_checker_name_in_project():\n    check_paths('x')\n\n"
            "def test_verify_attribute():\n    thing.verify_all()\n\n"
            "def test_plain_named_helper():\n    plain_name(1)\n\n"
            "def test_local_helper():\n    _local(1)\n\n"
            "def _local(x):\n    if not x:\n        raise AssertionError(x)\n\n"
            "def test_raising_helper():\n    _raising(1)\n\n"
            "def _raising(x):\n    if not x:\n        raise OSError(x)\n\n"
            "def test_raises_itself():\n    if int('1'):\n        raise RuntimeError('x')\n\n"
            "def test_imported_helper():\n    contract(1)\n\n"
            "def test_module_helper():\n    helpers.contract(1)\n\n"
            "def test_nothing():\n    quiet(1)\n\n"
            "def test_only_runs():\n    int('1')\n\n"
            "class TestGroup:\n    def test_method(self):\n        self.assertEqual(1, 1)\n\n"
            "    def test_empty(self):\n        pass\n\n"
            "    def test_own_method(self):\n        self._check_it(1)\n\n"
            "    def test_quiet_method(self):\n        self.check_nothing(1)\n\n"
            "    def _check_it(self, x):\n        assert x\n\n"
            "    def check_nothing(self, x):\n        return x\n"),
    })
    verdict = {f.name: suite.checks_something(m, f) for m, f in suite.test_functions()}
    assert verdict == {"test_asserts": True, "test_raises": True, "test_numpy": True,
                       "test_mock": True,
                       # a name that looks like a check proves nothing: it has to resolve
                       # to a function of the tests that asserts
                       "test_checker_name": False, "test_checker_name_in_tests": False,
                       "test_checker_name_in_project": False, "test_verify_attribute": False,
                       "test_plain_named_helper": True,
                       "test_local_helper": True, "test_raising_helper": False,
                       "test_raises_itself": False,
                       "test_imported_helper": True, "test_module_helper": True,
                       "test_nothing": False, "test_only_runs": False, "test_method": True,
                       "test_empty": False, "test_own_method": True,
                       "test_quiet_method": False}
