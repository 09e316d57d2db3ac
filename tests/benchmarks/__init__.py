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


def run_benchmark(name: str, args: list, results_dir, overrides=()):
    """Runs `benchmarks/<name>.py args [--set item ...]` in a subprocess, its records
    going to `results_dir`; asserts it exits 0 and returns the completed process."""
    import subprocess
    import sys
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", f"{name}.py"), *map(str, args)]
    for item in overrides:
        cmd += ["--set", item]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "BENCHMARK_RESULTS_DIR": str(results_dir),
                               "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc
