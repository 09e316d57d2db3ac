"""Shared serving fixtures: fixture SavedModels (built once) and in-process servers."""
from __future__ import annotations

import os
import shutil
import threading

import pytest

from tests.serving.fixtures import build_fixture_model, publish_version, solid_image

RED = (220, 30, 30)
BLUE = (20, 20, 90)
GREEN = (40, 230, 60)


@pytest.fixture(scope="session")
def model_store(tmp_path_factory):
    """Two fixture versions, built once: 'image' (with 2 warmup records) and 'square'."""
    root = tmp_path_factory.mktemp("model_store")
    warm = [solid_image(RED), solid_image(BLUE, fmt="JPEG")]
    return {
        "image": build_fixture_model(str(root / "image"), noun="image", warmup_images=warm),
        "square": build_fixture_model(str(root / "square"), noun="square"),
    }


@pytest.fixture
def make_base(tmp_path, model_store):
    """make_base({1: "image", 2: "square"}) -> a base path with those versions."""
    def make(versions, name="captioner"):
        base = tmp_path / name
        base.mkdir(exist_ok=True)
        for version, kind in versions.items():
            publish_version(model_store[kind], str(base), version)
        return str(base)
    return make


@pytest.fixture
def start_server():
    """start_server(base, name, **ServerOptions fields) -> a started server, stopped after the test."""
    from serving.server.model_server import ModelServer
    from serving.server.options import ServerOptions

    servers = []

    def start(model_base_path=None, model_name="captioner", **settings):
        settings.setdefault("port", 0)
        settings.setdefault("rest_port", 0)
        settings.setdefault("poll_seconds", 0.1)
        server = ModelServer(model_base_path, model_name,
                             options=ServerOptions(**settings)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop(grace=1)


def remove_version(base: str, version: int) -> None:
    """Removes a version folder the way an operator would (rename away, then delete)."""
    path = os.path.join(base, str(version))
    trash = os.path.join(base, f".trash-{version}")
    os.rename(path, trash)
    shutil.rmtree(trash)


def run_concurrently(fn, args):
    """fn(arg) for every arg, all threads released at once; exceptions are returned."""
    results = [None] * len(args)
    barrier = threading.Barrier(len(args))

    def worker(i):
        barrier.wait()
        try:
            results[i] = fn(args[i])
        except Exception as e:
            results[i] = e

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(args))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def fresh_process_words(code: str) -> list:
    """Runs `code` in a new Python (TensorFlow not yet started there); its stdout's words."""
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=True).stdout.split()
