"""benchmarks/scst.py on tiny data: two pipeline runs, the second fine-tuning the first's Model."""
from __future__ import annotations

import json
import os

import pytest

from tests.benchmarks import run_benchmark

# The tiny config, smaller still: one epoch of each phase on 24 images, an untrained
# encoder (no EncoderTrainer run), no figures.
TINY = ["data.num_images=24", "encoder.train=false", "train.epochs=1", "train.scst_epochs=1",
        "train.scst_samples=2", "train.scst_require_converged=false", "eval.num_figures=0"]
METRICS = ("Bleu_1", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "dangling_ending_rate")


def _artifact(model_dir: str) -> dict:
    with open(os.path.join(model_dir, "artifact.json")) as f:
        return json.load(f)


@pytest.mark.slow
def test_scst_benchmark_runs_cross_entropy_then_scst_from_its_model(tmp_path):
    root, results = tmp_path / "root", tmp_path / "results"
    results.mkdir()
    proc = run_benchmark("scst", ["--config", "tiny", "--root", root, "--attention", "soft"],
                         results, TINY)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 2, proc.stdout[-3000:]  # one per attention, then the host
    out, host = lines
    assert set(host) == {"cpu", "bf16_native"}
    assert (out["config"], out["attention"], out["overrides"]) == ("tiny", "soft", TINY)

    # Two Trainer executions: cross-entropy, then SCST started from the first's Model.
    xe, scst = _artifact(out["xe_model"]), _artifact(out["scst_model"])
    assert out["xe_model"] != out["scst_model"]
    assert xe["properties"]["objective"] == "xe"
    assert scst["properties"]["objective"] == "scst"
    start = scst["properties"]["scst"]["start"].replace("${root}", str(root))
    assert os.path.dirname(start) == out["xe_model"]
    assert all(out["trainer_seconds"][k] > 0 for k in ("xe", "scst"))

    # Both models evaluated; the changes and targets follow from the two metric sets.
    for phase in ("xe", "scst"):
        assert all(isinstance(out[phase][m], (int, float)) for m in METRICS), out[phase]
    for metric in METRICS:
        before, after = out["xe"][metric], out["scst"][metric]
        expected = None if before == 0 else round((after - before) / abs(before), 4)
        assert out["relative_change"][metric] == expected, metric
    change = out["relative_change"]
    assert out["targets"] == {
        "cider_plus_8pct": (change["CIDEr"] or 0.0) >= 0.08,
        "bleu4_within_2pct": (change["Bleu_4"] or 0.0) >= -0.02,
        "dangling_not_up": out["scst"]["dangling_ending_rate"]
        <= out["xe"]["dangling_ending_rate"]}

    # The run is recorded where BENCHMARK_RESULTS_DIR says.
    [written] = os.listdir(results)
    assert written.startswith("scst-")
    with open(results / written) as f:
        record = json.load(f)
    assert record["figures"]["attention"]["soft"]["scst_model"] == out["scst_model"]
    assert "--config tiny" in record["command"]
