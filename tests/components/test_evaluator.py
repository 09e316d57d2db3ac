"""Evaluator: blessing on thresholds and regression, and the metrics it records."""
import os

from components.evaluator import bless


def test_blessed_when_thresholds_pass_and_first_push():
    ok, reasons = bless({"Bleu_4": 0.8, "CIDEr": 5.2}, {"Bleu_4": 0.75, "CIDEr": 5.0}, 0.05, None)
    assert ok and reasons == []


def test_not_blessed_below_a_threshold():
    ok, reasons = bless({"Bleu_4": 0.7, "CIDEr": 5.2}, {"Bleu_4": 0.75, "CIDEr": 5.0}, 0.05, None)
    assert not ok and len(reasons) == 1 and "Bleu_4 = 0.7000 is below the threshold 0.75" in reasons[0]


def test_missing_metric_fails_its_threshold():
    ok, reasons = bless({"Bleu_4": 0.9, "grounding": None}, {"grounding": 0.5}, 0.05, None)
    assert not ok and "grounding is not available" in reasons[0]


def test_annotation_batches_stream_every_record_once(tmp_path):
    import numpy as np
    from components.evaluator import iter_annotation_batches, read_annotations
    from tests.components.trainer_worker import write_tiny_artifacts
    uri, _ = write_tiny_artifacts(str(tmp_path), num_train=11, num_val=2)
    batches = list(iter_annotation_batches(uri, "train", 4))
    assert [len(b["ids"]) for b in batches] == [4, 4, 3]
    assert all(b["annotations"].dtype == np.float32 and b["annotations"].shape[1:] == (9, 8)
               and len(b["references"]) == len(b["objects"]) == len(b["ids"]) for b in batches)
    ids = [i for b in batches for i in b["ids"]]
    whole = read_annotations(uri, "train")
    assert sorted(ids) == whole["ids"] and len(set(ids)) == 11
    streamed = dict(zip(ids, np.concatenate([b["annotations"] for b in batches])))
    for image_id, grid in zip(whole["ids"], whole["annotations"]):
        assert np.array_equal(streamed[image_id], grid)
    assert [len(b["ids"]) for b in iter_annotation_batches(uri, "train", 4, max_examples=6)] \
        == [4, 2]


def test_figure_keeper_keeps_the_smallest_ids_whatever_the_order():
    import numpy as np
    from components.evaluator import FigureKeeper
    keeper = FigureKeeper(3)
    for image_id in ("img-5", "img-2", "img-9", "img-1", "img-7", "img-3"):
        keeper.offer(image_id, ["a", "b"], np.ones((6, 2, 2)), [image_id])
    kept = keeper.entries()
    assert [e["image_id"] for e in kept] == ["img-1", "img-2", "img-3"]
    assert kept[0]["attention"].shape == (2, 2, 2)  # trimmed to the words
    assert FigureKeeper(0).entries() == []


def test_the_evaluation_reports_the_end_of_caption_check(tmp_path, monkeypatch, capsys):
    # The real run() with the decoding stubbed: the captions are given, the scoring is real.
    import functools
    import json
    import keras
    from components import evaluator, schema
    from components.artifacts import Artifact
    from pipeline.config import PipelineConfig
    from pipeline.runner import StageContext
    captions = {"img-1": "a red circle with a", "img-2": "a red circle on the left",
                "img-3": "", "img-4": "a blue square to the right of the"}
    rows = [{"image_id": i, "caption": c, "score": -1.0,
             "references": ["a red circle on the left", "a blue square"]}
            for i, c in captions.items()]
    monkeypatch.setattr(keras.saving, "load_model", lambda path: None)
    monkeypatch.setattr(schema, "read_vocabulary", lambda uri: ["<pad>"])
    monkeypatch.setattr(schema, "model_file", lambda uri: uri)
    monkeypatch.setattr(evaluator, "caption_test_split", lambda *args: (rows, None, 0.5))
    monkeypatch.setattr(evaluator, "coco_metrics",
                        functools.partial(evaluator.coco_metrics, use_java=False))
    inputs = {name: Artifact(type=name, uri=str(tmp_path / name))
              for name in ("model", "annotations", "vocabulary")}
    # The pushed model never dangled: a lower-is-better diagnostic is no regression check.
    inputs["baseline"] = Artifact(type="Evaluation", uri=str(tmp_path / "baseline"), properties={
        "metrics": {"dangling_ending_rate": 0.0, "dangling_endings": 0}, "model_uri": "m0"})
    outputs = {"evaluation": str(tmp_path / "evaluation"), "blessing": str(tmp_path / "blessing")}
    for folder in outputs.values():
        os.makedirs(folder)
    ctx = StageContext(stage="Evaluator", config=PipelineConfig(), inputs=inputs,
                       outputs=outputs, work_dir=str(tmp_path), root=str(tmp_path),
                       execution_id=1)
    result = evaluator.run(ctx)
    expected = {"dangling_endings": 2, "dangling_ending_rate": 2 / 3, "empty_captions": 1}
    metrics = result["evaluation"]["properties"]["metrics"]
    assert {k: metrics[k] for k in expected} == expected
    assert set(evaluator.REPORTED_METRICS) == set(expected)
    with open(os.path.join(outputs["evaluation"], "metrics.json")) as f:
        written = json.load(f)["metrics"]
    assert {k: written[k] for k in expected} == expected
    assert result["blessing"]["properties"]["blessed"] is True
    logged = [line.split("[Evaluator] ")[-1] for line in capsys.readouterr().err.splitlines()
              if "[Evaluator] {" in line]  # the scoring bar may share the line
    shown = json.loads(logged[-1])
    assert shown["dangling_ending_rate"] == round(2 / 3, 4) and shown["dangling_endings"] == 2
    assert shown["empty_captions"] == 1 and "Bleu_4" in shown
