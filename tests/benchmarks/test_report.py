"""benchmarks/report.py: the generated tables of docs/PERFORMANCE.md and the README match the records."""
from __future__ import annotations

import json

from tests.benchmarks import load_benchmark

HOST = {"cpu": "Test CPU 9000", "cores": 2, "tag": "test-cpu-9000-2c-avx2",
        "flags": {"avx2": True, "avx512f": False, "avx512_bf16": False, "amx": False}}


def _record(directory, name, date, examples_per_s):
    record = {"benchmark": "train_throughput", "date": date, "host": HOST,
              "command": "python benchmarks/train_throughput.py --repeats 2",
              "figures": {"runs": [{"run": "plain, best of 2", "examples_per_second_default": examples_per_s,
                                    "examples_per_second_mirrored": 321.0, "input_wait_fraction_default": 0.012,
                                    "input_wait_fraction_mirrored": 0.05, "ratio": 0.5, "load_average": "1.0"}]}}
    (directory / name).write_text(json.dumps(record))


def test_committed_docs_match_the_records():
    report = load_benchmark("report")
    assert report.main(["--check"]) == 0, "stale tables: run `make docs` (python benchmarks/report.py)"


def test_a_table_shows_the_newest_record_and_names_it(tmp_path):
    report = load_benchmark("report")
    results = tmp_path / "results"
    results.mkdir()
    _record(results, "train_throughput-2031-01-01-test-cpu-9000-2c-avx2.json", "2031-01-01T10:00:00Z", 469.5)
    _record(results, "train_throughput-2031-01-02-test-cpu-9000-2c-avx2.json", "2031-01-02T10:00:00Z", 1234.5)
    doc = tmp_path / "DOC.md"
    doc.write_text("Prose before.\n\n<!-- table:train-throughput:start -->\n<!-- table:train-throughput:end -->\n\n"
                   "Prose between.\n\n<!-- table:superseded:start -->\n<!-- table:superseded:end -->\n")
    args = ["--results-dir", str(results), str(doc)]

    assert report.main(["--check", *args]) == 1  # empty markers: stale
    assert report.main(args) == 0
    text = doc.read_text()
    assert report.main(["--check", *args]) == 0

    table = text[text.index("<!-- table:train-throughput:start"):text.index("<!-- table:train-throughput:end")]
    assert "| plain, best of 2 | 1234.5 | 1.2% | 321.0 |" in table
    assert "469.5" not in table
    assert "`train_throughput-2031-01-02-test-cpu-9000-2c-avx2.json` (Test CPU 9000, 2031-01-02: " \
           "`python benchmarks/train_throughput.py --repeats 2`)" in table
    superseded = text[text.index("<!-- table:superseded:start"):]
    assert "`train_throughput-2031-01-01-test-cpu-9000-2c-avx2.json` | 2031-01-01 | Test CPU 9000 | " \
           "`train_throughput-2031-01-02-test-cpu-9000-2c-avx2.json` |" in superseded
    assert text.startswith("Prose before.\n\n") and "\n\nProse between.\n\n" in text

    # A hand edit inside the markers makes the check fail.
    doc.write_text(text.replace("1234.5", "999.9"))
    assert report.main(["--check", *args]) == 1


def _scst_run(seed, cider, grounding, size_interval):
    """One attention and seed of benchmarks/scst_grounding.py: plain SCST against cross-entropy."""
    versus = {"CIDEr": {"baseline": 0.8, "difference": cider, "relative": cider / 0.8,
                        "interval": [cider - 0.05, cider + 0.05]},
              "grounding": {"baseline": 0.8, "difference": grounding,
                            "interval": [grounding - 0.05, grounding + 0.05]}}
    if size_interval:
        versus["size_accuracy"] = {"baseline": 0.7, "difference": sum(size_interval) / 2,
                                   "interval": size_interval}
    return {"attention": "soft", "seed": seed,
            "scst": {"plain": {"attention_kl": 0.0, "metrics": {}, "versus_xe": versus}}}


