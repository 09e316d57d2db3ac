"""benchmarks/serving_load.py: the CPUs it pins, and a level's figures from made-up requests."""
from __future__ import annotations

import argparse
import os

import pytest

from tests.benchmarks import load_benchmark


def test_cpu_lists_are_parsed_and_checked_against_the_host():
    parse_cpus = load_benchmark("serving_load").parse_cpus
    first = min(os.sched_getaffinity(0))
    assert parse_cpus(str(first)) == {first}
    assert parse_cpus(f"{first}-{first}") == {first}
    with pytest.raises(argparse.ArgumentTypeError, match="not this host's"):
        parse_cpus("100000")
    with pytest.raises(argparse.ArgumentTypeError, match="write CPU numbers"):
        parse_cpus("zero")


def test_a_level_tells_the_requests_sent_while_a_version_loaded_apart():
    summarize = load_benchmark("serving_load").summarize
    # (api, scheduled, sent, latency s, outcome); a version published at t=100.
    calm = [("grpc", t, t, 0.020, "OK") for t in range(10, 60)] + \
           [("rest", t, t, 0.002, "RESOURCE_EXHAUSTED") for t in range(10, 60)]
    loading = [("grpc", t, t, 0.900, "OK") for t in range(100, 105)] + \
              [("rest", t, t, 0.400, "RESOURCE_EXHAUSTED") for t in range(100, 105)]
    samples = [(float(t), 600.0, 20) for t in range(0, 200)]
    level = summarize(calm + loading, 0, samples, 200.0, 0.55, [100.0], 2.0)
    assert level["p99_ms"] == pytest.approx(900.0)  # every request counts in the level
    assert level["away_from_swaps"] == {"sent": 100, "p99_ms": pytest.approx(20.0),
                                        "refusal_p50_p99_ms": [pytest.approx(2.0),
                                                               pytest.approx(2.0)]}
    assert level["refusal_p50_p99_ms_by_api"]["rest"][1] == pytest.approx(400.0)
