"""External programs some tests need (Java for METEOR and the PTB tokenizer).

`make install` installs them or fails. A test that needs one calls
`require_tool`: where the program is missing it is skipped with the reason,
except under CI (`CI=true`), where it fails, so that a green CI run always
ran it.
"""
from __future__ import annotations

import os
import shutil

import pytest


def on_ci() -> bool:
    """Whether `CI` is set to a true value (GitHub Actions, GitLab and others set `CI=true`)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_tool(name: str, needed_for: str) -> str:
    """The path of program `name`; skips, or fails under CI, where it is not on PATH.

    Args:
      name: the program (`java`).
      needed_for: what the test checks with it, for the message.
    Returns:
      The program's path.
    """
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} is not on PATH; it is needed for {needed_for} (`make install` installs it)"
    if on_ci():
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)
