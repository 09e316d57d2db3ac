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
    assert result["ratio"] > 0 and result["ours"]["tokens_per_s"] > 0
    sizes = result["sizes"]
    # general: fewer matmul FLOPs than the paper's additive MLP (W's gradient is hoisted)
    assert result["ours"]["gflop_per_step"] == pytest.approx(
        bench.model_flops(sizes, kind=attention, score=score) / 1e9, abs=0.01)
    assert bench.model_flops(sizes, score="general") < bench.model_flops(sizes)
