"""Tests of the scripts in benchmarks/ (loaded by path: benchmarks/ is not a package)."""
from __future__ import annotations

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_benchmark(name: str):
    """The module `benchmarks/<name>.py`, freshly loaded."""
    spec = importlib.util.spec_from_file_location(
        f"{name}_benchmark", os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
