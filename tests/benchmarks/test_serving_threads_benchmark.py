"""benchmarks/serving_threads.py: an export timed with TensorFlow's pools and with one thread."""
from __future__ import annotations

import json
import os

import pytest

from tests.benchmarks import run_benchmark


@pytest.mark.slow
def test_serving_threads_times_an_export_both_ways(tmp_path):
    proc = run_benchmark("serving_threads", ["--encoders", "demo", "--repeats", "1",
                                             "--calls", "2", "--max-length", "4"], tmp_path)
    out = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    row = out["encoders"]["demo"]
    assert row["encoder_gflops"] == pytest.approx(0.067, abs=0.005)  # the demo's small CNN
    assert row["default_ms"] > 0 and row["one_thread_ms"] > 0
    assert row["speedup"] == pytest.approx(row["default_ms"] / row["one_thread_ms"], rel=0.01)
    assert out["max_length"] == 4 and "CPU:" in proc.stdout
    [written] = os.listdir(tmp_path)
    assert written.startswith("serving_threads-")
