"""The Evaluation as one self-contained page (components/evaluator/report_page.py)."""
from __future__ import annotations

import base64
import io
import json
import os
import re

from PIL import Image

from components.evaluator.report_page import REPORT_FILE, write_report

METRICS = {"Bleu_1": 0.91234, "Bleu_4": 0.61234, "METEOR": 0.41234, "ROUGE_L": 0.71234,
           "CIDEr": 1.23456, "grounding": 0.55555, "grounding_noun": 0.66666,
           "attribute_accuracy": 0.77777, "relation_accuracy": 0.88888,
           "dangling_ending_rate": 0.25, "dangling_endings": 1, "empty_captions": 0,
           "num_test_images": 4, "failed_images": 0, "decode_seconds": 1.5}
BASELINE = dict(METRICS, CIDEr=1.34567, Bleu_4=0.65432)
ROWS = [
    {"metric": "CIDEr", "candidate": 1.23456, "baseline": 1.34567, "difference": -0.11111,
     "interval": [-0.2, -0.01], "relative_interval": [-0.15, -0.01], "minimum": None,
     "change_threshold": {"absolute": -0.05}, "verdict": "fail", "notes": []},
    {"metric": "Bleu_4", "candidate": 0.61234, "baseline": 0.65432, "difference": -0.04198,
     "interval": [-0.1, 0.02], "relative_interval": None, "minimum": 0.1,
     "change_threshold": None, "verdict": "pass", "notes": []},
]
CAPTIONS = [
    {"image_id": "img-000", "caption": "a red circle above a", "score": -1.0,
     "references": ["a red circle above a blue square"]},
    {"image_id": "img-001", "caption": "a <b>blue</b> square", "score": -1.0,
     "references": ["a blue square"]},
]


def png_bytes(color=(200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (12, 8), color).save(out, format="PNG")
    return out.getvalue()


def evaluation(tmp_path, baseline=True):
    folder = tmp_path / "evaluation"
    (folder / "figures").mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({
        "metrics": METRICS, "notes": ["a note about <this> run"],
        "baseline_metrics": BASELINE if baseline else None,
        "comparison": ROWS if baseline else []}))
    (folder / "captions.jsonl").write_text("".join(json.dumps(c) + "\n" for c in CAPTIONS))
    (folder / "figures" / "img-000.png").write_bytes(png_bytes())
    (folder / "figures" / "index.html").write_text("<html></html>")
    return str(folder)


BLESSING = {"blessed": False, "reasons": ["CIDEr: candidate 1.2346 is worse than the baseline"],
            "decoding": {"beam_size": 3, "max_length": 24, "length_normalization": 0.0},
            "export_digest": "0123456789abcdef0123", "bootstrap": {"resamples": 1000,
                                                                     "confidence": 0.95},
            "baseline": {"serving_model_uri": "/root/Exporter/1/serving_model"}}


def test_the_page_holds_the_whole_evaluation(tmp_path):
    path = write_report(evaluation(tmp_path), BLESSING)
    assert os.path.basename(path) == REPORT_FILE
    page = open(path, encoding="utf-8").read()
    for name, value in METRICS.items():
        shown = str(value) if isinstance(value, int) else f"{value:.4f}"
        if name == "decode_seconds":
            shown = "1.50"
        assert shown in page, name
    assert "1.3457" in page and "0.6543" in page  # the baseline's values
    assert "NOT BLESSED" in page and "CIDEr: candidate 1.2346 is worse" in page
    assert "beam size 3" in page and "max length 24" in page
    # The comparison: each row's numbers, interval, threshold and verdict.
    assert "-0.1111" in page and "[-0.2000, -0.0100]" in page
    assert "change &ge; -0.05" in page and "&ge; 0.1" in page
    assert '<td class="fail">fail' in page and '<td class="pass">pass' in page
    assert "1000 resamples" in page
    # Dangling endings, with the caption that dangles (and not the other one).
    assert "a red circle above a</td>" in page
    assert "a &lt;b&gt;blue&lt;/b&gt; square" not in page
    assert "a note about &lt;this&gt; run" in page  # escaped, never markup
    assert "Grounding" in page and "Attention figures" in page


