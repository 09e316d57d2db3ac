"""`require_tool`: skip with the reason where a program is missing, fail under CI."""
from __future__ import annotations

import sys

import pytest

from tests import tools


def test_a_present_tool_gives_its_path(monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(tools.shutil, "which", lambda name: "/usr/bin/" + name)
    assert tools.require_tool("java", "METEOR") == "/usr/bin/java"


def test_a_missing_tool_skips_with_the_reason(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(tools.shutil, "which", lambda name: None)
    with pytest.raises(pytest.skip.Exception, match="java is not on PATH; it is needed for "
                                                    "METEOR .*make install"):
        tools.require_tool("java", "METEOR")


@pytest.mark.parametrize("value", ["true", "True", "1"])
def test_a_missing_tool_fails_under_ci(monkeypatch, value):
    monkeypatch.setenv("CI", value)
    monkeypatch.setattr(tools.shutil, "which", lambda name: None)
    with pytest.raises(pytest.fail.Exception, match="CI=true and java is not on PATH"):
        tools.require_tool("java", "METEOR")


def test_ci_false_is_not_ci(monkeypatch):
    monkeypatch.setenv("CI", "false")
    assert not tools.on_ci()
    assert tools.require_tool(sys.executable, "itself") == sys.executable
