"""The blessing end to end: seed-only retrains bless each other, a real regression is refused.

One root, a small config (the `tiny` data at 400 images with a wider
decoder, 12 epochs: Bleu_4 about 0.3, CIDEr about 1 on 67 test images), a
chain of `captioner run`s:

  1. seed 0: the first push (no baseline);
  2. seed 1: compared with seed 0's export on the same test images;
  3. seed 0 again: its cached model, compared with seed 1's push;
  4. 1 epoch: compared with seed 0's push, refused;
  5. other data (`data.seed=2`), 2 epochs: the baseline (seed 0's export) is
     captioned again on the new test split, not compared by its old number.
"""
import json
import os

import pytest

from tests.test_e2e import _captioner, _properties

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SMALL = ("--config", "tiny", "--set", "data.num_images=400", "--set", "model.hidden_dim=128",
         "--set", "model.embedding_dim=32", "--set", "model.attention_dim=32",
         "--set", "train.learning_rate=4e-3", "--set", "train.batch_size=32",
         "--set", "encoder.max_epochs=4", "--set", "encoder.width=16",
         "--set", "train.val_examples=32")
RUNS = {
    "seed 0": ("--set", "train.epochs=12", "--set", "train.seed=0"),
    "seed 1": ("--set", "train.epochs=12", "--set", "train.seed=1"),
    "seed 0 again": ("--set", "train.epochs=12", "--set", "train.seed=0"),
    "1 epoch": ("--set", "train.epochs=1", "--set", "train.seed=0"),
    "other data": ("--set", "train.epochs=2", "--set", "data.seed=2"),
}


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("blessing"))
    results = {}
    for name, args in RUNS.items():
        proc = _captioner("run", *SMALL, *args, "--root", root)
        with open(os.path.join(root, "run_summary.json")) as f:
            summary = json.load(f)
        stages = summary["stages"]
        results[name] = {
            "root": root, "summary": summary, "log": proc.stderr,
            "evaluation": _properties(stages["Evaluator"]["outputs"]["evaluation"]),
            "evaluation_uri": stages["Evaluator"]["outputs"]["evaluation"],
            "blessing": _properties(stages["Evaluator"]["outputs"]["blessing"]),
            "serving_model": stages["Exporter"]["outputs"]["serving_model"],
            "examples": stages["ExampleGen"]["outputs"]["examples"]}
    return results


def _rows(result):
    return {row["metric"]: row for row in result["blessing"]["comparison"]}


def test_the_first_push_has_no_baseline(chain):
    first = chain["seed 0"]
    assert first["blessing"]["blessed"] is True and first["blessing"]["baseline"] is None
    assert first["evaluation"]["metrics"]["Bleu_4"] > 0.1  # a model worth comparing


def test_seed_only_retrains_bless_each_other_in_both_orders(chain):
    one, other = chain["seed 1"], chain["seed 0 again"]
    assert one["blessing"]["blessed"] is True, one["blessing"]["reasons"]
    assert other["blessing"]["blessed"] is True, other["blessing"]["reasons"]
    assert one["blessing"]["baseline"]["serving_model_uri"] == chain["seed 0"]["serving_model"]
    assert other["blessing"]["baseline"]["serving_model_uri"] == one["serving_model"]
    # The same pair in the two orders: opposite differences, mirrored intervals.
    for metric in ("Bleu_4", "CIDEr", "METEOR"):
        a, b = _rows(one)[metric], _rows(other)[metric]
        assert a["difference"] == pytest.approx(-b["difference"])
        assert a["interval"][0] <= a["difference"] <= a["interval"][1]
        assert a["interval"][0] < a["interval"][1]


def test_a_one_epoch_model_is_refused_with_metric_difference_and_interval(chain):
    result = chain["1 epoch"]
    blessing = result["blessing"]
    assert blessing["blessed"] is False
    cider = [r for r in blessing["reasons"] if r.startswith("CIDEr: ")]
    assert cider and "baseline" in cider[0] and "95% interval" in cider[0], blessing["reasons"]
    row = _rows(result)["CIDEr"]
    assert row["verdict"] == "fail" and row["interval"][1] < 0
    pushed = result["summary"]["stages"]["Pusher"]["outputs"]["pushed_model"]
    assert _properties(pushed)["pushed"] is False
    assert "CIDEr: candidate" in result["log"]


def test_a_baseline_from_other_data_is_scored_again_on_the_current_test_split(chain):
    result = chain["other data"]
    baseline = result["blessing"]["baseline"]
    # The last push is seed 0's export (the 1-epoch model was refused).
    assert baseline["serving_model_uri"] == chain["seed 0"]["serving_model"]
    assert result["examples"] != chain["seed 0"]["examples"]  # other data, other test split
    with open(os.path.join(result["evaluation_uri"], "captions.jsonl")) as f:
        candidate_ids = sorted(json.loads(line)["image_id"] for line in f)
    with open(os.path.join(result["evaluation_uri"], "baseline_captions.jsonl")) as f:
        baseline_ids = sorted(json.loads(line)["image_id"] for line in f)
    assert baseline_ids == candidate_ids
    assert baseline["metrics"]["num_test_images"] == len(candidate_ids)
    old = chain["seed 0"]["evaluation"]["metrics"]
    assert baseline["metrics"]["CIDEr"] != old["CIDEr"]  # not its old number
    assert _rows(result)["CIDEr"]["baseline"] == pytest.approx(baseline["metrics"]["CIDEr"])


def test_inspect_shows_the_comparison_and_the_verdict(chain):
    root = chain["1 epoch"]["root"]
    out = _captioner("inspect", "--root", root).stdout
    assert "NOT BLESSED against" in out and "(first push: no baseline)" in out
    cider = [line for line in out.splitlines() if line.strip().startswith("CIDEr ")]
    assert any(line.rstrip().endswith("fail") for line in cider), out[-3000:]
    assert any(line.rstrip().endswith("pass") for line in cider)
    executions = json.loads(_captioner("inspect", "--root", root, "--json").stdout)["executions"]
    verdicts = [x["blessing"]["blessed"] for x in executions if "blessing" in x]
    assert verdicts.count(True) == 3 and verdicts.count(False) >= 1  # the seeds; 1 epoch
