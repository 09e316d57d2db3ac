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
