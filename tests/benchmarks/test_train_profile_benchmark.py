"""benchmarks/train_profile.py: the demo-size step timed, then its op types from a real trace."""
from __future__ import annotations

import json
import os

import pytest

from tests.benchmarks import run_benchmark


@pytest.mark.slow
@pytest.mark.parametrize("size_set", ["demo", "tutorial"])
def test_train_profile_times_the_step_and_ranks_op_types(tmp_path, size_set):
    proc = run_benchmark("train_profile", ["--batch", "8", "--repeats", "2", "--steps", "1",
                                           "--profiled-steps", "2", "--top", "6",
                                           "--sizes", size_set], tmp_path)
    out = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert out["sizes"]["batch"] == 8 and out["precision"] == "float32"
    assert out["size_set"] == size_set
    assert out["sizes"]["dim"] == {"demo": 130, "tutorial": 2048}[size_set]
    assert len(out["step_ms_all"]) == 2 and out["step_ms"] > 0
    assert out["examples_per_s"] == pytest.approx(8000 / out["step_ms"], rel=0.01)
    ops = out["op_types"]
    # Ranked by time; the executor's own spans are not op types; the LSTM's matmuls are there.
    assert 0 < len(ops) <= 6
    times = [row["ms_per_step"] for row in ops.values()]
    assert times == sorted(times, reverse=True)
    assert not any("::" in name or name == "Process" for name in ops)
    assert any("MatMul" in name for name in ops), list(ops)
    assert 0 < sum(row["share"] for row in ops.values()) <= 1.0001
    [written] = os.listdir(tmp_path)
    assert written.startswith({"demo": "train_profile-float32-",
                               "tutorial": "train_profile-tutorial-float32-"}[size_set])
