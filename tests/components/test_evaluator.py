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
