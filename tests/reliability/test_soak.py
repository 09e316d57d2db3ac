"""Soak: concurrent clients on loopback while versions are pushed and removed.

CLIENTS threads call Predict (no version: the latest) in a loop for about
SECONDS against the server in a child process, while the test publishes
version 2 and then 3 (fixture models whose caption ends in "square" and
"circle", so each answer says which version served it) and removes version 1.
Asserted: no request fails; requests kept completing through every phase
(counts per phase, largest gap between completions); each answer matches the
version that gave it and no client goes back to an older version; the last
answers come from version 3; the server's RSS (VmRSS from /proc, sampled
every 0.25 s) is flat in the steady state after the last push. Every
threshold is relative to the warm-up measured in the same run (see below).
"""
from __future__ import annotations

import collections
import statistics
import threading
import time

import pytest

from serving.client.caption_client import CaptionClient, ClientOptions
from tests.serving.conftest import RED, remove_version
from tests.serving.fixtures import (
    build_fixture_model,
    expected_caption,
    publish_version,
    solid_image,
)

CLIENTS = 8
SECONDS = 20          # whole run, load included
WARMUP = 3.0          # seconds of load before the RSS and throughput baselines
STEADY = 8.0          # at least this many seconds of load after the last push
# Thresholds relative to baselines measured in the same run, so that they hold
# on a slow or busy host as on a fast one:
# - the largest gap between completions, at most GAP_FACTOR times a request's
#   mean latency in the warm-up's second half (one version, no reloads:
#   CLIENTS / rate): loading a version pauses serving for up to about 100 of
#   them here, a hang stops it;
# - requests per phase and in the steady state, at least MIN_RATE_FRACTION of
#   the warm-up's rate over the same time;
# - RSS change in the steady state after the last push (no version changes,
#   thousands of requests), within STEADY_GROWTH_FRACTION of the RSS after
#   warm-up, split in two windows: within the last window, and from the first
#   window's median to the last's. The allocator settles far below this (a
#   few tenths of a MB), while a leak of anything request-sized (an image, a
#   response: 1 KB and up) per request, or of a thread per client, exceeds it;
# - RSS at the end within TOTAL_GROWTH_FRACTION of the RSS after warm-up (two
#   more SavedModels loaded, one unloaded).
GAP_FACTOR = 300.0
MIN_RATE_FRACTION = 0.1
STEADY_GROWTH_FRACTION = 0.01
TOTAL_GROWTH_FRACTION = 0.25
NOUN = {1: "image", 2: "square", 3: "circle"}


pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models(model_store, tmp_path_factory):
    circle = build_fixture_model(str(tmp_path_factory.mktemp("soak-models") / "circle"),
                                 noun="circle")
    return {1: model_store["image"], 2: model_store["square"], 3: circle}


