"""Paired bootstrap of the blessing metrics, and the Blessing's decision."""
import random
import sys
import warnings

import numpy as np
import pytest

from components.contract.config import EvalConfig
from components.evaluator.metrics.blessing import blessing_decision, format_rows
from components.evaluator.metrics.bootstrap import (
    METRICS,
    ImageStats,
    bleu_stats,
    corpus_bleu,
    corpus_meteor,
    image_stats,
    metric_values,
    paired_bootstrap,
)
from components.evaluator.metrics.grounding import COUNT_KEYS, grounding_counts, grounding_metrics
from tests.tools import require_java

COLORS = ("red", "blue", "green", "yellow", "purple", "white")
SHAPES = ("circle", "square", "triangle", "star", "cross", "ring")
RELATIONS = ("above", "below", "left of", "right of", "next to")


def _scenes(n, seed=0):
    """n images: id -> 5 references describing two objects and a relation."""
    rng = random.Random(seed)
    refs = {}
    for k in range(n):
        (c1, c2), (s1, s2) = rng.sample(COLORS, 2), rng.sample(SHAPES, 2)
        rel = rng.choice(RELATIONS)
        refs[f"img-{k:05d}"] = [f"a {c1} {s1} {rel} a {c2} {s2}",
                                f"the {c1} {s1} is {rel} the {c2} {s2}",
                                f"a {c2} {s2} and a {c1} {s1}",
                                f"there is a {c1} {s1} {rel} a {c2} {s2}",
                                f"{c1} {s1} {rel} {c2} {s2}"]
    return refs


def _noisy(refs, seed, swaps=1):
    """Each image's first reference with `swaps` words replaced at random."""
    rng = random.Random(seed)
    vocab = COLORS + SHAPES + ("a", "the", "above", "below")
    out = {}
    for image_id, texts in refs.items():
        words = texts[0].split()
        for _ in range(swaps):
            words[rng.randrange(len(words))] = rng.choice(vocab)
        out[image_id] = " ".join(words)
    return out


