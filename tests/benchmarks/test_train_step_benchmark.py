"""benchmarks/train_step.py: its JSON line in the same precision and against a float32 baseline."""
from __future__ import annotations

import keras
import pytest

from tests.benchmarks import load_benchmark

KEPT_KEYS = ("ratio", "ratio_cpu_time", "precision", "bf16_native", "machine",
             "baseline_precision", "peak_matmul_gflops")
QUICK = ["--steps", "1", "--repeats", "1", "--warmup", "0", "--batch", "2"]


@pytest.fixture(autouse=True)
def restore_policy():
    yield
    keras.mixed_precision.set_global_policy("float32")


def _check_fractions(result, ours_peak, baseline_peak):
    for name, peak in (("ours", ours_peak), ("baseline", baseline_peak)):
        entry = result[name]
        assert entry["fraction_of_peak"] == pytest.approx(entry["achieved_gflops"] / peak,
                                                          rel=0.02, abs=1e-3)
    assert result["ratio"] == pytest.approx(
        result["ours"]["tokens_per_s"] / result["baseline"]["tokens_per_s"], rel=1e-2)


@pytest.mark.slow
def test_same_precision_by_default():
    result = load_benchmark("train_step").main(QUICK + ["--precision", "float32"])
    assert all(key in result for key in KEPT_KEYS)
    assert result["precision"] == result["baseline_precision"] == "float32"
    assert "baseline_peak_matmul_gflops" not in result
    peak = result["peak_matmul_gflops"]
    _check_fractions(result, peak, peak)


@pytest.mark.slow
def test_float32_baseline_is_measured_against_the_float32_peak():
    result = load_benchmark("train_step").main(
        QUICK + ["--precision", "mixed_bfloat16", "--baseline-precision", "float32"])
    assert all(key in result for key in KEPT_KEYS)
    assert (result["precision"], result["baseline_precision"]) == ("mixed_bfloat16", "float32")
    _check_fractions(result, result["peak_matmul_gflops"],
                     result["baseline_peak_matmul_gflops"])
