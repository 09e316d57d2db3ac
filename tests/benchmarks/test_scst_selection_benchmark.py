"""benchmarks/scst_selection.py: SCST's gain on the images that chose it, and on others."""
import json
import os
import shutil

import pytest

from components import trainer
from tests.benchmarks import load_benchmark
from tests.components import test_trainer
from tests.components.test_trainer import _config, _ctx

source = test_trainer.source  # the tiny Annotations and Vocabulary (a module-scoped fixture)

REFERENCES = [[f"a {c} {s} on a plain background", f"one {c} {s}"]
              for c, s in [("red", "circle"), ("blue", "square"), ("green", "star"),
                           ("yellow", "heart"), ("purple", "ring"), ("orange", "cross")] * 4]
START = [f"a {refs[1].split()[1]} shape" for refs in REFERENCES]   # the colour only
TUNED = [refs[1] if i % 2 else START[i] for i, refs in enumerate(REFERENCES)]


def test_gains_and_the_spread_of_subsets():
    selection = load_benchmark("scst_selection")
    out = selection.gains(REFERENCES, START, TUNED, {"odd": range(1, 24, 2),
                                                     "even": range(0, 24, 2), "none": []})
    assert set(out) == {"odd", "even"}              # an empty set is left out
    assert out["odd"]["images"] == 12 and out["odd"]["scst"] > out["odd"]["start"] >= 0
    assert out["even"]["scst"] == out["even"]["start"]   # the same captions
    spread = selection.subset_spread(REFERENCES, START, TUNED, 8, draws=30, seed=0)
    assert spread["images"] == 8 and spread["draws"] == 30 and spread["sd"] > 0
    low, high = spread["interval"]
    assert low <= spread["mean"] <= high


def test_the_script_scores_the_stops_own_images_the_other_val_images_and_test(
        source, tmp_path, capfd):
    # The tiny Annotations have no test split: a copy whose test split is its val split.
    annotations = str(tmp_path / "annotations")
    shutil.copytree(source["annotations"].uri, annotations)
    shutil.copytree(os.path.join(annotations, "val"), os.path.join(annotations, "test"))
    config = _config(epochs=2, objective="scst", scst_epochs=2, scst_samples=3,
                     scst_learning_rate=5e-3, scst_require_converged=False)
    ctx = _ctx(source, str(tmp_path), config)
    props = trainer.run(ctx)["model"]["properties"]
    model = ctx.outputs["model"]
    with open(os.path.join(model, "artifact.json"), "w") as f:
        json.dump({"properties": props}, f)
    summary = {"stages": {"Preprocess": {"outputs": {"annotations": annotations,
                                                     "vocabulary": source["vocabulary"].uri}},
                          "Trainer": {"outputs": {"model": model}}}}
    (tmp_path / "run_summary.json").write_text(json.dumps(summary))
    (tmp_path / "pipeline_config.json").write_text(
        json.dumps({"resolved": {"train": {"val_examples": 4}}}))
    capfd.readouterr()
    selection = load_benchmark("scst_selection")
    assert selection.main(["--root", str(tmp_path), "--draws", "5"]) == 0
    run = json.loads(capfd.readouterr().out.strip().splitlines()[0])
    assert (run["selection"]["images"], run["val_rest"]["images"], run["test"]["images"]) == (
        4, 4, 8)
    assert run["subsets"]["images"] == 4 and run["subsets"]["draws"] == 5
    # The selection is the very set the SCST stop scored (float32 here, as in the script).
    logged = props["scst"]
    assert run["selection"]["start"] == pytest.approx(logged["start_cider"], abs=1e-4)
    if logged["best_epoch"] >= 0:
        assert run["selection"]["scst"] == pytest.approx(logged["best_cider"], abs=1e-4)
