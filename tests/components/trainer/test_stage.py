"""The Trainer's stage entry: importing it starts no TensorFlow; the worker CLI runs as a module."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _python(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_importing_the_stage_imports_no_tensorflow():
    # The runner imports the stage before deciding whether training needs a
    # fresh process (logical devices, collectives): TensorFlow must not start.
    done = _python("-c", "import sys, components.trainer as t; "
                         "assert callable(t.run) and callable(t.main); "
                         "print(sorted(m for m in sys.modules "
                         "if m.split('.')[0] in ('tensorflow', 'keras')))")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_worker_cli_runs_as_a_module():
    done = _python("-m", "components.trainer", "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--annotations" in done.stdout and "--parent-pid" in done.stdout
