"""SIGKILL each stage at a random point, then re-run: nothing partial is read or published.

One pipeline root (with spaces and non-ASCII characters) goes through a chain
of runs of the same command, `captioner run --config tiny` with 4 epochs
and a checkpoint every 2 steps:

  run 1: killed in ExampleGen (while it writes its TFRecords)
  run 2: recovers ExampleGen, killed in Preprocess (Beam job running)
  run 3: recovers Preprocess, killed in Trainer (after its first checkpoint)
  run 4: Trainer resumes, killed in the Exporter (while the SavedModel is written)
  run 5: recovers the Exporter, evaluates and pushes.

Each re-run both recovers the previous kill (its stages before the killed one
are `cached`, the killed one runs again and completes) and goes on to the
next kill, so the chain costs about one pipeline run. Kill points are a
seeded random delay after the stage is seen running (seed: RELIABILITY_SEED,
printed). A watcher thread checks that every published folder (and serving
version) is complete the first time it is seen.

Also here: a Pusher killed right after publishing its version is not pushed
twice, and `publish_version` killed at random points (and at each phase)
leaves a serving folder that a polling `ModelManager` reads correctly.
"""
from __future__ import annotations

import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from components import pusher
from components.contract import schema
from components.contract.artifacts import Artifact
from pipeline import dag
from pipeline.runner import inspect
from tests.reliability.test_pipeline_faults import read_jsonl, record_ids
from tests.serving.conftest import model_store  # noqa: F401  (the fixture SavedModels)
from tests.test_e2e import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SEED = int(os.environ.get("RELIABILITY_SEED", "20251126"))
EPOCHS = 4
RUN_ARGS = ("run", "--config", "tiny", "--set", f"train.epochs={EPOCHS}",
            "--set", "train.checkpoint_every=2")
RUN_TIMEOUT = 300
STAGE_ORDER = list(dag.STAGE_NAMES)
# stage -> (what shows it is running, relative to the root; random extra delay range in s)
KILLS = {
    "ExampleGen": ("ExampleGen/.tmp-*/examples/train/*.tfrecord", (0.0, 0.08)),
    "Preprocess": ("Preprocess/.tmp-*", (0.3, 2.0)),
    "Trainer": ("Trainer/.work/*/checkpoints/checkpoint", (0.0, 1.0)),
    "Exporter": ("Exporter/.tmp-*/serving_model/saved_model/*", (0.0, 0.5)),
}


def _env() -> dict:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def _start(root: str, logs: str, tag: str, args=RUN_ARGS, prefix=()) -> subprocess.Popen:
    """`captioner run ...` in its own process group, output to `<logs>/<tag>.{out,err}`."""
    cmd = [sys.executable, *(prefix or ("-m", "pipeline.cli")), *args, "--root", root]
    return subprocess.Popen(cmd, cwd=REPO, env=_env(), start_new_session=True,
                            stdout=open(os.path.join(logs, f"{tag}.out"), "w"),
                            stderr=open(os.path.join(logs, f"{tag}.err"), "w"))


def _read(logs: str, tag: str) -> str:
    with open(os.path.join(logs, f"{tag}.err"), encoding="utf-8", errors="replace") as f:
        return f.read()


def _wait(proc: subprocess.Popen, logs: str, tag: str) -> str:
    try:
        proc.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"{tag} timed out:\n{_read(logs, tag)[-4000:]}")
    err = _read(logs, tag)
    assert proc.returncode == 0, f"{tag} failed:\n{err[-4000:]}"
    return err


def _kill_when(proc: subprocess.Popen, root: str, pattern: str, delay: float, logs: str,
               tag: str) -> float:
    """SIGKILLs the process group `delay` s after `pattern` first matches; returns the wait."""
    full = os.path.join(glob.escape(root), pattern)
    start = time.time()
    while not glob.glob(full):
        if proc.poll() is not None:
            pytest.fail(f"{tag} ended (rc {proc.returncode}) before {pattern} appeared:\n"
                        + _read(logs, tag)[-4000:])
        if time.time() - start > RUN_TIMEOUT:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"{tag}: {pattern} did not appear")
        time.sleep(0.003)
    seen = time.time() - start
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return seen


