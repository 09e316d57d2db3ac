"""benchmarks/results.py: the JSON record of a benchmark run, its file name and host tag."""
from __future__ import annotations

import json

from tests.benchmarks import load_benchmark


def test_host_tag_names_the_cpu_cores_and_best_instructions():
    results = load_benchmark("results")
    assert results.host_tag("AMD EPYC", 2, {"avx2": True, "avx512f": True,
                                            "avx512_bf16": True}) == "amd-epyc-2c-bf16"
    assert results.host_tag("Intel(R) Xeon(R) Processor @ 2.80GHz", 2,
                            {"avx2": True, "avx512f": True}) == "intel-xeon-2c-avx512"
    assert results.host_tag("AMD EPYC 7B13 64-Core Processor", 8,
                            {"avx2": True}) == "amd-epyc-7b13-8c-avx2"
    assert results.host_tag("", 1, {"amx": True}) == "unknown-1c-amx"


def test_write_result_records_host_date_command_and_figures(tmp_path, monkeypatch):
    results = load_benchmark("results")
    monkeypatch.setattr("sys.argv", ["benchmarks/decode.py", "--runs", "5"])
    path = results.write_result("decode", {"ratio": 13.4}, directory=str(tmp_path),
                                variant="mixed_bfloat16")
    record = json.loads(open(path).read())
    assert path.startswith(str(tmp_path / "decode-mixed_bfloat16-"))
    assert path.endswith(f"-{record['host']['tag']}.json")
    assert record["date"][:10] in path and record["date"].endswith("Z")
    assert record["command"] == "python benchmarks/decode.py --runs 5"
    assert record["figures"] == {"ratio": 13.4}
    assert set(record["host"]["flags"]) == {"avx2", "avx512f", "avx512_bf16", "amx"}
    assert record["host"]["cores"] >= 1 and record["host"]["cpu"]


def test_argv_given_to_main_is_the_recorded_command(tmp_path, monkeypatch):
    results = load_benchmark("results")
    monkeypatch.setattr("sys.argv", ["benchmarks/scale.py"])
    path = results.write_result("scale", {}, argv=["--sizes", "12,24"],
                                directory=str(tmp_path))
    assert json.loads(open(path).read())["command"] == "python benchmarks/scale.py --sizes 12,24"


def test_nothing_is_written_under_pytest_unless_a_folder_is_named(tmp_path, monkeypatch):
    results = load_benchmark("results")
    monkeypatch.delenv(results.ENV_DIR, raising=False)
    assert results.write_result("x", {"a": 1}) is None
    monkeypatch.setenv(results.ENV_DIR, str(tmp_path))
    assert results.write_result("x", {"a": 1}).startswith(str(tmp_path))


def test_stage_outputs_and_artifact_properties_read_a_roots_last_run(tmp_path):
    results = load_benchmark("results")
    model = tmp_path / "Trainer" / "3" / "model"
    model.mkdir(parents=True)
    (model / "artifact.json").write_text(json.dumps({"properties": {"steps": 7}}))
    summary = {"stages": {"Trainer": {"outputs": {"model": str(model)}, "seconds": 1.0},
                          "Pusher": {"skipped": True}}}
    (tmp_path / "run_summary.json").write_text(json.dumps(summary))
    outputs = results.stage_outputs(str(tmp_path))
    assert outputs == {"Trainer": {"model": str(model)}, "Pusher": {}}
    assert results.artifact_properties(outputs["Trainer"]["model"]) == {"steps": 7}