def _targets_table(tmp_path, runs) -> list:
    """The scst-grounding-targets table's soft rows, from one record per (variant, run) on its own day."""
    report = load_benchmark("report")
    results = tmp_path / "results"
    results.mkdir()
    for day, (variant, run) in enumerate(runs, start=1):
        record = {"benchmark": "scst_grounding", "date": f"2031-01-0{day}T10:00:00Z", "host": HOST,
                  "command": f"python benchmarks/scst_grounding.py  # {variant}",
                  "figures": {"config": "scenes", "runs": [run]}}
        (results / f"scst_grounding-{variant}-2031-01-0{day}-test-cpu-9000-2c-avx2.json"
         ).write_text(json.dumps(record))
    doc = tmp_path / "DOC.md"
    doc.write_text("<!-- table:scst-grounding-targets:start -->\n<!-- table:scst-grounding-targets:end -->\n")
    assert report.main(["--results-dir", str(results), str(doc)]) == 0
    return [line for line in doc.read_text().splitlines() if line.startswith("| soft |")]


def test_scst_targets_count_the_seeds_that_meet_them(tmp_path):
    rows = _targets_table(tmp_path, [
        ("soft-seed0", _scst_run(0, 0.16, -0.06, None)),        # +20%, interval reaches 0
        ("soft-seed1", _scst_run(1, 0.08, -0.10, [-0.2, 0.1])),  # +10%, interval below 0
        ("soft-seed2", _scst_run(2, 0.13, 0.01, [-0.3, -0.1]))])  # +16.25%
    # CIDEr: mean of +20%, +10%, +16.25%; two seeds at +15% or more. Grounding: mean -0.050, the
    # intervals' tops -0.01, -0.05, +0.06. Size: only seeds 1 and 2 have an interval.
    assert rows == ["| soft | config's | SCST | 0, 1, 2 | +15.4% | 2 of 3 | -0.050 | 1 of 3 | -0.125 | 1 of 2 |"]


def test_scst_targets_read_the_comparison_rows_at_their_bounds():
    targets = load_benchmark("scst_targets").targets
    met = targets({"CIDEr": {"relative": 0.15}, "grounding": {"interval": [-0.1, 0.0]},
                   "grounding_noun": {"interval": [-0.2, -0.01]}, "size_accuracy": {"interval": None}})
    # +15% exactly meets the CIDEr target; an interval ending at 0 reaches zero; no interval: unknown.
    assert met == {"cider_plus_15pct": True, "grounding_not_lower": True,
                   "grounding_noun_not_lower": False, "size_accuracy_not_lower": None}
    assert targets({"CIDEr": {"relative": 0.149}})["cider_plus_15pct"] is False
    assert targets({})["cider_plus_15pct"] is False  # no CIDEr row: not met


def test_a_later_record_of_the_same_run_adds_its_variants_to_the_group(tmp_path):
    first, later = _scst_run(0, 0.16, -0.06, None), _scst_run(0, 0.08, 0.01, None)
    later["scst"] = {"plain+scst_xe_weight=0.1": {**later["scst"]["plain"], "xe_weight": 0.1}}
    other = _scst_run(0, 0.12, 0.01, None)
    other["scst"] = {"plain+val_examples=1000": {**other["scst"]["plain"],
                                                 "scst_set": ["val_examples=1000"]}}
    boxed = _scst_run(0, 0.13, 0.02, None)
    boxed["scst"] = {"plain+scst_box_attention=1.0": {**boxed["scst"]["plain"],
                                                      "scst_set": ["scst_box_attention=1.0"]}}
    sized = _scst_run(0, 0.14, 0.03, None)
    both = ["scst_box_attention=1.0", "scst_size_reward=0.5"]
    sized["scst"] = {"plain+" + "+".join(both): {**sized["scst"]["plain"], "scst_set": both}}
    kept = _scst_run(0, 0.15, 0.0, None)
    keep = ["scst_box_attention=0.3", "scst_box_mode=keep", "scst_average_epochs=3"]
    kept["scst"] = {"plain+" + "+".join(keep): {**kept["scst"]["plain"], "scst_set": keep}}
    rows = _targets_table(tmp_path, [("soft-seed0", first), ("soft-seed0-scst_xe_weight0.1", later),
                                     ("soft-seed0-val_examples1000", other),
                                     ("soft-seed0-scst_box_attention1.0", boxed),
                                     ("soft-seed0-scst_box_attention1.0-scst_size_reward0.5",
                                      sized),
                                     ("soft-seed0-scst_box_attention0.3-scst_box_modekeep", kept)])
    assert [row.split(" | ")[2] for row in rows] == [
        "SCST", "SCST (val_examples=1000)",
        "SCST + box term (keep) 0.30 (scst_average_epochs=3)", "SCST + box term 1.00",
        "SCST + box term 1.00 + size reward 0.50", "SCST + cross-entropy 0.10"]
    assert rows[5].split(" | ")[4] == "+10.0%"  # the later record's own figures
    assert rows[1].split(" | ")[4] == "+15.0%"


