"""Soak: clients on loopback while HandleReloadConfigRequest changes models and labels.

CLIENTS threads call Predict for about SECONDS against the server in a child
process (`--model_config_file`, as deployed), by label (`stable`, `canary`)
and by latest version, while the test sends one reload after another, each
waiting for the previous: labels swap between versions 1 and 2, a second
model is added and removed, and the version policy switches between
`specific {1, 2}` and `all`. Asserted: every reload succeeds; no request
fails; each answer comes from the version its label pointed at when the
request started or when it ended (a reload may land in between); requests
kept completing throughout.
"""
from __future__ import annotations

import collections
import statistics
import threading
import time

import grpc
import pytest
from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc
from tensorflow_serving.config import model_server_config_pb2

from serving.client.caption_client import CaptionClient, ClientOptions
from tests.serving.conftest import RED
from tests.serving.fixtures import publish_version, solid_image

# A soak: SECONDS of reloads under load at the least; 15-20 s with its server.
pytestmark = pytest.mark.slow

CLIENTS = 4
SECONDS = 5.0   # of reloads under load, and at least MIN_RELOADS of them
MIN_RELOADS = 6  # each label order with each of the three configs (policies, second model)
NOUN = {1: "image", 2: "square"}


def _config(base: str, other: str, step: int) -> model_server_config_pb2.ModelServerConfig:
    """The config of reload number `step`: labels swap, `other` comes and goes."""
    config = model_server_config_pb2.ModelServerConfig()
    entry = config.model_config_list.config.add(name="captioner", base_path=base,
                                                model_platform="tensorflow")
    if step % 3 == 2:
        entry.model_version_policy.all.SetInParent()
    else:
        entry.model_version_policy.specific.versions.extend([1, 2])
    stable, canary = (1, 2) if step % 2 == 0 else (2, 1)
    entry.version_labels["stable"] = stable
    entry.version_labels["canary"] = canary
    if step % 2 == 0:
        config.model_config_list.config.add(name="other", base_path=other,
                                            model_platform="tensorflow")
    return config


def test_reloads_under_load_fail_no_request(model_store, serve_process, tmp_path_factory):
    root = tmp_path_factory.mktemp("reload-soak")
    base, other = root / "captioner", root / "other"
    base.mkdir()
    other.mkdir()
    publish_version(model_store["image"], str(base), 1)
    publish_version(model_store["square"], str(base), 2)
    publish_version(model_store["square"], str(other), 1)
    config_file = root / "models.config"
    first = _config(str(base), str(other), 1)
    for entry in first.model_config_list.config:
        entry.ClearField("version_labels")  # labels need their versions loaded first
    config_file.write_text(str(first))
    server = serve_process([f"--model_config_file={config_file}", "--port=0",
                            "--rest-port=-1", "--file_system_poll_wait_seconds=1"])
    stub = model_service_pb2_grpc.ModelServiceStub(grpc.insecure_channel(server.grpc_address))

    def reload(step):
        request = model_management_pb2.ReloadConfigRequest(
            config=_config(str(base), str(other), step))
        started = time.perf_counter()
        response = stub.HandleReloadConfigRequest(request, timeout=120)
        assert response.status.error_code == 0, response
        return time.perf_counter() - started

    reload(1)
    # The labels being served ("current") and, while a reload runs, the ones
    # it applies ("next"): a request may see either.
    labels = {"current": {"stable": 2, "canary": 1}, "next": {"stable": 2, "canary": 1}}

    def possible(target):
        return {labels["current"].get(target), labels["next"].get(target)}
    image = solid_image(RED)
    done, errors, mismatches = collections.Counter(), [], []
    completions = []
    stop = threading.Event()
    lock = threading.Lock()

    def client(index):
        target = ("stable", "canary", None)[index % 3]
        with CaptionClient(server.grpc_address, timeout=60, version=target, options=ClientOptions(max_attempts=1)) as caption_client:
            while not stop.is_set():
                before = possible(target)
                try:
                    result = caption_client.caption([image])[0]
                except Exception as e:  # any failure is the finding
                    with lock:
                        errors.append(f"{target}: {e}")
                    continue
                after = possible(target)
                with lock:
                    done[target or "latest"] += 1
                    completions.append(time.monotonic())
                    if target and result["version"] not in before | after:
                        mismatches.append((target, before, after, result["version"]))
                    if not result["caption"].endswith(NOUN[result["version"]]):
                        mismatches.append(("caption", result))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    reload_seconds = []
    step = 2
    while time.monotonic() - started < SECONDS or len(reload_seconds) < MIN_RELOADS:
        labels["next"] = {"stable": 1, "canary": 2} if step % 2 == 0 else \
            {"stable": 2, "canary": 1}
        reload_seconds.append(reload(step))
        labels["current"] = labels["next"]
        step += 1
    reloads_ended = time.monotonic()
    time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join(60)
    assert server.alive(), server.log()[-3000:]
    assert not errors, errors[:5]
    assert not mismatches, mismatches[:5]
    reloads = len(reload_seconds)
    gaps = [b - a for a, b in zip(completions, completions[1:], strict=False)]
    print(f"\nreload soak: {reloads} reloads in {time.monotonic() - started:.1f} s "
          f"(median {statistics.median(reload_seconds):.2f} s, max {max(reload_seconds):.2f} s), "
          f"{sum(done.values())} requests {dict(done)}, 0 failed, "
          f"largest gap between completions {max(gaps):.2f} s")
    assert all(done[k] > 0 for k in ("stable", "canary", "latest"))
    # Requests completed while the reloads ran, not only before or after them.
    during = sum(1 for t in completions if started < t < reloads_ended)
    assert during >= reloads, (during, reloads)
