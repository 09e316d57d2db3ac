"""benchmarks/optimizer_update.py: Keras's Adam and FusedAdam timed on the tutorial-size decoder."""
from __future__ import annotations

import json
import os

import pytest

from tests.benchmarks import run_benchmark


@pytest.mark.slow
def test_optimizer_update_times_both_adams_on_the_decoder(tmp_path):
    proc = run_benchmark("optimizer_update", ["--precision", "float32", "--repeats", "1",
                                              "--steps", "1"], tmp_path)
    out = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert out["precision"] == "float32" and out["attention_score"] == "general"
    # ShowAttendTell at the tutorial's sizes with general scores: its 16 weight tensors
    assert out["parameters"] == 12_136_841 and out["variables"] == 16
    assert out["keras_ms"] > 0 and out["fused_ms"] > 0
    assert out["ratio"] == pytest.approx(out["keras_ms"] / out["fused_ms"], rel=0.01)
    assert "Adam update" in proc.stdout
    [written] = os.listdir(tmp_path)
    assert written.startswith("optimizer_update-float32-")