def test_the_page_is_self_contained(tmp_path):
    page = open(write_report(evaluation(tmp_path), BLESSING), encoding="utf-8").read()
    assert not re.search(r"https?://", page)
    assert "<script" not in page and "<link" not in page
    sources = re.findall(r'src="([^"]*)"', page)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    embedded = base64.b64decode(sources[0].split(",", 1)[1])
    assert embedded == png_bytes()


def test_a_first_push_has_no_comparison(tmp_path):
    page = open(write_report(evaluation(tmp_path, baseline=False),
                             dict(BLESSING, blessed=True, reasons=[], baseline=None)),
                encoding="utf-8").read()
    assert "BLESSED" in page and "NOT BLESSED" not in page
    assert "Candidate vs baseline" not in page and "none (first push)" in page
    assert "0.6123" in page


def test_written_atomically_and_rewritten(tmp_path):
    folder = evaluation(tmp_path)
    write_report(folder, BLESSING)
    write_report(folder, dict(BLESSING, blessed=True, reasons=[]))
    assert sorted(os.listdir(folder)) == ["captions.jsonl", "figures", "metrics.json",
                                          REPORT_FILE]
    assert "NOT BLESSED" not in open(os.path.join(folder, REPORT_FILE)).read()


def test_the_evaluator_writes_the_page(tmp_path, monkeypatch):
    from tests.components.test_evaluator import _evaluate, _serving_model
    good, bad = _serving_model(tmp_path, "image"), _serving_model(tmp_path, "square")
    result, outputs = _evaluate(tmp_path, monkeypatch, bad, baseline=good)
    properties = result["evaluation"]["properties"]
    assert properties["report"] == REPORT_FILE
    page = open(os.path.join(outputs["evaluation"], REPORT_FILE), encoding="utf-8").read()
    for name in ("Bleu_4", "CIDEr"):
        assert f"{properties['metrics'][name]:.4f}" in page, name
        assert f"{properties['baseline']['metrics'][name]:.4f}" in page, name
    assert "NOT BLESSED" in page and "Candidate vs baseline" in page
    assert '<td class="fail">fail' in page
    assert not re.search(r"https?://", page)
    figures = [n for n in os.listdir(os.path.join(outputs["evaluation"], "figures"))
               if n.endswith(".png")]
    assert figures and page.count('src="data:image/png;base64,') == len(figures)


def test_inspect_prints_the_page_of_each_evaluation(tmp_path, monkeypatch, capsys):
    import argparse

    import pipeline.runner
    from pipeline import cli

    with_page, without = evaluation(tmp_path), tmp_path / "older"
    write_report(with_page, BLESSING)
    without.mkdir()
    outputs = [{"name": "evaluation", "type": "Evaluation", "artifact_id": 7, "uri": with_page},
               {"name": "evaluation", "type": "Evaluation", "artifact_id": 8,
                "uri": str(without)},
               {"name": "model", "type": "Model", "artifact_id": 9, "uri": with_page}]
    execution = {"id": 3, "stage": "Evaluator", "state": "complete", "reused_execution": None,
                 "started": "2026-11-27 07:00:00", "seconds": 1.0, "fingerprint": "f",
                 "inputs": [], "outputs": outputs, "counts": {}, "error": None}
    monkeypatch.setattr(pipeline.runner, "inspect",
                        lambda root, verify=False: {"root": root, "executions": [execution]})
    cli._cmd_inspect(argparse.Namespace(root=str(tmp_path), json=False, verify=False))
    shown = capsys.readouterr().out
    assert shown.count("report: ") == 1
    assert f"report: {os.path.join(with_page, REPORT_FILE)}" in shown


def test_a_model_that_could_not_be_served_gets_a_page_with_the_reason(tmp_path):
    reason = "infra validation: TF Serving could not serve this model: the graph calls Python"
    (tmp_path / "metrics.json").write_text(json.dumps({"metrics": {}, "notes": [reason]}))
    page = open(write_report(str(tmp_path), {"blessed": False, "reasons": [reason]}),
                encoding="utf-8").read()
    assert "NOT BLESSED" in page and page.count(reason) == 2  # the reason and the note
    assert "Caption metrics" not in page and "Attention figures" not in page
