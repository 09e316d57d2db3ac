"""Evaluator: blessing on thresholds and regression."""
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


def test_regression_against_the_pushed_model():
    pushed = {"Bleu_4": 0.80, "CIDEr": 5.5, "METEOR": 0.5}
    ok, _ = bless({"Bleu_4": 0.77, "CIDEr": 5.5, "METEOR": 0.5}, {}, 0.05, pushed)
    assert ok  # within max_regression
    ok, reasons = bless({"Bleu_4": 0.74, "CIDEr": 5.5, "METEOR": 0.5}, {}, 0.05, pushed)
    assert not ok and "Bleu_4" in reasons[0] and "regressed" in reasons[0]
    ok, reasons = bless({"Bleu_4": 0.74, "CIDEr": 4.0, "METEOR": 0.5}, {"Bleu_4": 0.9}, 0.05,
                        pushed)
    assert not ok and len(reasons) == 3


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
