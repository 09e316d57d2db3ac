"""benchmarks/scst.py: the two runs it makes per attention and how it judges the targets."""
from __future__ import annotations

import pytest

from pipeline import config as config_lib
from tests.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("scst")


def _summary(model, **metrics):
    return {"stages": {"Trainer": {"outputs": {"model": model}, "seconds": 10.0}},
            "metrics": metrics}


def test_cross_entropy_then_scst_from_its_model_and_the_targets(bench, monkeypatch):
    runs = []
    results = [_summary("/r/Trainer/4/model", CIDEr=1.0, Bleu_4=0.30, dangling_ending_rate=0.02),
               _summary("/r/Trainer/7/model", CIDEr=1.09, Bleu_4=0.295, dangling_ending_rate=0.01)]

    def fake_run(root, config, overrides):
        runs.append(overrides)
        config_lib.load_config(config, overrides)   # every override is valid config
        return results[len(runs) - 1]

    monkeypatch.setattr(bench, "_run", fake_run)
    out = bench.compare("/r", "scenes", "hard", ["train.scst_epochs=2"])
    assert runs[0] == ["model.attention=hard", "train.scst_epochs=2", "train.objective=xe"]
    assert runs[1][-2:] == ["train.objective=scst", "train.init_model=/r/Trainer/4/model"]
    assert out["relative_change"]["CIDEr"] == pytest.approx(0.09)
    assert out["targets"] == {"cider_plus_8pct": True, "bleu4_within_2pct": True,
                              "dangling_not_up": True}
    runs.clear()
    results[1] = _summary("/r/Trainer/7/model", CIDEr=1.05, Bleu_4=0.29,
                          dangling_ending_rate=0.03)
    out = bench.compare("/r", "scenes", "soft", [])
    assert out["targets"] == {"cider_plus_8pct": False, "bleu4_within_2pct": False,
                              "dangling_not_up": False}