class PublishWatcher(threading.Thread):
    """Checks every published stage folder and serving version the first time it appears."""

    SERVING_FILES = ("saved_model.pb", os.path.join("variables", "variables.index"),
                     schema.EXPORT_RECORD)

    def __init__(self, root: str):
        super().__init__(daemon=True)
        self.root = root
        self.seen: dict[str, list[str]] = {}  # path -> what was missing at first sight
        self.stop = threading.Event()

    def _check(self) -> None:
        for spec in dag.STAGES:
            stage_dir = os.path.join(self.root, spec.name)
            for entry in _listdir(stage_dir):
                path = os.path.join(stage_dir, entry)
                if entry.isdigit() and path not in self.seen:
                    self.seen[path] = [name for name in spec.outputs if not os.path.exists(
                        os.path.join(path, name, "artifact.json"))]
        model_dir = os.path.join(self.root, "serving", "captioner")
        for entry in _listdir(model_dir):
            path = os.path.join(model_dir, entry)
            if entry.isdigit() and path not in self.seen:
                self.seen[path] = [f for f in self.SERVING_FILES
                                   if not os.path.exists(os.path.join(path, f))]

    def run(self) -> None:
        while not self.stop.is_set():
            self._check()
            time.sleep(0.005)
        self._check()


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def _executions(root: str, after: int = 0) -> list[dict]:
    """Executions with id > `after`, oldest first."""
    return sorted((x for x in inspect(root)["executions"] if x["id"] > after),
                  key=lambda x: x["id"])


def _last_id(root: str) -> int:
    if not os.path.exists(os.path.join(root, "metadata.sqlite")):
        return 0
    return max((x["id"] for x in inspect(root)["executions"]), default=0)


def _ids_of(uri: str) -> dict[str, list[str]]:
    return {s: record_ids(uri, s) for s in schema.SPLITS}


def check_published(root: str) -> list[str]:
    """Problems with any published artifact under `root` (empty: all complete and consistent)."""
    problems = []
    for spec in dag.STAGES:
        stage_dir = os.path.join(root, spec.name)
        for entry in sorted(e for e in _listdir(stage_dir) if e.isdigit()):
            for name, typ in spec.outputs.items():
                uri = os.path.join(stage_dir, entry, name)
                try:
                    art = Artifact.load(uri, typ)
                except Exception as e:  # noqa: BLE001 - reported as a problem
                    problems.append(f"{uri}: {e}")
                    continue
                if typ in ("Examples", "Annotations"):
                    ids = _ids_of(uri)
                    for split, split_ids in ids.items():
                        if len(split_ids) != art.counts[split]:
                            problems.append(f"{uri}/{split}: {len(split_ids)} records, "
                                            f"counts say {art.counts[split]}")
                    flat = [i for v in ids.values() for i in v]
                    if len(flat) != len(set(flat)):
                        problems.append(f"{uri}: duplicate image ids")
                    if len(flat) != art.counts["accepted"]:
                        problems.append(f"{uri}: {len(flat)} records, accepted "
                                        f"{art.counts['accepted']}")
                elif typ == "Model" and not os.path.exists(art.path("model.keras")):
                    problems.append(f"{uri}: no model.keras")
                elif typ == "PushedModel" and art.properties.get("pushed"):
                    if not os.path.exists(os.path.join(art.properties["path"],
                                                       "saved_model.pb")):
                        problems.append(f"{uri}: pushed version folder is gone")
    return problems