def test_a_second_cross_entropy_model_of_a_seed_is_its_own_group(tmp_path):
    def run(xe_cider, variant, cider):
        out = _scst_run(3, cider, -0.01, None)
        out["xe"] = {"metrics": {"CIDEr": xe_cider, "Bleu_4": 0.25, "grounding": 0.8}}
        settings = [variant.split("+", 1)[1]] if "+" in variant else []
        out["scst"] = {variant: {**out["scst"]["plain"], "scst_set": settings}}
        return out

    rows = _targets_table(tmp_path, [
        ("soft-seed3", run(0.815, "plain", 0.12)),
        # the data stages and the cross-entropy model again, in a new root: another model
        ("soft-seed3-scst_box_attention1.0", run(0.821, "plain+scst_box_attention=1.0", 0.16)),
        ("soft-seed3-scst_box_attention0", run(0.821, "plain+scst_box_attention=0", 0.14))])
    assert [row.split(" | ")[2:4] for row in rows] == [
        ["SCST", "3, 3 (2nd)"], ["SCST + box term 1.00", "3 (2nd)"]]
    # plain SCST: +15% on the first model, +17.5% on the second (the later record's own figures)
    assert rows[0].split(" | ")[4] == "+16.2%"


def test_a_run_that_kept_its_start_model_counts_no_grounding(tmp_path):
    trained = _scst_run(0, 0.12, 0.02, [-0.01, 0.05])
    kept = _scst_run(1, 0.0, 0.0, [0.0, 0.0])
    kept["scst"]["plain"]["best_epoch"] = -1  # no SCST epoch beat the cross-entropy model
    rows = _targets_table(tmp_path, [("soft-seed0", trained), ("soft-seed1", kept)])
    cells = rows[0].split(" | ")
    assert cells[3] == "0, 1 (start kept)"
    assert cells[4:6] == ["+7.5%", "1 of 2"]            # CIDEr counts the kept start, +0%
    assert cells[6:8] == ["+0.020", "1 of 1"]           # grounding only of the SCST model
    assert [c.strip(" |") for c in cells[8:10]] == ["+0.020", "1 of 1"]


def test_a_setting_of_both_phases_names_its_variant_and_keeps_it_apart(tmp_path):
    bf16, fp32 = _scst_run(5, 0.12, 0.02, None), _scst_run(5, 0.16, 0.01, None)
    fp32["xe"] = {"metrics": {"CIDEr": 0.83, "Bleu_4": 0.25, "grounding": 0.8}}  # its own model
    fp32["set"] = ["mixed_precision=float32"]
    fp32["scst"]["plain"]["set"] = fp32["set"]  # `--set train.mixed_precision=float32`
    rows = _targets_table(tmp_path, [("soft-seed5", bf16),
                                     ("soft-seed5-mixed_precisionfloat32", fp32)])
    assert [row.split(" | ")[2:5] for row in rows] == [
        ["SCST", "5", "+15.0%"],
        ["SCST (mixed_precision=float32 in both phases)", "5 (2nd)", "+20.0%"]]
