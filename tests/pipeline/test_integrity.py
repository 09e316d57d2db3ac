"""Artifacts checked on disk: file lists at publish, sizes on a cache hit, checksums with
--verify, and damaged records read by a stage reported in one line."""
import json
import os
import sqlite3

import google_crc32c
import pytest

from components.contract.artifacts import ARTIFACT_FILE, Artifact
from pipeline import cli, integrity
from pipeline import config as config_lib
from pipeline.runner import Runner, StageError, inspect
from tests.pipeline import fake_stages_records as records


@pytest.fixture(autouse=True)
def _keep_this_process_as_it_is(monkeypatch):
    """`cli.main` here leaves the test process's logging and environment alone."""
    monkeypatch.setenv("CAPTIONER_VERBOSE", "1")


def _run(root, stages=None, use_cache=True, verify=False, log=None):
    lines = [] if log is None else log
    runner = Runner(config_lib.PipelineConfig(), str(root), use_cache=use_cache,
                    stages=records.STAGES, log=lines.append, verify=verify)
    return runner.run(stages)


def _statuses(summary):
    return {name: st["status"] for name, st in summary["stages"].items()}


def _shard(summary, i=1):
    return os.path.join(summary["stages"]["W"]["outputs"]["out"], *records.shard_name(i).split("/"))


def _truncate(path):
    """Cuts a file in the middle of a record (its records are all the same size); (old, new) size."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2 - 3)
    return size, size // 2 - 3


def _flip_byte(path):
    """Flips one bit in the middle of the file, inside a record's payload; the size is kept."""
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))


@pytest.fixture
def finished(tmp_path):
    """A root where W, R and T ran once."""
    summary = _run(tmp_path)
    assert _statuses(summary) == {"W": "ran", "R": "ran", "T": "ran"}
    return tmp_path, summary


def test_artifact_json_lists_every_file_with_size_and_checksum(finished):
    root, summary = finished
    art = Artifact.load(summary["stages"]["W"]["outputs"]["out"])
    assert sorted(art.files) == [records.shard_name(i) for i in range(records.SHARDS)]
    for rel, entry in art.files.items():
        with open(art.path(rel), "rb") as f:
            data = f.read()
        assert entry == {"size": len(data), "crc32c": f"{google_crc32c.value(data):08x}"}
    assert integrity.CHECKSUM == "crc32c"
    model = Artifact.load(summary["stages"]["R"]["outputs"]["out"])
    assert list(model.files) == ["count.txt"]  # artifact.json itself is not listed


def test_truncated_shard_reruns_its_producer(finished):
    root, summary = finished
    shard = _shard(summary)
    size, cut = _truncate(shard)
    log = []
    # W is not selected: its outputs fail the size check, so it is rebuilt, not reused.
    again = _run(root, stages=["R"], log=log)
    assert _statuses(again) == {"W": "ran", "R": "ran"}
    [line] = [x for x in log if "not reusing" in x]
    assert line == (f"[W] not reusing execution 1: its out is damaged: {shard} is "
                    f"{cut} bytes, {size} recorded (size check)")
    assert again["stages"]["R"]["counts"] == {"read": records.SHARDS * records.RECORDS_PER_SHARD}


def test_inspect_verify_reports_a_flipped_then_a_truncated_file(finished, capsys):
    root, summary = finished
    assert cli.main(["inspect", "--root", str(root), "--verify"]) == 0
    assert "verify: 3 artifacts intact, 0 damaged, 0 unchecked" in capsys.readouterr().out
    flipped, truncated = _shard(summary, 1), _shard(summary, 2)
    _flip_byte(flipped)
    assert cli.main(["inspect", "--root", str(root), "--verify"]) == 1
    out = capsys.readouterr().out
    assert f"[DAMAGED: {flipped} has crc32c " in out and "(crc32c check)]" in out
    assert "verify: 2 artifacts intact, 1 damaged, 0 unchecked" in out
    # Every size is compared before any checksum: the truncated shard is named first.
    size, cut = _truncate(truncated)
    info = inspect(str(root), verify=True)
    assert info["verify"] == {"ok": 2, "damaged": 1, "unchecked": 0, "missing": 0}
    [w] = [x for x in info["executions"] if x["stage"] == "W"]
    assert w["outputs"][0]["verify"] == {
        "status": "damaged",
        "problem": f"{truncated} is {cut} bytes, {size} recorded (size check)"}


def test_flipped_byte_passes_the_size_check_and_fails_verify(finished):
    root, summary = finished
    shard = _shard(summary)
    _flip_byte(shard)
    assert _statuses(_run(root)) == {"W": "cached", "R": "cached", "T": "cached"}
    log = []
    summary = _run(root, verify=True, log=log)
    assert _statuses(summary) == {"W": "ran", "R": "ran", "T": "ran"}
    [line] = [x for x in log if "not reusing" in x]
    assert f"its out is damaged: {shard} has crc32c " in line and line.endswith("(crc32c check)")


@pytest.mark.parametrize("stage", ["R", "T"])
def test_a_damaged_record_read_downstream_is_one_line(finished, stage):
    root, summary = finished
    shard = _shard(summary)
    _flip_byte(shard)
    with pytest.raises(StageError) as caught:
        _run(root, stages=[stage], use_cache=False)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{stage} failed: input x (Annotations of W execution 1) is "
                              f"damaged: {shard} has crc32c ")
    assert "(crc32c check, DataLossError: corrupted record at " in message
    assert message.endswith(f"rebuild it with: captioner run --root {root} "
                            f"--stages W,{stage} --no-cache")
    # Nothing published, the failure recorded.
    failed = [x for x in inspect(str(root))["executions"] if x["state"] == "failed"]
    assert [x["stage"] for x in failed] == [stage]
    assert not os.path.exists(os.path.join(root, stage, str(failed[0]["id"])))
    # The command it names rebuilds W and runs the stage.
    rebuilt = Runner(config_lib.PipelineConfig(), str(root), use_cache=False,
                     stages=records.STAGES, log=lambda _: None).run(["W", stage])
    assert _statuses(rebuilt) == {"W": "ran", stage: "ran"}


