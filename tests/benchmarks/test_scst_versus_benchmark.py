"""benchmarks/scst_versus.py: two models' test captions head to head, on hand-made captions."""
import json

import pytest

from tests.benchmarks import load_benchmark, run_benchmark

REFERENCES = {f"img{i}": [f"a {c} {s} on a plain background", f"one {c} {s}"]
              for i, (c, s) in enumerate([("red", "circle"), ("blue", "square"), ("green", "star"),
                                          ("yellow", "heart"), ("purple", "ring"),
                                          ("orange", "cross")] * 5)}


def _rows(caption_of):
    return [{"image_id": i, "caption": caption_of(i, refs), "references": refs}
            for i, refs in REFERENCES.items()]


GOOD = _rows(lambda i, refs: refs[1])                # one of its references, word for word
POOR = _rows(lambda i, refs: "a picture of a shape")  # says nothing the references say


def test_the_better_model_wins_beyond_the_noise_and_a_model_ties_itself():
    versus = load_benchmark("scst_versus").versus
    out = versus(GOOD, POOR, use_java=False, resamples=200)
    assert out["images"] == 30
    cider = out["CIDEr"]
    assert cider["candidate"] > cider["baseline"] >= 0
    assert cider["difference"] == pytest.approx(cider["candidate"] - cider["baseline"])
    low, high = cider["interval"]
    assert 0 < low <= cider["difference"] + 1e-9 and cider["difference"] <= high + 1e-9
    assert out["Bleu_4"]["difference"] > 0
    assert out["METEOR"]["difference"] is None  # no Java: METEOR is not scored
    same = versus(GOOD, GOOD, use_java=False, resamples=200)["CIDEr"]
    assert same["difference"] == 0 and same["interval"] == [0.0, 0.0]


def test_models_scored_on_other_images_or_references_are_refused():
    versus = load_benchmark("scst_versus").versus
    with pytest.raises(ValueError, match="other images or references"):
        versus(GOOD, POOR[1:], use_java=False)
    changed = [dict(r, references=r["references"][:1]) for r in POOR]
    with pytest.raises(ValueError, match="other images or references"):
        versus(GOOD, changed, use_java=False)


def _root(path, rows):
    evaluation = path / "Evaluator" / "7" / "evaluation"
    evaluation.mkdir(parents=True)
    (evaluation / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "run_summary.json").write_text(json.dumps(
        {"stages": {"Evaluator": {"outputs": {"evaluation": str(evaluation)}}}}))
    return path


def test_the_script_reads_each_roots_evaluation_and_records_every_pair(tmp_path):
    good, poor = _root(tmp_path / "good", GOOD), _root(tmp_path / "poor", POOR)
    proc = run_benchmark("scst_versus", ["--pair", good, poor, "--pair", poor, good],
                         tmp_path / "results")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [(r["candidate"], r["baseline"]) for r in lines] == [(str(good), str(poor)),
                                                               (str(poor), str(good))]
    assert lines[0]["CIDEr"]["difference"] == pytest.approx(-lines[1]["CIDEr"]["difference"])
    (record,) = (tmp_path / "results").glob("scst_versus-*.json")
    assert json.loads(record.read_text())["figures"]["pairs"] == lines
    # A second call of the day with --variant keeps its own record.
    run_benchmark("scst_versus", ["--pair", good, poor, "--variant", "soft-seed9-keep"],
                  tmp_path / "results")
    named = sorted(p.name for p in (tmp_path / "results").glob("scst_versus-*.json"))
    assert len(named) == 2 and named[1].startswith("scst_versus-soft-seed9-keep-"), named
