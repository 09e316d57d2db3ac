"""benchmarks/attention_types.py on tiny data: two models, one of them with two seeds, one root."""
from __future__ import annotations

import json
import os

import pytest

from tests.benchmarks import run_benchmark

# The tiny config, smaller still: one epoch on 24 images, an untrained encoder.
TINY = ["data.num_images=24", "encoder.train=false", "train.epochs=1", "eval.num_figures=2"]


def _artifact(model_dir: str) -> dict:
    with open(os.path.join(model_dir, "artifact.json")) as f:
        return json.load(f)


@pytest.mark.slow
def test_attention_types_runs_each_model_and_seed_on_one_root(tmp_path):
    from PIL import Image
    root, results, figure = tmp_path / "root", tmp_path / "results", tmp_path / "types.png"
    results.mkdir()
    proc = run_benchmark(
        "attention_types",
        ["--config", "tiny", "--root", root, "--models", "soft:general,spatial_transformer",
         "--seeds", "0,1", "--second-seed", "spatial_transformer", "--figure", figure,
         "--figure-images", "2", "--latency-images", "3", "--latency-rounds", "2"],
        results, TINY)
    out = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    runs = out["runs"]
    assert [(r["model"], r["seed"]) for r in runs] == [
        ("soft:general", 0), ("spatial_transformer", 0), ("spatial_transformer", 1)]

    # Each run is its own Trainer execution with the model's settings and seed.
    assert all(r["model_uri"].startswith(str(root)) for r in runs)
    trained = []
    for run in runs:
        assert run["trainer_status"] == "ran"
        summary_model = _artifact(run["model_uri"])
        config = summary_model["config"]
        attention = run["model"].partition(":")[0]
        assert config["model"]["attention"] == attention
        assert config["train"]["seed"] == run["seed"]
        trained.append(summary_model["fingerprint"])
        assert run["steps"] > 0 and run["ms_per_step"] > 0
        assert run["decode_ms_per_image"] > 0
        assert all(isinstance(run["metrics"][k], float) for k in ("Bleu_4", "CIDEr", "METEOR"))
    assert len(set(trained)) == 3
    assert runs[0]["guard_rate"] is None and runs[1]["guard_rate"] is not None

    # The table has a row per run; the figure stacks a row per first-seed model.
    assert proc.stdout.count("| spatial_transformer |") == 2
    assert out["figure"]["image_ids"] and len(out["figure"]["image_ids"]) <= 2
    rows = []
    for run in runs[:2]:
        heights = []
        for image_id in out["figure"]["image_ids"]:
            with Image.open(os.path.join(run["figures"], image_id + ".png")) as tile:
                heights.append(tile.height)
        rows.append(max(heights))
    with Image.open(figure) as sheet:
        assert sheet.height == sum(rows)
    # The exports timed side by side: the first seed of each model, against the first model.
    latency = out["latency"]
    assert list(latency) == ["soft:general seed 0", "spatial_transformer seed 0"]
    assert latency["soft:general seed 0"]["ratio"] == 1.0
    assert all(row["ms"] > 0 and row["ratio"] > 0 for row in latency.values())
    [written] = os.listdir(results)
    assert written.startswith("attention_types-tiny-")