def _stats(predictions, refs, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return image_stats(predictions, refs, use_java=kwargs.pop("use_java", False), **kwargs)


REFS = _scenes(300)
NOISY_A, NOISY_B = _noisy(REFS, seed=1), _noisy(REFS, seed=2)


def test_bleu_from_summed_stats_equals_the_toolkit():
    preds = dict(NOISY_A, **{"img-00000": "", "img-00001": "red"})  # empty and 1-word captions
    stats = _stats(preds, REFS)
    values = metric_values(stats)
    for n in range(1, 5):
        assert values[f"Bleu_{n}"] == pytest.approx(stats.metrics[f"Bleu_{n}"], abs=1e-9, rel=0)
    for key in ("ROUGE_L", "CIDEr"):
        assert values[key] == pytest.approx(stats.metrics[key], abs=1e-12)
    assert values["METEOR"] is None and stats.meteor is None  # no Java on this path


def test_bleu_stats_clip_and_pick_the_closest_reference():
    row = bleu_stats("the the cat", ["the cat sat", "a cat"])
    # the: 2 in the caption, 1 in a reference at most; lengths 3 and 2, caption 3 -> 3.
    assert list(row) == [2, 1, 0, 0, 3, 2, 1, 0, 3, 3]
    assert bleu_stats("a b", ["a b c", "a"])[-1] == 1  # |2-3| == |2-1|: the shorter wins
    assert corpus_bleu(row)[0] == pytest.approx(2 / 3)


def test_ptb_and_meteor_from_summed_stats_equal_the_toolkit():
    require_java("the PTB tokenizer and METEOR (the blessing's metrics)")
    from components.evaluator.metrics.bootstrap import parse_meteor_stats
    from components.evaluator.metrics.coco import coco_metrics
    refs = dict(list(REFS.items())[:60])
    preds = {k: v for k, v in NOISY_A.items() if k in refs}
    preds["img-00002"] = refs["img-00002"][1]  # an exact match: the jar counts no chunk for it
    preds["img-00003"] = "A Red, circle!"
    coco = coco_metrics(preds, refs, use_java=True, per_image=True, details=True)
    assert coco["tokenizer"] == "ptb" and coco["METEOR"] is not None
    assert coco["tokenized"]["img-00003"]["caption"] == "a red circle"
    ids = list(preds)
    bleu = np.stack([bleu_stats(coco["tokenized"][i]["caption"], coco["tokenized"][i]["references"])
                     for i in ids])
    meteor = np.stack([parse_meteor_stats(coco["meteor_stats"][i]) for i in ids])
    assert np.allclose(corpus_bleu(bleu.sum(axis=0)), [coco[f"Bleu_{n}"] for n in range(1, 5)],
                       atol=1e-9, rtol=0)
    assert corpus_meteor(meteor.sum(axis=0)) == pytest.approx(coco["METEOR"], abs=1e-9, rel=0)
    # one image's row scores as the jar scored that image
    assert np.allclose(corpus_meteor(meteor), [coco["per_image"][i]["METEOR"] for i in ids],
                       atol=1e-12, rtol=0)


def test_identical_models_differ_by_exactly_zero_and_are_blessed():
    stats = _stats(NOISY_A, REFS)
    comparison = paired_bootstrap(stats, stats, resamples=200)
    for metric in ("Bleu_1", "Bleu_4", "ROUGE_L", "CIDEr"):
        entry = comparison[metric]
        assert entry["difference"] == 0 and entry["relative"] == 0
        assert entry["interval"] == [0.0, 0.0] and entry["relative_interval"] == [0.0, 0.0]
    assert comparison["METEOR"]["interval"] is None  # not computed without Java
    blessed, reasons, rows = blessing_decision(comparison, EvalConfig().change_thresholds,
                                               {"Bleu_4": 0.1}, stats.metrics)
    assert blessed and reasons == []
    assert {r["metric"]: r["verdict"] for r in rows}["CIDEr"] == "pass"


def test_noisy_but_equal_models_are_blessed_in_both_orders():
    a, b = _stats(NOISY_A, REFS), _stats(NOISY_B, REFS)
    thresholds = EvalConfig().change_thresholds
    for first, second in ((a, b), (b, a)):
        comparison = paired_bootstrap(first, second)
        for metric in ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L", "CIDEr"):
            low, high = comparison[metric]["interval"]
            assert low < 0 < high, (metric, low, high)
            assert low < comparison[metric]["difference"] < high
        blessed, reasons, _ = blessing_decision(comparison, thresholds, {}, first.metrics)
        assert blessed, reasons
    # the two orders mirror each other
    ab, ba = paired_bootstrap(a, b), paired_bootstrap(b, a)
    assert ab["CIDEr"]["difference"] == pytest.approx(-ba["CIDEr"]["difference"])
    assert ab["CIDEr"]["interval"][0] == pytest.approx(-ba["CIDEr"]["interval"][1])


def test_a_clearly_worse_model_is_blocked_with_the_reason():
    good = _stats(NOISY_A, REFS)
    bad = _stats({k: "a red circle" for k in REFS}, REFS)
    comparison = paired_bootstrap(bad, good)
    blessed, reasons, rows = blessing_decision(comparison, EvalConfig().change_thresholds, {},
                                               bad.metrics)
    assert not blessed
    cider = next(r for r in reasons if r.startswith("CIDEr:"))
    entry = comparison["CIDEr"]
    assert (f"candidate {entry['candidate']:.3f}, baseline {entry['baseline']:.3f}, "
            f"relative difference {entry['relative']:.3f} (95% interval "
            f"{entry['relative_interval'][0]:.3f} to {entry['relative_interval'][1]:.3f}) "
            "is below the allowed relative change -0.05") in cider
    verdicts = {r["metric"]: r["verdict"] for r in rows}
    assert verdicts["CIDEr"] == verdicts["Bleu_4"] == "fail"
    # the good model against the bad one passes: only drops block
    assert blessing_decision(paired_bootstrap(good, bad), EvalConfig().change_thresholds, {},
                             good.metrics)[0]
    table = format_rows(rows)
    assert table[0].split()[:3] == ["metric", "candidate", "baseline"]
    assert any(line.startswith("CIDEr") and line.endswith("fail") for line in table)


def test_a_fixed_seed_gives_the_same_intervals():
    a, b = _stats(NOISY_A, REFS), _stats(NOISY_B, REFS)
    first = paired_bootstrap(a, b, resamples=300, seed=3)
    assert paired_bootstrap(a, b, resamples=300, seed=3) == first
    assert paired_bootstrap(a, b, resamples=300, seed=4)["CIDEr"]["interval"] \
        != first["CIDEr"]["interval"]


def test_baseline_rows_are_matched_by_image_id():
    a, b = _stats(NOISY_A, REFS), _stats(NOISY_B, REFS)
    order = np.random.default_rng(0).permutation(len(b.ids))
    shuffled = ImageStats(ids=tuple(b.ids[i] for i in order), bleu=b.bleu[order],
                          rouge=b.rouge[order], cider=b.cider[order])
    assert paired_bootstrap(a, shuffled, resamples=100) == paired_bootstrap(a, b, resamples=100)
    fewer = ImageStats(ids=b.ids[1:], bleu=b.bleu[1:], rouge=b.rouge[1:], cider=b.cider[1:])
    with pytest.raises(ValueError, match="different images"):
        paired_bootstrap(a, fewer)


def _entry(candidate, baseline, interval, relative_interval):
    return {"candidate": candidate, "baseline": baseline, "difference": candidate - baseline,
            "relative": (candidate - baseline) / baseline, "interval": interval,
            "relative_interval": relative_interval, "confidence": 0.95, "resamples": 1000}


def test_absolute_and_relative_bounds():
    # CIDEr 7.0 -> 6.8: 0.2 lower for sure (-0.3 to -0.1), which is 1.4% to 4.3% lower.
    comparison = {"CIDEr": _entry(6.8, 7.0, [-0.3, -0.1], [-0.043, -0.014])}
    metrics = {"CIDEr": 6.8}

    def decide(bounds):
        return blessing_decision(comparison, {"CIDEr": bounds}, {}, metrics)
    assert decide({"relative": -0.05})[0]           # within 5%
    assert not decide({"absolute": -0.05})[0]        # beyond 0.05 with confidence
    assert decide({"absolute": -0.1})[0]             # the interval reaches the bound: may be within
    blessed, reasons, _ = decide({"relative": -0.05, "absolute": -0.05})  # both must hold
    assert not blessed and len(reasons) == 1 and "allowed change -0.05" in reasons[0]
    assert reasons[0] == ("CIDEr: candidate 6.800, baseline 7.000, difference -0.200 "
                          "(95% interval -0.300 to -0.100) is below the allowed change -0.05")
    assert not decide({"relative": -0.01})[0]
    # a drop that may be noise (interval reaching above the bound) never blocks
    noisy = {"CIDEr": _entry(6.8, 7.0, [-0.6, 0.2], [-0.086, 0.029])}
    assert blessing_decision(noisy, {"CIDEr": {"absolute": -0.05}}, {}, metrics)[0]


def test_minimums_and_missing_metrics():
    blessed, reasons, rows = blessing_decision(None, EvalConfig().change_thresholds,
                                               {"Bleu_4": 0.75, "grounding": 0.5},
                                               {"Bleu_4": 0.7, "CIDEr": 5.2, "grounding": None})
    assert not blessed
    assert reasons == ["Bleu_4 = 0.7000 is below the threshold 0.75",
                       "grounding is not available (threshold 0.5)"]
    by_metric = {r["metric"]: r for r in rows}
    assert by_metric["CIDEr"]["verdict"] == "not checked" and by_metric["CIDEr"]["notes"] == \
        ["no baseline"]
    assert blessing_decision(None, {}, {"Bleu_4": 0.5}, {"Bleu_4": 0.7})[0]
    # a change threshold on a metric neither model has does not block
    comparison = {"METEOR": {"candidate": None, "baseline": None}}
    blessed, _, rows = blessing_decision(comparison, {"METEOR": {"relative": -0.05}}, {}, {})
    assert blessed and rows[0]["verdict"] == "not checked"


RED = {"bbox": (0.0, 0.0, 0.25, 0.25), "color": "red", "shape": "circle", "size": "small"}
BLUE = {"bbox": (0.0, 0.75, 0.25, 1.0), "color": "blue", "shape": "square", "size": "large"}


def _maps(cells, grid=4):
    maps = np.full((len(cells), grid, grid), 0.01, np.float32)
    for t, (r, c) in enumerate(cells):
        maps[t, r, c] = 1.0
    return maps


def test_grounding_rates_come_from_summed_counts():
    captions = [["a", "small", "red", "circle"],
                ["a", "red", "circle", "left", "of", "a", "blue", "square"],
                ["a", "small", "blue", "square"], ["a", "green", "cross"]]
    attention = [_maps([(0, 0)] * 4), _maps([(3, 3)] * 8), _maps([(0, 3)] * 4),
                 _maps([(0, 0)] * 3)]
    objects = [[RED], [RED, BLUE], [BLUE, RED], [RED]]
    counts = grounding_counts(captions, attention, objects)
    assert counts.shape == (4, len(COUNT_KEYS))
    whole = grounding_metrics(captions, attention, objects)
    assert [int(v) for v in counts.sum(axis=0)] == [whole[k] for k in COUNT_KEYS]
    n = len(captions)
    stats = ImageStats(ids=tuple(range(n)), bleu=np.ones((n, 10)), rouge=np.zeros(n),
                       cider=np.zeros(n), grounding=counts)
    values = metric_values(stats)
    assert whole["num_sized_phrases"] == 2 and whole["size_accuracy"] == 0.5  # the blue one is large
    for key in ("grounding", "grounding_noun", "attribute_accuracy", "relation_accuracy",
                "size_accuracy"):
        assert values[key] == pytest.approx(whole[key])
    # one resample by hand: the rate of the summed counts, not the mean of per-image rates;
    # the baseline grounds nothing (rate 0), so the difference is the candidate's rate
    never = counts.copy()
    never[:, COUNT_KEYS.index("num_grounded")] = 0
    baseline = ImageStats(ids=stats.ids, bleu=stats.bleu, rouge=stats.rouge, cider=stats.cider,
                          grounding=never)
    comparison = paired_bootstrap(stats, baseline, resamples=1, seed=2)
    draw = np.random.default_rng(2).integers(0, n, size=(1, n))[0]  # images 3, 1, 0, 1
    summed = dict(zip(COUNT_KEYS, counts[draw].sum(axis=0), strict=True))
    expected = summed["num_grounded"] / summed["num_matched_phrases"]
    assert comparison["grounding"]["interval"] == pytest.approx([expected, expected])
    assert expected != np.mean([counts[i, 2] / counts[i, 1] for i in draw if counts[i, 1]])
    # no image with two objects: relation accuracy is not available, the others are
    lonely = np.zeros_like(counts)
    lonely[:, COUNT_KEYS.index("num_attribute_images")] = 1  # scored for attributes, all wrong
    alone = ImageStats(ids=stats.ids, bleu=stats.bleu, rouge=stats.rouge, cider=stats.cider,
                       grounding=lonely)
    assert metric_values(alone)["relation_accuracy"] is None
    assert metric_values(alone)["size_accuracy"] is None
    assert metric_values(alone)["attribute_accuracy"] == 0.0
    assert paired_bootstrap(alone, alone, resamples=5)["relation_accuracy"]["interval"] is None


def test_every_blessing_metric_has_an_entry():
    stats = _stats(NOISY_A, REFS)
    assert set(paired_bootstrap(stats, stats, resamples=10)) == set(METRICS)
    assert set(EvalConfig().change_thresholds) == set(METRICS)


def _calls(function, *args, **kwargs) -> int:
    """How many Python and builtin function calls running `function` makes (sys.setprofile):
    the interpreter's work, counted the same on any host."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        function(*args, **kwargs)
    finally:
        sys.setprofile(None)
    return count


@pytest.mark.parametrize("images", [500, 5000])
def test_a_thousand_resamples_make_a_fraction_of_the_naive_loops_calls(images):
    """The bootstrap recomputes the metrics on blocks of resamples at once (a matrix
    product of draw counts and per-image statistics), not once per resample as the naive
    loop does: 2 x 1000 recomputations of the metrics on resampled per-image stats.

    Counted in function calls, measured side by side in this run (one naive resample,
    times 2000), not timed, so the verdict does not depend on the host's speed or load.
    A per-resample loop makes at least as many calls as the naive one (over 20 times the
    bound); the blocked bootstrap makes a few metric computations' worth."""
    rng = np.random.default_rng(0)
    fake = lambda: ImageStats(  # noqa: E731
        ids=tuple(range(images)), bleu=rng.integers(0, 9, (images, 10)).astype(float),
        rouge=rng.random(images), cider=rng.random(images) * 5,
        meteor=rng.integers(0, 9, (images, 23)).astype(float),
        grounding=rng.integers(0, 3, (images, len(COUNT_KEYS))))
    a, b = fake(), fake()

    def naive_resample():
        draw = rng.integers(0, images, images)
        metric_values(ImageStats(ids=a.ids, bleu=a.bleu[draw], rouge=a.rouge[draw],
                                 cider=a.cider[draw], meteor=a.meteor[draw],
                                 grounding=a.grounding[draw]))

    naive_resample()  # first runs fill caches (compiled regexes, ...): not counted
    paired_bootstrap(a, b, resamples=2)
    one = _calls(naive_resample)
    assert _calls(naive_resample) == one  # counted, so the same every time
    naive_loop = 2 * 1000 * one
    bootstrap = _calls(paired_bootstrap, a, b, resamples=1000)
    print(f"\n{images} images: {bootstrap} calls; the naive loop {naive_loop} "
          f"({one} per resample)")
    assert bootstrap < naive_loop / 20, (bootstrap, naive_loop)
    # The calls hardly grow with the resamples (a per-resample loop: ten times as many).
    assert bootstrap < 3 * _calls(paired_bootstrap, a, b, resamples=100)


def test_image_stats_takes_grounding_of_the_boxed_images_only():
    from components.evaluator.metrics.grounding import merge_grounding
    captions = {"a": "a red circle", "b": "a blue square left of a red circle",
                "c": "a green cross", "d": "a red circle"}
    refs = {k: ["a red circle left of a blue square"] for k in captions}
    attention = _maps([(0, 0)] * 8)
    objects = {"a": [RED], "b": [RED, BLUE], "c": [RED]}  # "d" has no boxes
    per_image = {k: grounding_metrics([captions[k].split()], [attention], [objects[k]])
                 for k in objects}
    stats = _stats(captions, refs, grounding=per_image)
    assert list(stats.boxed) == [True, True, True, False]
    values, merged = metric_values(stats), merge_grounding(list(per_image.values()))
    for key in ("grounding", "grounding_noun", "attribute_accuracy", "relation_accuracy",
                "size_accuracy"):
        assert values[key] == pytest.approx(merged[key]), key
    with pytest.raises(ValueError, match="without a caption"):
        _stats(captions, refs, grounding={"zz": per_image["a"]})