def _checkpoint_step(root: str) -> int:
    import tensorflow as tf
    [ckpt_dir] = glob.glob(os.path.join(glob.escape(root), "Trainer", ".work", "*",
                                        "checkpoints"))
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(ckpt_dir))
    return int(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE"))


def _poll_serving(model_dir: str, policy: str = "latest") -> dict:
    """What a polling server makes of a serving folder: one ModelManager poll."""
    from serving.versions.model_manager import ModelManager, ModelSource, VersionPolicy
    manager = ModelManager([ModelSource("captioner", model_dir, VersionPolicy.parse(policy))],
                           poll_seconds=0)
    try:
        manager.start()
        on_disk = sorted(manager._scan(manager._sources["captioner"]))
        try:
            states = {v: (s.state, s.error_message) for v, s in manager.status("captioner")}
        except Exception:  # noqa: BLE001 - NOT_FOUND: no version at all
            states = {}
        return {"available": manager.available_versions("captioner"), "on_disk": on_disk,
                "states": states}
    finally:
        manager.stop()


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """Runs the kill chain (see the module doc) and records what was observed."""
    base = tmp_path_factory.mktemp("kill chain")
    root = str(base / "kill root ü é")
    logs = str(base / "logs")
    os.makedirs(logs)
    rng = random.Random(SEED)
    watcher = PublishWatcher(root)
    watcher.start()
    kills, runs = {}, []
    started = time.time()
    try:
        for number, stage in enumerate(KILLS, start=1):
            tag = f"run{number}-kill-{stage}"
            pattern, (low, high) = KILLS[stage]
            delay = round(rng.uniform(low, high), 4)
            before = _last_id(root)
            proc = _start(root, logs, tag)
            waited = _kill_when(proc, root, pattern, delay, logs, tag)
            execs = _executions(root, before)
            stage_dir = os.path.join(root, stage)
            info = {"tag": tag, "delay": delay, "waited": round(waited, 2),
                    "executions": execs, "log": _read(logs, tag),
                    "leftovers": sorted(e for e in _listdir(stage_dir) if e.startswith(".tmp-")),
                    "published": sorted(e for e in _listdir(stage_dir) if e.isdigit()),
                    "problems": check_published(root)}
            if stage == "Trainer":
                info["checkpoint_step"] = _checkpoint_step(root)
            if stage == "Exporter":
                model_dir = os.path.join(root, "serving", "captioner")
                info["serving"] = sorted(_listdir(model_dir))
                info["poll"] = _poll_serving(model_dir)
            kills[stage] = info
            runs.append(execs)
            print(f"\n[kill] seed {SEED}: {stage} killed {delay:.3f}s after {pattern} appeared "
                  f"({waited:.1f}s into {tag})", end="")
        before = _last_id(root)
        tag = "run5-final"
        err = _wait(_start(root, logs, tag), logs, tag)
        runs.append(_executions(root, before))
        with open(os.path.join(root, "run_summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
    finally:
        watcher.stop.set()
        watcher.join()
    logs_by_run = [_read(logs, k["tag"]) for k in kills.values()] + [err]
    print(f"\n[kill] chain of 5 runs took {time.time() - started:.0f}s")
    model_dir = os.path.join(root, "serving", "captioner")
    final = {  # before any later test adds to the root
        "problems": check_published(root),
        "complete": sorted(x["stage"] for x in _executions(root) if x["state"] == "complete"),
        "states": {x["id"]: x["state"] for x in _executions(root)},
        "published": {s: sorted(e for e in _listdir(os.path.join(root, s)) if e.isdigit())
                      for s in STAGE_ORDER},
        "leftovers": [os.path.join(d, n) for d, ds, fs in os.walk(root) for n in ds + fs
                      if n.startswith((".tmp-", ".deleting-"))],
        "serving": sorted(os.listdir(model_dir)),
        "poll": _poll_serving(model_dir),
    }
    return {"root": root, "logs": logs, "kills": kills, "runs": runs, "run_logs": logs_by_run,
            "summary": summary, "watcher": watcher.seen, "final": final}


@pytest.mark.parametrize("stage", list(KILLS))
def test_the_kill_landed_in_the_stage_and_published_nothing_partial(chain, stage):
    kill = chain["kills"][stage]
    mine = [x for x in kill["executions"] if x["stage"] == stage]
    states = [(x["stage"], x["state"]) for x in kill["executions"]]
    assert mine and mine[-1]["state"] == "running", f"{stage} was not running when killed: {states}"
    killed_id = mine[-1]["id"]
    # Its unpublished folder is all that exists of it; nothing it wrote was published.
    assert f".tmp-{killed_id}" in kill["leftovers"]
    assert str(killed_id) not in kill["published"]
    assert kill["problems"] == []
    # Every stage before it completed (or was cached) in that run; none after it started.
    done = {x["stage"]: x["state"] for x in kill["executions"] if x["stage"] != stage}
    assert set(done) == set(STAGE_ORDER[:STAGE_ORDER.index(stage)])
    assert set(done.values()) <= {"complete", "cached"}


@pytest.mark.parametrize("stage", list(KILLS))
def test_the_rerun_caches_what_came_before_and_reruns_the_killed_stage(chain, stage):
    index = list(KILLS).index(stage)
    rerun, log = chain["runs"][index + 1], chain["run_logs"][index + 1]
    killed_id = [x for x in chain["kills"][stage]["executions"] if x["stage"] == stage][-1]["id"]
    assert f"executions [{killed_id}] were interrupted earlier" in log
    states = {x["stage"]: x["state"] for x in rerun}
    position = STAGE_ORDER.index(stage)
    for before in STAGE_ORDER[:position]:
        assert states[before] == "cached", (before, states)
    assert states[stage] == "complete", states
    # ... and the abandoned execution is recorded as such.
    assert chain["final"]["states"][killed_id] == "abandoned"


def test_the_final_run_completes_with_everything_before_the_exporter_cached(chain):
    summary = chain["summary"]
    exporter = STAGE_ORDER.index("Exporter")
    assert {n: s["status"] for n, s in summary["stages"].items()} == {
        **{n: "cached" for n in STAGE_ORDER[:exporter]},
        **{n: "ran" for n in STAGE_ORDER[exporter:]}}
    assert summary["blessed"] is True


def test_the_trainer_resumed_from_its_checkpoint(chain):
    step = chain["kills"]["Trainer"]["checkpoint_step"]
    assert step > 0
    log = chain["run_logs"][list(KILLS).index("Trainer") + 1]
    resumed = [int(m) for m in re.findall(r"resuming from step (\d+)", log)]
    assert resumed == [step], log[-3000:]
    model = Artifact.load(chain["summary"]["stages"]["Trainer"]["outputs"]["model"], "Model")
    annotations = Artifact.load(chain["summary"]["stages"]["Preprocess"]["outputs"]
                                ["annotations"], "Annotations")
    steps_per_epoch = annotations.counts["train"] // 16  # tiny: train.batch_size 16
    assert model.properties["resumed_from_step"] == step
    # The whole budget, not more: no step trained twice, no epoch repeated.
    assert model.counts["steps"] == model.properties["steps"] == EPOCHS * steps_per_epoch
    assert [row["epoch"] for row in model.properties["history"]] == list(range(EPOCHS))
    print(f"\n[kill] Trainer killed at checkpoint step {step}, resumed from step "
          f"{resumed[0]}, finished at {model.counts['steps']}")


def test_an_exporter_killed_mid_export_leaves_nothing_servable(chain):
    kill = chain["kills"]["Exporter"]
    # Killed while the SavedModel was being written: nothing reached the serving folder.
    assert kill["serving"] == [], kill
    assert kill["poll"] == {"available": [], "on_disk": [], "states": {}}
    assert chain["final"]["serving"] == ["1"]
    poll = chain["final"]["poll"]
    assert poll["available"] == poll["on_disk"] == [1], poll


def test_the_final_outputs_are_complete_without_duplicates(chain):
    final = chain["final"]
    assert final["problems"] == []
    summary = chain["summary"]
    examples = Artifact.load(summary["stages"]["ExampleGen"]["outputs"]["examples"])
    annotations = Artifact.load(summary["stages"]["Preprocess"]["outputs"]["annotations"])
    ex_ids = _ids_of(examples.uri)
    ann_ids = _ids_of(annotations.uri)
    flat = [i for v in ex_ids.values() for i in v]
    assert len(flat) == len(set(flat)) == examples.counts["accepted"] == \
        examples.counts["seen"] == 80
    assert {s: sorted(v) for s, v in ann_ids.items()} == {s: sorted(v) for s, v in ex_ids.items()}
    assert annotations.counts["accepted"] == annotations.counts["seen"] == 80
    evaluation = Artifact.load(summary["stages"]["Evaluator"]["outputs"]["evaluation"])
    captions = [c["image_id"] for c in read_jsonl(evaluation.path("captions.jsonl"))]
    assert len(captions) == len(set(captions)) == evaluation.counts["test_images"] == \
        len(ex_ids["test"])
    pushed = Artifact.load(summary["stages"]["Pusher"]["outputs"]["pushed_model"])
    assert pushed.properties["version"] == 1
    print(f"\n[kill] final: ExampleGen seen/accepted/rejected {examples.counts['seen']}/"
          f"{examples.counts['accepted']}/{examples.counts['rejected']}, Preprocess "
          f"{annotations.counts['seen']}/{annotations.counts['accepted']}/"
          f"{annotations.counts['rejected']}, test captions {len(captions)}, duplicate ids "
          f"{len(flat) - len(set(flat))}, serving versions {final['serving']}")
    # One execution of each stage completed in the whole chain: no stage published twice.
    assert final["complete"] == sorted(STAGE_ORDER)
    assert all(len(folders) == 1 for folders in final["published"].values()), final
    assert final["leftovers"] == []
    assert final["serving"] == ["1"]


def test_published_folders_only_ever_appeared_complete(chain):
    seen = chain["watcher"]
    assert len([p for p in seen if os.sep + "serving" + os.sep not in p]) == len(STAGE_ORDER)
    assert len([p for p in seen if os.sep + "serving" + os.sep in p]) == 1
    assert {p: missing for p, missing in seen.items() if missing} == {}


def test_a_pusher_killed_after_publishing_its_version_does_not_push_it_twice(chain):
    """The window between the version's rename and the runner's publish, hit on purpose."""
    root, logs = chain["root"], chain["logs"]
    model_dir = os.path.join(root, "serving", "captioner")
    before_versions = pusher.existing_versions(model_dir)
    # A new push (the export settings changed), so that the Pusher publishes a version.
    args = (*RUN_ARGS, "--set", "push.num_warmup_requests=2",
            "--stages", "Exporter,Evaluator,Pusher")
    kill_after_publish = (
        "-c", "import os, signal, sys\n"
        "import components.pusher as p\n"
        "real = p.publish_version\n"
        "def publish_then_die(*a, **k):\n"
        "    real(*a, **k)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "p.publish_version = publish_then_die\n"
        "from pipeline.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n")
    proc = _start(root, logs, "pusher-after-publish", args=args, prefix=kill_after_publish)
    proc.wait(timeout=RUN_TIMEOUT)
    assert proc.returncode == -signal.SIGKILL, _read(logs, "pusher-after-publish")[-3000:]
    killed = pusher.existing_versions(model_dir)
    assert killed == before_versions + [before_versions[-1] + 1]  # published, then killed
    err = _wait(_start(root, logs, "pusher-rerun", args=args), logs, "pusher-rerun")
    assert f"version {killed[-1]} already holds this SavedModel" in err
    assert pusher.existing_versions(model_dir) == killed  # no duplicate version
    with open(os.path.join(root, "run_summary.json"), encoding="utf-8") as f:
        pushed = json.load(f)["stages"]["Pusher"]
    assert pushed["status"] == "ran"
    assert Artifact.load(pushed["outputs"]["pushed_model"]).properties["version"] == killed[-1]
    poll = _poll_serving(model_dir)
    assert poll["available"] == [killed[-1]] and poll["on_disk"] == killed


# ----------------------------------------------------------------------------- publish_version

PUSH_CHILD = r"""
import os, shutil, signal, sys, time
from components import pusher
src, model_dir, phase = sys.argv[1:4]
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
files = sorted(os.path.relpath(os.path.join(d, n), src) for d, _, ns in os.walk(src) for n in ns)

def slow_copy(tmp):
    # File by file, in 1 KiB chunks with pauses (~0.2 s): a kill can land inside a file.
    for i, rel in enumerate(files):
        if phase == "mid-copy" and i == len(files) // 2:
            die()
        os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
        with open(os.path.join(src, rel), "rb") as fi, open(os.path.join(tmp, rel), "wb") as fo:
            while True:
                chunk = fi.read(1024)
                if not chunk:
                    break
                fo.write(chunk)
                fo.flush()
                time.sleep(0.002)

real_rename, real_rmtree = os.rename, shutil.rmtree
def rename(a, b):
    publishing = os.path.basename(a).startswith(".tmp-")
    if publishing and phase == "before-rename":
        die()
    real_rename(a, b)
    if publishing and phase == "after-rename":
        die()
def rmtree(path, *args, **kwargs):
    if phase == "mid-retention" and os.path.basename(path).startswith(".deleting-"):
        die()
    real_rmtree(path, *args, **kwargs)
pusher.os.rename, pusher.shutil.rmtree = rename, rmtree
print("pushing", flush=True)
pusher.publish_version(model_dir, slow_copy, keep_versions=2)
"""


def _tree(path: str) -> dict[str, int]:
    return {os.path.relpath(os.path.join(d, n), path): os.path.getsize(os.path.join(d, n))
            for d, _, ns in os.walk(path) for n in ns}


def test_publish_version_killed_anywhere_leaves_only_complete_versions(model_store, tmp_path):
    """Several seeded random kill points, plus each phase hit on purpose."""
    from serving.versions.model_manager import ModelManager, ModelSource
    saved_model = model_store["image"]  # a SavedModel with the serving contract and warmup
    model_dir = str(tmp_path / "serving ü" / "captioner")
    os.makedirs(model_dir)
    expected = _tree(saved_model)
    rng = random.Random(SEED)
    phases = ["mid-copy", "before-rename", "after-rename", "random", "random", "mid-retention",
              "random", "random", "random", "random", "random", "random"]
    # A polling server the whole time (latest version, polls every 10 ms).
    manager = ModelManager([ModelSource("captioner", model_dir)], poll_seconds=0.01)
    manager.start()
    report = []
    try:
        for phase in phases:
            before = pusher.existing_versions(model_dir)
            proc = subprocess.Popen([sys.executable, "-c", PUSH_CHILD, saved_model, model_dir,
                                     phase], cwd=REPO, env=_env(), start_new_session=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert proc.stdout.readline().strip() == "pushing"
            delay = None
            if phase == "random":
                delay = round(rng.uniform(0.0, 0.25), 4)
                time.sleep(delay)
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            after = pusher.existing_versions(model_dir)
            entries = sorted(os.listdir(model_dir))
            hidden = [e for e in entries if e.startswith(".")]
            report.append((phase, delay, proc.returncode, after, hidden))
            assert proc.returncode in (-signal.SIGKILL, 0), proc.stderr.read()[-2000:]
            # Only complete versions are version folders; the rest is hidden.
            for v in after:
                assert _tree(os.path.join(model_dir, str(v))) == expected, (phase, v)
            assert set(entries) == {str(v) for v in after} | set(hidden)
            assert all(e.startswith((".tmp-", ".deleting-")) for e in hidden)
            pushed = before + [max(before, default=0) + 1]
            # Not published, published (retention not done), or published and retained.
            assert after in (before, pushed, pushed[-2:]), (phase, before, after)
            # What a poller makes of it now: exactly the complete versions.
            poll = _poll_serving(model_dir, policy="all")
            assert poll["on_disk"] == after and poll["available"] == after, poll
            assert all(state == "AVAILABLE" for state, _ in poll["states"].values()), poll
            # The next push cleans the leftovers and publishes the next version.
            version, _ = pusher.publish_version(
                model_dir, lambda tmp: shutil.copytree(saved_model, tmp), keep_versions=2)
            assert version == max(after, default=0) + 1
            assert not [e for e in os.listdir(model_dir) if e.startswith(".")]
            assert manager.wait_for_version("captioner", version, timeout=30)
    finally:
        manager.stop()
    # The background poller never failed to load a version it found.
    failed = {v: s.error_message for v, s in manager.status("captioner")
              if s.error_message}
    assert failed == {}
    print(f"\n[push kill] seed {SEED}: " + "; ".join(
        f"{phase}{'' if d is None else f'@{d:.3f}s'} -> rc {rc}, versions {vs}, hidden {h}"
        for phase, d, rc, vs, h in report))
