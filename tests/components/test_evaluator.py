"""Evaluator: captions through the exported SavedModel, the paired comparison, its metrics."""
import functools
import json
import os

import numpy as np
import pytest

from components.contract import io_utils, schema
from components.contract.artifacts import Artifact
from components.evaluator import stage as evaluator
from pipeline.config import PipelineConfig
from pipeline.runner import StageContext

# Solid-colour test images: the fixture SavedModel captions each "a bright red image", ...
COLORS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (90, 10, 10), (10, 90, 10),
          (10, 10, 90)]


def _examples(tmp_path, count=30):
    """An Examples artifact whose test split holds `count` solid-colour PNGs."""
    import tensorflow as tf

    from tests.serving.fixtures import expected_caption, solid_image
    uri = tmp_path / "examples"
    (uri / "test").mkdir(parents=True)
    path = schema.shard_path(str(uri / "test"), schema.EXAMPLES_PREFIX, 0, 1)
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(count):
            rgb = COLORS[i % len(COLORS)]
            references = [expected_caption(rgb), expected_caption(rgb).replace("a ", "one ", 1)]
            example = schema.encode_example(f"img-{i:03d}", solid_image(rgb), "png", 8, 8,
                                            references)
            writer.write(example.SerializeToString())
    return Artifact(type="Examples", uri=str(uri), counts={"test": count})


def _serving_model(tmp_path, noun):
    """A ServingModel artifact over a fixture SavedModel whose captions end with `noun`."""
    from tests.serving.fixtures import build_fixture_model
    uri = tmp_path / f"serving-{noun}"
    saved = build_fixture_model(str(uri / schema.SAVED_MODEL_DIR), noun=noun)
    decoding = evaluator.decoding_settings(PipelineConfig().eval)
    return Artifact(type="ServingModel", uri=str(uri), properties={
        "digest": io_utils.tree_digest(saved), "decoding": decoding,
        "infra_validation": {"ok": True, "reason": ""}, "model_uri": f"model-{noun}"})


def _evaluate(tmp_path, monkeypatch, candidate, baseline=None, examples=None, **eval_changes):
    # No Java here: the PTB tokenizer and METEOR are the toolkit's, tested elsewhere.
    monkeypatch.setattr(evaluator, "image_stats", functools.partial(evaluator.image_stats,
                                                                    use_java=False))
    inputs = {"serving_model": candidate, "examples": examples or _examples(tmp_path)}
    if baseline is not None:
        inputs["baseline"] = baseline
    run_dir = tmp_path / f"run-{len(os.listdir(tmp_path))}"
    outputs = {name: str(run_dir / name) for name in ("evaluation", "blessing")}
    for folder in outputs.values():
        os.makedirs(folder)
    config = PipelineConfig()
    if eval_changes:
        from components.contract.config import replace_section
        config = replace_section(config, "eval", **eval_changes)
    ctx = StageContext(stage="Evaluator", config=config, inputs=inputs, outputs=outputs,
                       work_dir=str(run_dir), root=str(tmp_path), execution_id=1)
    return evaluator.run(ctx), outputs


def _captions(evaluation_dir, name="captions.jsonl"):
    with open(os.path.join(evaluation_dir, name)) as f:
        return {row["image_id"]: row for row in map(json.loads, f)}


def test_the_evaluation_is_what_single_image_requests_get(tmp_path, monkeypatch):
    candidate = _serving_model(tmp_path, "image")
    examples = _examples(tmp_path)
    result, outputs = _evaluate(tmp_path, monkeypatch, candidate, examples=examples)
    properties = result["evaluation"]["properties"]
    assert properties["export_digest"] == candidate.properties["digest"]
    assert properties["metrics"]["Bleu_4"] == pytest.approx(1.0)
    served = evaluator.ServedFunction(candidate.path(schema.SAVED_MODEL_DIR))
    captions = _captions(outputs["evaluation"])
    from components.evaluator.split_readers import iter_example_batches
    images = [(i, image) for batch in iter_example_batches(examples.uri, "test", 7)
              for i, image in zip(batch["ids"], batch["images"], strict=True)]
    assert len(images) == len(captions) == 30
    for image_id, image in images:
        out = served([image])
        assert captions[image_id]["caption"] == out["caption"][0].decode()
        assert captions[image_id]["score"] == float(out["score"][0])
    # The first push: nothing to compare with, only the minimums apply.
    blessing = result["blessing"]["properties"]
    assert blessing["blessed"] is True and blessing["baseline"] is None


def test_a_worse_model_is_refused_against_the_baseline_with_its_interval(tmp_path, monkeypatch):
    good, bad = _serving_model(tmp_path, "image"), _serving_model(tmp_path, "square")
    examples = _examples(tmp_path)
    result, outputs = _evaluate(tmp_path, monkeypatch, bad, baseline=good, examples=examples)
    blessing = result["blessing"]["properties"]
    assert blessing["blessed"] is False
    assert any(r.startswith("CIDEr: candidate") and "95% interval" in r
               for r in blessing["reasons"]), blessing["reasons"]
    rows = {row["metric"]: row for row in blessing["comparison"]}
    assert rows["Bleu_4"]["difference"] < 0 and rows["Bleu_4"]["interval"][1] < 0
    assert rows["Bleu_4"]["verdict"] == "fail"
    # Both models were captioned on the same images in this run.
    assert set(_captions(outputs["evaluation"], "baseline_captions.jsonl")) == \
        set(_captions(outputs["evaluation"]))
    assert os.path.exists(os.path.join(outputs["blessing"], "NOT_BLESSED"))
    # The better model against the worse one passes.
    result, _ = _evaluate(tmp_path, monkeypatch, good, baseline=bad, examples=examples)
    assert result["blessing"]["properties"]["blessed"] is True


