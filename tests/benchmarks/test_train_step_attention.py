"""benchmarks/train_step.py --attention / --attention-score: another decoder against the tutorial."""
from __future__ import annotations

import keras
import pytest

from tests.benchmarks import load_benchmark

QUICK = ["--steps", "1", "--repeats", "1", "--warmup", "0", "--batch", "2",
         "--precision", "float32"]


@pytest.fixture(autouse=True)
def restore_policy():
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.slow
@pytest.mark.parametrize("flags,attention,score", [
    (["--attention-score", "general"], "soft", "general"),
    (["--attention", "spatial_transformer"], "spatial_transformer", "additive")])
def test_the_chosen_attention_is_timed_against_the_tutorial(flags, attention, score):
    bench = load_benchmark("train_step")
    result = bench.main(QUICK + flags)
    assert (result["attention"], result["attention_score"]) == (attention, score)
    sizes = result["sizes"]
    # What was asked: one repeat of one step at batch 2, the same precision on both sides.
    assert (sizes["batch"], result["steps"], result["repeats"]) == (2, 1, 1)
    assert result["precision"] == result["baseline_precision"] == "float32"
    tokens = 2 * (sizes["length"] - 1)  # the caption's words after <start>
    assert result["tokens_per_step"] == tokens
    # Each side's figures follow from its one timed repeat (rounded: step_s to 0.1 ms).
    for name in ("ours", "baseline"):
        entry = result[name]
        assert len(entry["step_s_all"]) == 1 and entry["step_s"] == entry["step_s_all"][0]
        assert entry["step_s"] > 0 and entry["cpu_s_per_step"] > 0
        assert entry["tokens_per_s"] == pytest.approx(tokens / entry["step_s"], rel=0.02)
        assert entry["tokens_per_cpu_s"] == pytest.approx(tokens / entry["cpu_s_per_step"],
                                                          rel=0.02)
        assert entry["achieved_gflops"] == pytest.approx(
            entry["gflop_per_step"] / entry["step_s"], rel=0.02, abs=0.1)
    assert result["baseline"]["gflop_per_step"] == pytest.approx(
        bench.baseline_flops(**sizes) / 1e9, abs=0.01)
    # The ratios are ours over the tutorial's, from those figures.
    assert result["ratio"] == pytest.approx(
        result["ours"]["tokens_per_s"] / result["baseline"]["tokens_per_s"], rel=0.01)
    assert result["ratio_cpu_time"] == pytest.approx(
        result["ours"]["tokens_per_cpu_s"] / result["baseline"]["tokens_per_cpu_s"], rel=0.01)
    # general: fewer matmul FLOPs than the paper's additive MLP (W's gradient is hoisted)
    assert result["ours"]["gflop_per_step"] == pytest.approx(
        bench.model_flops(sizes, kind=attention, score=score) / 1e9, abs=0.01)
    assert bench.model_flops(sizes, score="general") < bench.model_flops(sizes)
