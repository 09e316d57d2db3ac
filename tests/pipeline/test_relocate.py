"""Relocatable roots: a copied, moved or older root reads its own artifacts, never its origin."""
import json
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

from components.contract.artifacts import ARTIFACT_FILE, Artifact
from pipeline import config as config_lib
from pipeline.runner import Runner, inspect
from tests.pipeline import fake_stages_serving
from tests.pipeline.test_integrity import _flip_byte


def _run(root, overrides=(), use_cache=True, log=None):
    config = config_lib.apply_overrides(config_lib.PipelineConfig(), overrides)
    lines = [] if log is None else log
    return Runner(config, str(root), use_cache=use_cache, stages=fake_stages_serving.STAGES,
                  log=lines.append).run()


def _statuses(summary):
    return {name: st["status"] for name, st in summary["stages"].items()}


def _snapshot(folder):
    """Every file under `folder` with its size and modification time."""
    found = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            st = os.stat(os.path.join(dirpath, name))
            found[os.path.relpath(os.path.join(dirpath, name), folder)] = (st.st_size,
                                                                          st.st_mtime_ns)
    return found


def _files_naming(folder, text):
    """Files under `folder` whose bytes contain `text`."""
    hits = []
    for dirpath, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                if text.encode() in f.read():
                    hits.append(os.path.relpath(os.path.join(dirpath, name), folder))
    return sorted(hits)


def _finished(tmp_path, overrides=()):
    """A root named with a space where A, B, C, P ran twice (so C has a pushed baseline)."""
    origin = tmp_path / "origin root"
    _run(origin, overrides)
    _run(origin, ["train.batch_size=7", *overrides])
    return origin


def test_a_copy_works_alone_once_the_original_is_deleted(tmp_path):
    origin = _finished(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(origin, copy)
    shutil.rmtree(origin)

    cached = _run(copy, ["train.batch_size=7"])
    assert _statuses(cached) == {"A": "cached", "B": "cached", "C": "cached", "P": "cached"}
    pushed = Artifact.load(cached["stages"]["P"]["outputs"]["pushed"])
    assert pushed.uri.startswith(str(copy) + os.sep)
    for key in ("path", "serving_dir", "model_uri", "evaluation_uri"):
        assert pushed.properties[key].startswith(str(copy) + os.sep), key
    assert pushed.properties["external_paths"] == [pushed.properties["path"]]
    assert open(os.path.join(pushed.properties["path"], "model.txt")).read() == "a0-b7"
    evaluation = Artifact.load(cached["stages"]["C"]["outputs"]["out"])
    assert evaluation.properties["baseline"] == str(copy / "C" / "3" / "out")
    assert evaluation.inputs == {"y": str(copy / "B" / "6" / "out"),
                                 "baseline": str(copy / "C" / "3" / "out")}

    rebuilt = _run(copy, ["train.batch_size=7"], use_cache=False)
    assert _statuses(rebuilt) == {"A": "ran", "B": "ran", "C": "ran", "P": "ran"}
    out = Artifact.load(rebuilt["stages"]["C"]["outputs"]["out"])
    assert open(out.path("value.txt")).read() == "a0-b7-evaluated"
    assert out.properties["baseline"].startswith(str(copy) + os.sep)
    assert os.path.isdir(copy / "serving" / "captioner" / str(rebuilt["pushed_version"]))
    assert not os.path.exists(origin)


def test_a_copy_never_reads_or_writes_its_origin(tmp_path):
    origin = _finished(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(origin, copy)
    # Only the last run's report names the origin; the store and artifacts do not.
    assert _files_naming(copy, str(origin)) == ["run_summary.json"]
    before = _snapshot(origin)
    assert _statuses(_run(copy, ["train.batch_size=7"]))["P"] == "cached"
    _run(copy, ["train.batch_size=9"])
    _run(copy, use_cache=False)
    assert _snapshot(origin) == before
    info = inspect(str(copy))
    uris = [e["uri"] for x in info["executions"] for e in x["inputs"] + x["outputs"]]
    assert uris and all(u.startswith(str(copy) + os.sep) for u in uris)


def test_a_serving_dir_outside_the_root_stays_absolute(tmp_path):
    outside = tmp_path / "serving outside"
    origin = _finished(tmp_path, [f"push.serving_dir={outside}"])
    summary = _run(origin, ["train.batch_size=7", f"push.serving_dir={outside}"])
    with open(os.path.join(summary["stages"]["P"]["outputs"]["pushed"], ARTIFACT_FILE)) as f:
        raw = json.load(f)
    assert raw["properties"]["serving_dir"] == str(outside)
    assert raw["properties"]["external_paths"] == [raw["properties"]["path"]]
    assert raw["properties"]["path"].startswith(str(outside) + os.sep)
    assert raw["properties"]["model_uri"] == "${root}/B/6/out"
    assert raw["inputs"] == {"y": "${root}/B/6/out", "evaluation": "${root}/C/7/out"}
    moved = tmp_path / "moved"
    os.rename(origin, moved)
    again = _run(moved, ["train.batch_size=7", f"push.serving_dir={outside}"])
    assert _statuses(again)["P"] == "cached"
    assert Artifact.load(again["stages"]["P"]["outputs"]["pushed"]).properties[
        "external_paths"] == raw["properties"]["external_paths"]


def _as_older_root(root):
    """Rewrites a root as roots were written before relocation: absolute paths, no file lists."""
    for dirpath, _, files in os.walk(root):
        if ARTIFACT_FILE in files:
            path = os.path.join(dirpath, ARTIFACT_FILE)
            with open(path) as f:
                meta = json.loads(f.read().replace('"${root}', json.dumps(str(root))[:-1]))
            meta.pop("files")
            meta["schema_version"] = 1
            with open(path, "w") as f:
                json.dump(meta, f)
    with sqlite3.connect(os.path.join(root, "metadata.sqlite")) as db:
        db.execute("UPDATE artifacts SET uri = ? || uri", (str(root) + os.sep,))
    db.close()


def test_an_older_root_that_was_moved_reads_its_absolute_paths_as_relative(tmp_path):
    origin = _finished(tmp_path)
    _as_older_root(origin)
    with sqlite3.connect(os.path.join(origin, "metadata.sqlite")) as db:
        assert db.execute("SELECT uri FROM artifacts LIMIT 1").fetchone()[0].startswith(
            str(origin))
    db.close()
    moved = tmp_path / "moved"
    os.rename(origin, moved)
    log = []
    summary = _run(moved, ["train.batch_size=7"], log=log)
    assert _statuses(summary) == {"A": "cached", "B": "cached", "C": "cached", "P": "cached"}
    said = [line for line in log if "former location" in line]
    assert said == [f"[runner] {moved / 'metadata.sqlite'} records artifacts under {origin}, "
                    f"this root's former location: reading them under {moved}"]
    pushed = Artifact.load(summary["stages"]["P"]["outputs"]["pushed"])
    assert pushed.properties["path"] == str(moved / "serving" / "captioner" / "8")
    assert pushed.properties["model_uri"] == str(moved / "B" / "6" / "out")
    assert pushed.files is None
    assert inspect(str(moved), verify=True)["verify"] == {"ok": 0, "damaged": 0,
                                                          "unchecked": 7, "missing": 0}
    # New executions in the older store are recorded relative to the root.
    assert _statuses(_run(moved, ["train.batch_size=5"]))["B"] == "ran"
    with sqlite3.connect(os.path.join(moved, "metadata.sqlite")) as db:
        newest = db.execute("SELECT uri FROM artifacts ORDER BY id DESC LIMIT 1").fetchone()[0]
    db.close()
    assert newest.startswith("P" + os.sep) and not os.path.isabs(newest)


def test_inspect_shows_paths_where_they_are_now(tmp_path):
    origin = _finished(tmp_path)
    moved = tmp_path / "moved"
    os.rename(origin, moved)
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "inspect", "--root", str(moved)],
                          capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                              os.path.abspath(__file__)))))
    assert proc.returncode == 0, proc.stderr
    assert f"PushedModel  #7 {moved / 'P' / '8' / 'pushed'}\n" in proc.stdout
    assert str(origin) not in proc.stdout