def test_the_same_model_blesses_itself(tmp_path, monkeypatch):
    one, other = _serving_model(tmp_path, "image"), _serving_model(tmp_path / "b", "image")
    result, _ = _evaluate(tmp_path, monkeypatch, one, baseline=other)
    blessing = result["blessing"]["properties"]
    assert blessing["blessed"] is True
    rows = {row["metric"]: row for row in blessing["comparison"]}
    assert rows["CIDEr"]["difference"] == 0 and rows["CIDEr"]["interval"] == [0, 0]


def test_a_baseline_exported_with_other_decoding_is_exported_again(tmp_path, monkeypatch):
    from components.contract import export_model
    candidate = _serving_model(tmp_path, "image")
    baseline = _serving_model(tmp_path, "square")
    baseline = Artifact(type="ServingModel", uri=baseline.uri, properties={
        **baseline.properties, "decoding": {"beam_size": 7, "max_length": 5,
                                            "length_normalization": 0.0},
        "encoder_uri": "e", "vocabulary_uri": "v"})
    exported = []

    def fake_export(path, sources, *args, **kwargs):
        from tests.serving.fixtures import build_fixture_model
        exported.append((sources.model_uri, sources.decoding))
        build_fixture_model(path, noun="circle")
    monkeypatch.setattr(evaluator, "export", fake_export)
    result, _ = _evaluate(tmp_path, monkeypatch, candidate, baseline=baseline)
    assert exported == [("model-square", candidate.properties["decoding"])]
    properties = result["evaluation"]["properties"]
    assert any("exported again with this run's decoding" in n for n in properties["notes"])
    assert export_model.decoding_settings(PipelineConfig().eval) == properties["decoding"]


def test_annotation_batches_stream_every_record_once(tmp_path):
    from components.evaluator.split_readers import iter_annotation_batches, read_annotations
    from tests.components.trainer_worker import write_tiny_artifacts
    uri, _ = write_tiny_artifacts(str(tmp_path), num_train=11, num_val=2)
    batches = list(iter_annotation_batches(uri, "train", 4))
    assert [len(b["ids"]) for b in batches] == [4, 4, 3]
    assert all(b["annotations"].dtype == np.float32 and b["annotations"].shape[1:] == (9, 8)
               and len(b["references"]) == len(b["objects"]) == len(b["ids"]) for b in batches)
    ids = [i for b in batches for i in b["ids"]]
    whole = read_annotations(uri, "train")
    assert sorted(ids) == whole["ids"] and len(set(ids)) == 11
    streamed = dict(zip(ids, np.concatenate([b["annotations"] for b in batches]), strict=True))
    for image_id, grid in zip(whole["ids"], whole["annotations"], strict=True):
        assert np.array_equal(streamed[image_id], grid)
    assert [len(b["ids"]) for b in iter_annotation_batches(uri, "train", 4, max_examples=6)] \
        == [4, 2]


def test_figure_keeper_keeps_the_smallest_ids_whatever_the_order():
    from components.evaluator.stage import FigureKeeper
    keeper = FigureKeeper(3)
    for image_id in ("img-5", "img-2", "img-9", "img-1", "img-7", "img-3"):
        keeper.offer(image_id, ["a", "b"], np.ones((6, 2, 2)), [image_id])
    kept = keeper.entries()
    assert [e["image_id"] for e in kept] == ["img-1", "img-2", "img-3"]
    assert kept[0]["attention"].shape == (2, 2, 2)  # trimmed to the words
    assert FigureKeeper(0).entries() == []


def test_the_evaluation_reports_the_end_of_caption_check(monkeypatch):
    captions = {"img-1": "a red circle with a", "img-2": "a red circle on the left",
                "img-3": "", "img-4": "a blue square to the right of the"}
    split = evaluator.CaptionedSplit(served=None, request_size=1)
    split.rows = [{"image_id": i, "caption": c, "score": -1.0,
                   "references": ["a red circle on the left", "a blue square"]}
                  for i, c in captions.items()]
    monkeypatch.setattr(evaluator, "image_stats", functools.partial(evaluator.image_stats,
                                                                    use_java=False))
    metrics = evaluator.score(split)
    assert metrics["tokenizer"] == "simple"
    expected = {"dangling_endings": 2, "dangling_ending_rate": 2 / 3, "empty_captions": 1}
    assert {k: metrics[k] for k in expected} == expected
    assert set(evaluator.REPORTED_METRICS) == set(expected)
    assert metrics["num_test_images"] == 4 and "Bleu_4" in metrics