def test_a_truncated_shard_without_a_file_list_is_named_by_its_reader(finished):
    root, summary = finished
    uri = summary["stages"]["W"]["outputs"]["out"]
    with open(os.path.join(uri, ARTIFACT_FILE)) as f:
        meta = json.load(f)
    del meta["files"]  # as published before file lists were recorded
    with open(os.path.join(uri, ARTIFACT_FILE), "w") as f:
        json.dump(meta, f)
    shard = _shard(summary)
    _truncate(shard)
    assert integrity.check_artifact(uri, checksums=True)[1] is None  # nothing to check
    with pytest.raises(StageError) as caught:
        _run(root, stages=["R"], use_cache=False)
    message = str(caught.value)
    assert message.startswith(f"R failed: input x (Annotations of W execution 1) is damaged: "
                              f"{shard} cannot be read (DataLossError: truncated record at ")
    assert message.endswith("--stages W,R --no-cache")


def test_artifacts_without_a_file_list_are_reused_and_reported_unchecked(finished):
    root, summary = finished
    for stage in ("W", "R", "T"):
        uri = summary["stages"][stage]["outputs"]["out"]
        with open(os.path.join(uri, ARTIFACT_FILE)) as f:
            meta = json.load(f)
        del meta["files"]
        with open(os.path.join(uri, ARTIFACT_FILE), "w") as f:
            json.dump(meta, f)
    assert _statuses(_run(root, verify=True)) == {"W": "cached", "R": "cached", "T": "cached"}
    assert inspect(str(root), verify=True)["verify"] == {"ok": 0, "damaged": 0, "unchecked": 3,
                                                         "missing": 0}


def test_a_damaged_artifact_json_reruns_its_producer(finished):
    root, summary = finished
    path = os.path.join(summary["stages"]["R"]["outputs"]["out"], ARTIFACT_FILE)
    with open(path, "r+b") as f:
        # Cut after the opening brace: the same JSON error whatever the file's length
        # (half of it lands inside a string or not, as the config grows).
        f.truncate(1)
    log = []
    assert _statuses(_run(root, log=log)) == {"W": "cached", "R": "ran", "T": "cached"}
    [line] = [x for x in log if "not reusing" in x]
    assert line.startswith(f"[R] not reusing execution 2: its out is damaged: {path} cannot be "
                           "read (Expecting")


def test_a_parse_failure_not_traced_to_an_input_keeps_its_own_error(finished, monkeypatch):
    from google.protobuf.message import DecodeError

    def bad_parse(ctx):
        raise DecodeError("Error parsing message")
    monkeypatch.setattr(records, "run", bad_parse)
    with pytest.raises(DecodeError):
        _run(finished[0], stages=["R"], use_cache=False)


def test_the_store_records_what_was_published_relative_to_the_root(finished):
    root, _ = finished
    with sqlite3.connect(os.path.join(root, "metadata.sqlite")) as db:
        uris = [r[0] for r in db.execute("SELECT uri FROM artifacts")]
    assert uris == ["W/1/out", "R/2/out", "T/3/out"]


def test_a_rebuilt_upstream_stage_reruns_the_unselected_stages_after_it(tmp_path):
    from tests.pipeline import fake_stages

    def run(stages=None):
        return Runner(config_lib.PipelineConfig(), str(tmp_path), stages=fake_stages.STAGES,
                      log=lambda _: None).run(stages)

    first = run()
    with open(os.path.join(first["stages"]["A"]["outputs"]["out"], "value.txt"), "w") as f:
        f.write("a0 damaged")
    # A fails its size check; B, not selected either, reads A's new output: it runs too.
    assert _statuses(run(["C"])) == {"A": "ran", "B": "ran", "C": "ran"}
    assert _statuses(run(["C"])) == {"C": "cached"}


def test_inspect_verify_counts_a_removed_execution_as_missing_not_damaged(finished, capsys):
    import shutil
    root, summary = finished
    shutil.rmtree(os.path.dirname(summary["stages"]["T"]["outputs"]["out"]))
    assert cli.main(["inspect", "--root", str(root), "--verify"]) == 0
    assert ("verify: 2 artifacts intact, 0 damaged, 0 unchecked (published before file lists "
            "were recorded), 1 missing (folder removed)") in capsys.readouterr().out


def test_damaged_data_not_found_in_any_input_points_at_the_resume_state(finished, monkeypatch):
    import tensorflow as tf

    def reads_a_bad_checkpoint(ctx):
        raise tf.errors.DataLossError(None, None, "truncated record at 12")
    monkeypatch.setattr(records, "run", reads_a_bad_checkpoint)
    with pytest.raises(StageError) as caught:
        _run(finished[0], stages=["R"], use_cache=False)
    message = str(caught.value)
    assert message.startswith("R failed reading damaged data (DataLossError: truncated record "
                              "at 12), and none of its input artifacts (x) fails its size or "
                              "checksum check: the damage is in its resume state (remove ")
    assert os.path.join(str(finished[0]), "R", ".work") in message