def test_soak_versions_come_and_go_without_failures(models, serve_process, tmp_path_factory):
    base = tmp_path_factory.mktemp("soak") / "captioner"
    base.mkdir()
    publish_version(models[1], str(base), 1)
    server = serve_process(["--model-base-path", str(base), "--port", "0", "--rest-port", "-1",
                            "--poll-seconds", "0.2", "--model-version-policy", "latest:2"])
    image = solid_image(RED)
    results = []   # (finished at, client, version, caption)
    errors = []
    stop = threading.Event()
    lock = threading.Lock()

    def client_loop(index: int):
        with CaptionClient(server.grpc_address, timeout=30, options=ClientOptions(max_attempts=1)) as client:
            while not stop.is_set():
                try:
                    (result,) = client.caption([image], attention=False)
                except Exception as e:  # any failure is a bug
                    with lock:
                        errors.append((time.monotonic(), index, repr(e)))
                    continue
                with lock:
                    results.append((time.monotonic(), index, result["version"],
                                    result["caption"]))

    rss = []  # (time, MB)

    def sample_rss():
        while not stop.is_set():
            rss.append((time.monotonic(), server.rss_mb()))
            stop.wait(0.25)

    def wait_for_version(version: int, timeout: float = 30.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with lock:
                if any(r[2] == version for r in results[-CLIENTS * 4:]):
                    return time.monotonic()
            time.sleep(0.05)
        raise AssertionError(f"version {version} was never served")

    rss_idle = server.rss_mb()
    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(CLIENTS)]
    threads.append(threading.Thread(target=sample_rss))
    started = time.monotonic()
    events = {"start": started}
    for thread in threads:
        thread.start()
    try:
        time.sleep(WARMUP)
        events["warm"] = time.monotonic()
        publish_version(models[2], str(base), 2)
        events["push v2"] = time.monotonic()
        events["v2 served"] = wait_for_version(2)
        time.sleep(1.0)
        remove_version(str(base), 1)
        events["remove v1"] = time.monotonic()
        time.sleep(1.5)  # several polls: v1 is unloaded while clients run on v2
        publish_version(models[3], str(base), 3)
        events["push v3"] = time.monotonic()
        events["v3 served"] = wait_for_version(3)
        time.sleep(max(STEADY, SECONDS - (time.monotonic() - started)))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    ended = time.monotonic()
    events["end"] = ended
    alive = server.alive()
    log = server.log()
    with CaptionClient(server.grpc_address) as client:
        states = {s["version"]: s["state"] for s in client.status()}

    # -- report ---------------------------------------------------------------------
    phases = [("v1 only", "start", "push v2"), ("v2 pushed", "push v2", "remove v1"),
              ("v1 removed", "remove v1", "push v3"), ("v3 pushed", "push v3", "end")]
    per_phase = {name: sum(1 for r in results if events[a] <= r[0] < events[b])
                 for name, a, b in phases}
    per_version = collections.Counter(r[2] for r in results)
    times = sorted([started] + [r[0] for r in results] + [ended])
    max_gap = max(b - a for a, b in zip(times, times[1:], strict=False))
    steady_start = events["v3 served"] + 1.5  # load and unload temporaries freed
    steady = [(t, mb) for t, mb in rss if t >= steady_start]
    half = steady_start + (ended - steady_start) / 2
    first = [mb for t, mb in steady if t < half]
    last = [mb for t, mb in steady if t >= half]
    windows = []
    for name, a, b in phases:
        window = [mb for t, mb in rss if events[a] <= t < events[b]]
        if window:
            windows.append(f"{name}: {window[0]:.0f}->{window[-1]:.0f} (max {max(window):.0f})")
    warm_rss = next(mb for t, mb in rss if t >= events["warm"])
    # Baselines of the warm-up's second half: one version loaded, steady load.
    calm_start = started + WARMUP / 2
    rate = sum(1 for r in results if calm_start <= r[0] < events["warm"]) / (
        events["warm"] - calm_start)
    latency = CLIENTS / rate if rate else float("inf")
    max_gap_allowed = GAP_FACTOR * latency
    steady_growth_allowed = STEADY_GROWTH_FRACTION * warm_rss
    total_growth_allowed = TOTAL_GROWTH_FRACTION * warm_rss
    total = len(results)
    print(f"\nsoak: {CLIENTS} clients, {ended - started:.1f} s, {total} requests "
          f"({total / (ended - started):.0f}/s), {len(errors)} failed, max gap "
          f"{max_gap:.2f} s (allowed {max_gap_allowed:.2f} s: {GAP_FACTOR:g} x the warm-up's "
          f"mean latency {latency * 1000:.1f} ms); warm-up rate {rate:.0f}/s")
    print("soak requests per phase: " + ", ".join(f"{k}={v}" for k, v in per_phase.items())
          + " | per version: " + ", ".join(f"v{k}={v}" for k, v in sorted(per_version.items())))
    print("soak events (s): " + ", ".join(f"{k}={v - started:.1f}"
                                          for k, v in events.items()))
    print(f"soak RSS MB: idle {rss_idle:.0f}, after warm-up {warm_rss:.0f}, end {rss[-1][1]:.0f}"
          f" | " + " | ".join(windows))
    steady_requests = sum(1 for r in results if r[0] >= steady_start)
    last_requests = sum(1 for r in results if r[0] >= half)
    growth = statistics.median(last) - statistics.median(first)
    spread = max(last) - min(last)
    print(f"soak steady state ({ended - steady_start:.1f} s, {steady_requests} requests): RSS "
          f"window 1 {min(first):.1f}-{max(first):.1f} MB (median "
          f"{statistics.median(first):.1f}), window 2 {min(last):.1f}-{max(last):.1f} MB "
          f"(median {statistics.median(last):.1f}); median growth {growth:+.2f} MB, window 2 "
          f"spread {spread:.2f} MB over {last_requests} requests "
          f"({last[-1] - last[0]:+.2f} MB first to last sample); allowed "
          f"{steady_growth_allowed:.2f} MB ({STEADY_GROWTH_FRACTION:.0%} of the RSS after "
          f"warm-up), in all {total_growth_allowed:.0f} MB")

    # -- checks -------------------------------------------------------------------------
    assert alive, log[-3000:]
    assert not errors, errors[:5]
    durations = {name: events[b] - events[a] for name, a, b in phases}
    assert all(per_phase[name] >= MIN_RATE_FRACTION * rate * durations[name]
               for name in per_phase), (per_phase, durations, rate)
    assert max_gap < max_gap_allowed, (max_gap, latency)
    for _, _, version, caption in results:  # each version answers with its own model
        assert caption == expected_caption(RED, NOUN[version]), (version, caption)
    for index in range(CLIENTS):  # a client never goes back to an older version
        versions = [r[2] for r in results if r[1] == index]
        assert versions == sorted(versions), index
    final = [r for r in results if r[0] >= ended - 2.0]
    assert final and {r[2] for r in final} == {3}
    assert states == {1: "END", 2: "AVAILABLE", 3: "AVAILABLE"}, states
    assert len(first) >= 8 and len(last) >= 8, (len(first), len(last))
    assert steady_requests >= MIN_RATE_FRACTION * rate * (ended - steady_start), (
        steady_requests, rate)
    assert spread < steady_growth_allowed, last
    assert growth < steady_growth_allowed, (first, last)
    assert rss[-1][1] - warm_rss < total_growth_allowed, (warm_rss, rss[-1][1])
    assert server.stop() == 0
