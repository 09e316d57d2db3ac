"""The quiet default of `captioner`: library start-up chatter kept off the terminal.

TensorFlow's native libraries log a few lines (oneDNN, "Could not find cuda
drivers", "All log messages before absl::InitializeLog()") while they load,
before `TF_CPP_MIN_LOG_LEVEL` applies, and Beam warns through the root
logger about optional modules it did not find. `install()` sets the
environment for this process and its subprocesses, and captures the file
descriptor 2 output of `import tensorflow` (wherever it first happens), then
writes back what is not such a log line, so a real import error still shows.
`captioner --verbose` skips all of this. Processes the stages start
themselves (the Trainer's child process) call `install_if_asked()` first.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import re
import sys
import tempfile
import warnings

# A native log line (absl/glog format: "I0000 00:00:17956.. 123 file.cc:45] ...").
_NATIVE_LOG = re.compile(r"^[IWEF]\d{4} \d+:\d+:\d+(\.\d+)?\s+\d+ \S+:\d+\] ")
_ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog()"


def filter_native_logs(text: str) -> str:
    """`text` without native log lines and absl's preamble."""
    kept = [line for line in text.splitlines(keepends=True)
            if not _NATIVE_LOG.match(line) and not line.startswith(_ABSL_PREAMBLE)]
    return "".join(kept)


class _QuietLoader(importlib.abc.Loader):
    """Runs the wrapped loader with file descriptor 2 captured and filtered."""

    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        sys.stderr.flush()
        try:
            saved = os.dup(2)
        except OSError:  # no stderr to capture
            self.inner.exec_module(module)
            return
        with tempfile.TemporaryFile() as tmp:
            os.dup2(tmp.fileno(), 2)
            try:
                self.inner.exec_module(module)
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
                tmp.seek(0)
                rest = filter_native_logs(tmp.read().decode(errors="replace"))
                if rest:
                    sys.stderr.write(rest)
                    sys.stderr.flush()


class _QuietFinder(importlib.abc.MetaPathFinder):
    """Wraps the first import of `tensorflow` in `_QuietLoader`, then steps aside."""

    def find_spec(self, name, path, target=None):
        if name != "tensorflow":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


def install(python_logs: bool = True) -> None:
    """Quiets TensorFlow, absl, gRPC, Beam and Keras for this process and its children.

    Args:
      python_logs: also raise the root Python logger to ERROR (Beam's
        warnings about optional modules); False where the command configures
        logging itself (`serve`).
    """
    os.environ["CAPTIONER_QUIET"] = "1"  # for `install_if_asked` in child processes
    # 3: errors too, which on a CPU-only host include "failed call to cuInit".
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    # No CUDA probe where no NVIDIA device exists.
    if not os.path.exists("/dev/nvidiactl") and not os.path.exists("/dev/nvidia0"):
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    # Library warnings (Keras, Beam) here and in Python subprocesses.
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    warnings.simplefilter("ignore")
    if python_logs:
        logging.getLogger().setLevel(logging.ERROR)
        # A failing DoFn's exception reaches the stage, and the runner reports
        # it (in one line where it can say what to do): Beam's own ERROR log of
        # it, with the record's bytes, would print it a second time.
        logging.getLogger("apache_beam.runners.common").setLevel(logging.CRITICAL)
    if "tensorflow" not in sys.modules and not any(
            isinstance(f, _QuietFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietFinder())


def install_if_asked() -> None:
    """`install()` in a child process of a quiet `captioner` (CAPTIONER_QUIET=1)."""
    if os.environ.get("CAPTIONER_QUIET") == "1":
        install()
