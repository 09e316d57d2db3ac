"""Reliability tests: shared fixtures.

The serving tests' fixture SavedModels (`model_store`) are re-exported from
`tests/serving/conftest.py`, not copied; `serve_process` starts the server as
a child process (`tests/reliability/server_process.py`).
"""
from __future__ import annotations

from typing import List

import pytest

from tests.reliability.server_process import ServerProcess
from tests.serving.conftest import model_store  # noqa: F401  (re-exported fixture)


@pytest.fixture(scope="module")
def serve_process(tmp_path_factory):
    """serve_process(args) -> a started ServerProcess; stopped after the module."""
    started = []

    def start(args: List[str]) -> ServerProcess:
        log_path = str(tmp_path_factory.mktemp("server-log") / "server.log")
        server = ServerProcess(args, log_path)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