def _captioner(*args):
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *map(str, args)], cwd=repo,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})


@pytest.mark.slow
@pytest.mark.e2e
def test_a_copied_tiny_root_runs_alone_and_finds_a_damaged_shard(tmp_path):
    """The real stages (`--config tiny`, ~2 min): copy, delete the original, run, damage, rebuild."""
    origin, copy = tmp_path / "tiny origin é", tmp_path / "tiny copy"
    proc = _captioner("run", "--config", "tiny", "--root", origin)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shutil.copytree(origin, copy)
    shutil.rmtree(origin)

    cached = _captioner("run", "--root", copy)
    assert cached.returncode == 0, cached.stderr[-3000:]
    with open(copy / "run_summary.json") as f:
        summary = json.load(f)
    assert {st["status"] for st in summary["stages"].values()} == {"cached"}
    assert len(summary["stages"]) == 7
    rebuilt = _captioner("run", "--root", copy, "--no-cache")
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    with open(copy / "run_summary.json") as f:
        summary = json.load(f)
    assert {st["status"] for st in summary["stages"].values()} == {"ran"}
    pushed = Artifact.load(summary["stages"]["Pusher"]["outputs"]["pushed_model"]).properties
    assert pushed["path"].startswith(str(copy) + os.sep)
    assert os.path.exists(os.path.join(pushed["path"], "saved_model.pb"))
    verified = _captioner("inspect", "--root", copy, "--verify")
    assert verified.returncode == 0 and " 0 damaged, 0 unchecked" in verified.stdout

    # One flipped bit in an Annotations shard: same size, so a plain cache hit reuses it;
    # the Trainer reading it stops with one line.
    annotations = summary["stages"]["Preprocess"]["outputs"]["annotations"]
    [shard] = [f for f in Artifact.load(annotations).files if f.startswith("train/")]
    _flip_byte(os.path.join(annotations, shard))
    failed = _captioner("run", "--root", copy, "--stages", "Trainer", "--set", "train.epochs=3")
    assert failed.returncode == 1
    assert "Traceback" not in failed.stderr
    line = failed.stderr.strip().splitlines()[-1]
    preprocess_id = summary["stages"]["Preprocess"]["execution_id"]
    assert line.startswith(f"captioner: Trainer failed: input annotations (Annotations of "
                           f"Preprocess execution {preprocess_id}) is damaged: "
                           f"{os.path.join(annotations, shard)} has crc32c ")
    assert "(crc32c check, DataLossError: corrupted record at " in line
    assert line.endswith("--stages Preprocess,Trainer --no-cache")
    # --verify finds it at the cache hit: Preprocess is rebuilt, then the Trainer runs.
    fixed = _captioner("run", "--root", copy, "--stages", "Trainer", "--set", "train.epochs=3",
                       "--verify")
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert (f"[Preprocess] not reusing execution {preprocess_id}: its annotations is damaged: "
            f"{os.path.join(annotations, shard)} has crc32c ") in fixed.stderr
    with open(copy / "run_summary.json") as f:
        statuses = {k: v["status"] for k, v in json.load(f)["stages"].items()}
    assert statuses == {"Preprocess": "ran", "Trainer": "ran"}
