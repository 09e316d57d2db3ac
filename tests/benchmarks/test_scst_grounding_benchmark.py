"""benchmarks/scst_grounding.py on tiny data: cross-entropy, then plain and anchored SCST from its Model."""
from __future__ import annotations

import json
import os

import pytest

from tests.benchmarks import load_benchmark, run_benchmark
from tests.benchmarks.test_scst_benchmark import TINY, _artifact


@pytest.mark.slow
def test_plain_and_anchored_scst_are_compared_with_the_same_cross_entropy_model(tmp_path):
    root, results = tmp_path / "root", tmp_path / "results"
    results.mkdir()
    proc = run_benchmark("scst_grounding", ["--config", "tiny", "--root", root, "--attention",
                                            "soft", "--seeds", "3", "--anchor-weights", "0.5"],
                         results, TINY)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 3, proc.stdout[-3000:]  # plain, anchored, then the host
    plain, anchored, host = lines
    assert set(host) == {"cpu", "bf16_native"}
    assert (plain["variant"], anchored["variant"]) == ("plain", "anchor0.5")
    assert (plain["attention_kl"], anchored["attention_kl"]) == (0.0, 0.5)

    # Each SCST run is its own copy of the cross-entropy root, started from that root's Model.
    xe_dir = os.path.join(root, "soft-seed3", "xe")
    for out, name in ((plain, "plain"), (anchored, "anchor0.5")):
        props = _artifact(out["model"])["properties"]
        assert props["objective"] == "scst" and props["scst"]["attention_kl"] == out["attention_kl"]
        copy = os.path.join(root, "soft-seed3", name)
        assert out["model"].startswith(copy + os.sep)
        start = props["scst"]["start"].replace("${root}", copy)
        assert start.startswith(os.path.join(copy, "Trainer") + os.sep), start
        # The Evaluator compared it with the cross-entropy model (pushed in the copied root).
        # (one test image here: the grounding rates may have nothing to compare)
        assert {"CIDEr", "Bleu_4", "METEOR"} <= set(out["versus_xe"])
        cider = out["versus_xe"]["CIDEr"]
        assert len(cider["interval"]) == 2 and cider["interval"][0] <= cider["difference"]
        assert out["targets"]["cider_plus_15pct"] == ((cider["relative"] or 0) >= 0.15)
        size = out["versus_xe"].get("size_accuracy") or {}
        assert out["targets"]["size_accuracy_not_lower"] == (
            None if not size.get("interval") else size["interval"][1] >= 0)
    assert os.path.isdir(xe_dir)

    [written] = os.listdir(results)
    assert written.startswith("scst_grounding-soft-")
    with open(results / written) as f:
        record = json.load(f)
    [run] = record["figures"]["runs"]
    assert run["seed"] == 3 and set(run["scst"]) == {"plain", "anchor0.5"}
    assert run["xe"]["metrics"]["CIDEr"] is not None and run["xe"]["versus_xe"] == {}


def test_test_images_enlarge_the_test_split_and_keep_train_and_val():
    from pipeline.config import load_config

    overrides = load_benchmark("scst_grounding").test_split("scenes", [], 2000)
    before, after = load_config("scenes").data, load_config("scenes", overrides).data
    counts = lambda d: (d.num_images * (1 - d.val_fraction - d.test_fraction),  # noqa: E731
                        d.num_images * d.val_fraction, d.num_images * d.test_fraction)
    (train0, val0, _), (train1, val1, test1) = counts(before), counts(after)
    assert (round(train1), round(val1), round(test1)) == (round(train0), round(val0), 2000)


def test_an_scst_override_names_its_variant_by_key_and_value():
    short = load_benchmark("scst_grounding")._short
    assert short("train.scst_xe_weight=0.1") == "scst_xe_weight=0.1"
    assert short("train.scst_samples=8") == "scst_samples=8"
