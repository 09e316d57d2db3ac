"""The pipeline under faults: bad inputs, odd paths, full and read-only disks.

- A COCO-style input (captions JSON + image folder, both with spaces and
  non-ASCII characters in their paths, like the pipeline root) where ~7% of
  the images are bad: random bytes, truncated PNG/JPEG, an empty file, an
  image PIL reads but TensorFlow does not (1-bit BMP), missing files, empty
  and whitespace-only captions, an image without captions and a duplicated
  image id. Every stage runs (`--config tiny`); at each stage
  accepted + dead-lettered == seen, each dead letter names its fault, and the
  bad inputs are exactly the ones dead-lettered.
- A root on a full disk (a real tmpfs in a private mount namespace, and
  ENOSPC injected at every write point of the runner) or a read-only disk
  fails with one clear line naming the path and what to do, records the
  stage as failed and publishes nothing.
"""
from __future__ import annotations

import collections
import errno
import io
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys

import pytest
from PIL import Image

from components.contract import io_utils, schema
from components.contract.artifacts import Artifact
from components.synthetic.shapes import generate
from pipeline import config as config_lib
from pipeline.runner import Runner, StageError, inspect
from tests.pipeline import fake_stages
from tests.test_e2e import REPO, _captioner

DATA_SEED = 7
NUM_IMAGES = 160
# Fault kind -> how many images get it: 12 of 161 JSON entries (7.5%).
FAULTS = {"random_bytes": 2, "truncated_png": 1, "truncated_jpeg": 1, "empty_file": 1,
          "one_bit_bmp": 1, "missing_file": 2, "empty_caption": 1, "whitespace_caption": 1,
          "no_captions": 1, "duplicate_id": 1}
TRAIN_STEPS = 4


def expected_reason(kind: str, reason: str) -> bool:
    """Whether a dead letter's reason names the fault that was injected."""
    return {
        "random_bytes": reason.startswith("undecodable image"),
        "truncated_png": reason.startswith("undecodable image") and "truncated" in reason.lower(),
        "truncated_jpeg": reason.startswith("undecodable image") and "truncated" in reason.lower(),
        "empty_file": reason == "empty image file",
        "one_bit_bmp": reason.startswith("undecodable image: TensorFlow"),
        "missing_file": reason.startswith("missing file"),
        "empty_caption": reason == "empty caption",
        "whitespace_caption": reason == "empty caption",
        "no_captions": reason == "image without captions",
        "duplicate_id": reason == "duplicate image id",
    }[kind]


def build_coco_with_faults(folder: str, num_images: int = NUM_IMAGES,
                           seed: int = DATA_SEED) -> dict:
    """Writes `captions ü.json` + `images ü/` with the FAULTS; returns what was injected.

    Images are the synthetic shapes (PNG, a fifth re-encoded as JPEG) with
    their captions; file names hold spaces and non-ASCII characters.

    Returns:
      {"captions_json", "images_dir", "entries": JSON image entries,
       "faults": image id -> fault kind, "good": ids that must be accepted}.
    """
    rnd = random.Random(seed)
    images_dir = os.path.join(folder, "images ü ñ")
    os.makedirs(images_dir, exist_ok=True)
    kinds = [k for k, n in FAULTS.items() if k != "duplicate_id" for _ in range(n)]
    order = list(range(num_images))
    rnd.shuffle(order)
    fault_of = dict(zip(order[:len(kinds)], kinds, strict=True))  # the first ids of the shuffle
    images, annotations, faults = [], [], {}
    for i, raw in enumerate(generate(num_images, image_size=32, seed=seed)):
        image_id = 5000 + i
        kind = fault_of.get(i)
        data, captions = raw.image_bytes, list(raw.captions)
        name = f"bild {i:03d} – ñ.png"
        if kind in ("truncated_jpeg",) or (kind is None and i % 5 == 0):
            buf = io.BytesIO()
            Image.open(io.BytesIO(data)).convert("RGB").save(buf, "JPEG", quality=90)
            data, name = buf.getvalue(), name[:-4] + ".jpg"
        if kind == "random_bytes":
            data = bytes(rnd.getrandbits(8) for _ in range(rnd.randint(100, 2000)))
        elif kind in ("truncated_png", "truncated_jpeg"):
            data = data[:len(data) // 2]
        elif kind == "empty_file":
            data = b""
        elif kind == "one_bit_bmp":  # PIL decodes it, TensorFlow's decode_image does not
            buf = io.BytesIO()
            Image.open(io.BytesIO(data)).convert("1").save(buf, "BMP")
            data, name = buf.getvalue(), name[:-4] + ".bmp"
        elif kind == "empty_caption":
            captions[2] = ""
        elif kind == "whitespace_caption":
            captions[1] = " \t\n "
        elif kind == "no_captions":
            captions = []
        if kind != "missing_file":
            with open(os.path.join(images_dir, name), "wb") as f:
                f.write(data)
        images.append({"id": image_id, "file_name": name})
        annotations += [{"id": len(annotations), "image_id": image_id, "caption": c}
                        for c in captions]
        if kind:
            faults[str(image_id)] = kind
    # A duplicated entry for a good image: the second sighting is dead-lettered.
    good_ids = [img["id"] for img in images if str(img["id"]) not in faults]
    dup = rnd.choice(good_ids)
    images.insert(rnd.randint(len(images) // 2, len(images)),
                  {"id": dup, "file_name": next(im["file_name"] for im in images
                                               if im["id"] == dup)})
    captions_json = os.path.join(folder, "captions ü ñ.json")
    with open(captions_json, "w", encoding="utf-8") as f:
        json.dump({"images": images, "annotations": annotations}, f, ensure_ascii=False)
    return {"captions_json": captions_json, "images_dir": images_dir, "entries": images,
            "faults": faults, "duplicate": str(dup),
            "good": {str(i) for i in good_ids}}


def record_ids(uri: str, split: str) -> list[str]:
    """`image/id` of every record of one split of an Examples/Annotations artifact, in order."""
    import tensorflow as tf
    return [tf.train.Example.FromString(r).features.feature["image/id"].bytes_list.value[0]
            .decode() for r in io_utils.read_records(schema.split_files(uri, split))]


def read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ----------------------------------------------------------------------------- faulty inputs


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory):
    data = build_coco_with_faults(str(tmp_path_factory.mktemp("coco input ü")))
    root = str(tmp_path_factory.mktemp("faults root ä ö")) + os.sep + "pipeline root é"
    _captioner("run", "--config", "tiny", "--root", root,
               "--set", "data.source=coco",
               "--set", f"data.captions_json={data['captions_json']}",
               "--set", f"data.images_dir={data['images_dir']}",
               "--set", f"train.max_steps={TRAIN_STEPS}")
    with open(os.path.join(root, "run_summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    arts = {}
    for stage in summary["stages"].values():
        for uri in stage["outputs"].values():
            art = Artifact.load(uri)
            arts[art.type] = art
    return {"data": data, "root": root, "summary": summary, "arts": arts}


@pytest.mark.e2e
@pytest.mark.slow
def test_every_stage_ran_on_the_faulty_input(faulty_run):
    summary = faulty_run["summary"]
    assert {n: s["status"] for n, s in summary["stages"].items()} == {
        n: "ran" for n in ("ExampleGen", "EncoderTrainer", "Preprocess", "Trainer",
                           "Exporter", "Evaluator", "Pusher")}
    assert summary["blessed"] is True
    print(f"\n[faults] injected into {len(faulty_run['data']['entries'])} JSON entries "
          f"({NUM_IMAGES} images): {FAULTS}")
    for name, st in summary["stages"].items():
        print(f"[faults] {name}: {json.dumps(st['counts'], sort_keys=True)}")


@pytest.mark.e2e
@pytest.mark.slow
def test_example_gen_dead_letters_exactly_the_bad_inputs(faulty_run):
    data, examples = faulty_run["data"], faulty_run["arts"]["Examples"]
    counts = examples.counts
    assert counts["seen"] == len(data["entries"]) == NUM_IMAGES + 1
    assert counts["accepted"] + counts["rejected"] == counts["seen"]
    assert counts["train"] + counts["val"] + counts["test"] == counts["accepted"]
    dead = read_jsonl(examples.path("dead_letters.jsonl"))
    assert len(dead) == counts["rejected"] == sum(FAULTS.values())
    by_id = collections.defaultdict(list)
    for d in dead:
        assert set(d) >= {"id", "reason"} and d["reason"]
        by_id[d["id"]].append(d["reason"])
    expected = {**data["faults"], data["duplicate"]: "duplicate_id"}
    assert set(by_id) == set(expected)
    for image_id, reasons in by_id.items():
        assert len(reasons) == 1, (image_id, reasons)
        assert expected_reason(expected[image_id], reasons[0]), (expected[image_id], reasons)
    # The missing files name the file (with its non-ASCII path).
    for d in dead:
        if expected[d["id"]] == "missing_file":
            assert d["path"] in d["reason"] and "ñ" in d["path"]
    kinds = collections.Counter(r.split(":")[0] for rs in by_id.values() for r in rs)
    assert counts["dead_letter_reasons"] == dict(kinds)
    # Exactly the good images were written, each once, with their captions.
    ids = [i for s in schema.SPLITS for i in record_ids(examples.uri, s)]
    assert len(ids) == len(set(ids)) == counts["accepted"]
    assert set(ids) == data["good"]
    for split in schema.SPLITS:
        assert len(record_ids(examples.uri, split)) == counts[split]


@pytest.mark.e2e
@pytest.mark.slow
def test_downstream_stages_conserve_counts(faulty_run):
    arts, root = faulty_run["arts"], faulty_run["root"]
    ex, enc = arts["Examples"].counts, arts["Encoder"].counts
    # EncoderTrainer reads train and val: it sees, and keeps, every accepted image.
    assert enc["encoder_train_images"] == ex["train"] and enc["encoder_val_images"] == ex["val"]

    ann = arts["Annotations"]
    counts, per_split = ann.counts, ann.properties["split_counts"]
    assert counts["seen"] == ex["accepted"]
    assert counts["accepted"] + counts["rejected"] == counts["seen"]
    dead = read_jsonl(ann.path("dead_letters.jsonl"))
    assert len(dead) == counts["rejected"]
    for d in dead:  # (none expected: ExampleGen caught every fault)
        assert d["id"] and d["reason"].startswith(("undecodable image", "unparseable record"))
    dead_ids = {d["id"] for d in dead}
    written = set()
    for split in schema.SPLITS:
        row = per_split[split]
        assert row["seen"] == ex[split]
        assert row["accepted"] + row["dead_lettered"] == row["seen"]
        ids = record_ids(ann.uri, split)
        assert len(ids) == len(set(ids)) == row["accepted"] == counts[split]
        assert set(ids) == set(record_ids(arts["Examples"].uri, split)) - dead_ids
        written |= set(ids)
    assert written == faulty_run["data"]["good"] - dead_ids

    model = arts["Model"]
    assert model.counts["train_examples"] == counts["train"]
    assert model.counts["val_examples"] == min(counts["val"], 16)  # tiny: train.val_examples
    assert model.counts["steps"] == TRAIN_STEPS

    evaluation = arts["Evaluation"]
    captions = read_jsonl(evaluation.path("captions.jsonl"))
    test_ids = [c["image_id"] for c in captions]
    assert evaluation.counts["test_images"] == counts["test"] == len(set(test_ids)) == \
        len(test_ids)
    assert set(test_ids) == set(record_ids(ann.uri, "test"))

    pushed = arts["PushedModel"]
    assert pushed.counts == {"pushed": 1}
    version_dir = pushed.properties["path"]
    assert version_dir.startswith(root)
    assert os.path.exists(os.path.join(version_dir, "saved_model.pb"))


@pytest.mark.e2e
@pytest.mark.slow
def test_a_polling_server_loads_the_push_under_a_non_ascii_root(faulty_run):
    from serving.versions.model_manager import ModelManager
    pushed = faulty_run["arts"]["PushedModel"]
    manager = ModelManager(config_file=pushed.properties["models_config"], poll_seconds=0)
    try:
        manager.start()
        assert manager.available_versions("captioner") == [pushed.properties["version"]]
    finally:
        manager.stop()


# ------------------------------------------------------------------------ full or read-only disks


def _private_tmpfs(tmp_path, size: str, script: str, env: dict, read_only: bool = False):
    """Runs bash `script` with a fresh tmpfs on $MNT, in a private mount namespace.

    The mount vanishes with the namespace, so nothing is left mounted. Skips,
    saying which step failed and its error, where mount namespaces or tmpfs
    mounts are not allowed (some containers).
    """
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare.append("--map-root-user")
    if shutil.which("unshare") is None:
        pytest.skip("disk-fault test not run: unshare(1) (util-linux) is not installed")
    probe = subprocess.run(unshare + ["true"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        who = "root" if os.geteuid() == 0 else "an unprivileged user"
        pytest.skip(f"disk-fault test not run: `{' '.join(unshare)} true` exited "
                    f"{probe.returncode}: {probe.stderr.strip()[-300:]} (no private mount "
                    f"namespace for {who} on this host)")
    mnt = tmp_path / "mnt ü"
    mnt.mkdir()
    opts = f"size={size}" + (",ro" if read_only else "")
    cmd = unshare + ["bash", "-c", f'mount -t tmpfs -o {opts} tmpfs "$MNT" || exit 97\n{script}']
    proc = subprocess.run(cmd, env={**os.environ, **env, "MNT": str(mnt),
                                    "TF_CPP_MIN_LOG_LEVEL": "2"},
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    if proc.returncode == 97:
        pytest.skip(f"disk-fault test not run: `mount -t tmpfs -o {opts}` in the private mount "
                    f"namespace failed: {proc.stderr.strip()[-300:]}")
    return proc


# After the failed run, still inside the namespace: what the root holds and what
# the metadata store recorded (the tmpfs is gone once the namespace ends).
_STATE_SCRIPT = """
import json, os, sys
from pipeline.runner import inspect
root = sys.argv[1]
tree = sorted(os.path.relpath(os.path.join(d, n), root)
              for d, ds, fs in os.walk(root) for n in ds + fs)
info = inspect(root) if os.path.exists(os.path.join(root, "metadata.sqlite")) else None
json.dump({"tree": tree, "inspect": info}, open(sys.argv[2], "w"), default=str)
"""


def test_root_on_a_full_disk_fails_clearly(tmp_path):
    state = tmp_path / "state.json"
    proc = _private_tmpfs(tmp_path, "128k", """
root="$MNT/root ä é"
"$PY" -m pipeline.cli run --config tiny --root "$root" --stages ExampleGen
echo "rc=$?" >&2
"$PY" -c "$STATE_SCRIPT" "$root" "$STATE"
""", {"PY": sys.executable, "STATE": str(state), "STATE_SCRIPT": _STATE_SCRIPT})
    assert "rc=1" in proc.stderr, proc.stderr[-3000:]
    message = [line for line in proc.stderr.splitlines() if line.startswith("captioner:")]
    assert len(message) == 1, proc.stderr[-3000:]
    message = message[0]
    print(f"\n[full disk] {message}")
    assert message.startswith("captioner: ExampleGen failed: no space left on device while "
                              "writing ")
    assert "/root ä é/ExampleGen/" in message  # the file it could not write
    assert "free some space" in message and "--root" in message
    assert "Traceback" not in proc.stderr
    result = json.loads(state.read_text())
    assert not [p for p in result["tree"] if ".tmp-" in p]  # the partial output was removed
    assert not [p for p in result["tree"]
                if p.startswith("ExampleGen" + os.sep) and p.split(os.sep)[1].isdigit()]
    [execution] = result["inspect"]["executions"]
    assert execution["stage"] == "ExampleGen" and execution["state"] == "failed"
    assert "No space left on device" in execution["error"]


def test_root_on_a_read_only_disk_fails_clearly(tmp_path):
    proc = _private_tmpfs(tmp_path, "1m", """
"$PY" -m pipeline.cli run --config tiny --root "$MNT/root ä é"
echo "rc=$?" >&2
""", {"PY": sys.executable}, read_only=True)
    assert "rc=1" in proc.stderr, proc.stderr[-3000:]
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("captioner:")]
    print(f"\n[read-only disk] {line}")
    assert line.startswith("captioner: pipeline root ") and "root ä é" in line
    assert line.endswith("is not writable (Read-only file system): choose a writable --root")
    assert "Traceback" not in proc.stderr


# ENOSPC (or EROFS) injected at each write point of a run, on the runner's
# stand-in stages A -> B -> C: the failure of stage B is one clear line, B is
# recorded as failed, nothing of B is published, and a re-run recovers.

def _stage_output_full(path):
    def run(ctx):
        with open(os.path.join(ctx.outputs["out"], "value.txt"), "w") as f:
            f.write("partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path(ctx))
    return run


def _tf_output_full(path):
    def run(ctx):
        import tensorflow as tf
        raise tf.errors.ResourceExhaustedError(None, None,
                                               f"{path(ctx)}; No space left on device")
    return run


def _beam_output_full(path):
    def run(ctx):  # Beam re-raises worker errors as text, chained to the original
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path(ctx))
        except OSError as e:
            raise RuntimeError(f"Error in WriteToTFRecord: {e} [while running 'Write']") \
                from None
    return run


def _read_only_output(path):
    def run(ctx):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), path(ctx))
    return run


def _quota_output(path):
    def run(ctx):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), path(ctx))
    return run


def _out_file(ctx):
    return os.path.join(ctx.outputs["out"], "value.txt")


INJECTIONS = {
    # name: (where, how, expected words, path in message?)
    "stage_output_oserror": ("stage", _stage_output_full(_out_file),
                             "no space left on device", True),
    "stage_output_tensorflow": ("stage", _tf_output_full(_out_file),
                                "no space left on device", True),
    "stage_output_beam_text": ("stage", _beam_output_full(_out_file),
                               "no space left on device", True),
    "stage_output_quota": ("stage", _quota_output(_out_file), "disk quota exceeded", True),
    "stage_output_read_only": ("stage", _read_only_output(_out_file),
                               "read-only file system", True),
    "artifact_json": ("write_artifact_json", None, "no space left on device", True),
    "fsync_before_publish": ("fsync_tree", None, "no space left on device", True),
    "metadata_store": ("finish_execution", None, "no space left on device", False),
}


ERROR_TEXT = {"no space left on device": "No space left on device",
              "disk quota exceeded": "Disk quota exceeded",
              "read-only file system": "Read-only file system"}


def _fake_run(root, use_cache=True):
    config = config_lib.PipelineConfig()
    return Runner(config, str(root), use_cache=use_cache, stages=fake_stages.STAGES,
                  log=lambda _: None).run()


@pytest.mark.parametrize("name", sorted(INJECTIONS))
def test_enospc_at_each_write_point_fails_clearly_and_publishes_nothing(
        name, tmp_path, monkeypatch):
    import tests.pipeline.fake_stages_b as stage_b
    from pipeline import runner as runner_mod
    from pipeline.metadata import MetadataStore
    where, stage_fn, words, names_path = INJECTIONS[name]
    root = tmp_path / "root ü é"
    seen_path = []
    if where == "stage":
        def failing(ctx, fn=stage_fn):
            seen_path.append(_out_file(ctx))
            return fn(ctx)
        monkeypatch.setattr(stage_b, "run", failing)
    elif where in ("write_artifact_json", "fsync_tree"):
        real = getattr(runner_mod, where)

        def failing(path, *args, **kwargs):
            # write_artifact_json gets the Artifact (its folder is `.uri`), fsync_tree a path.
            target = os.path.join(path.uri, "artifact.json") if where == "write_artifact_json" \
                else path
            if f"{os.sep}B{os.sep}" in target:
                seen_path.append(target)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), target)
            return real(path, *args, **kwargs)
        monkeypatch.setattr(runner_mod, where, failing)
    else:  # the metadata store cannot record B as complete
        real = MetadataStore.finish_execution

        def failing(self, execution_id, state, *args, **kwargs):
            row = self._db.execute("SELECT stage FROM executions WHERE id=?",
                                   (execution_id,)).fetchone()
            if row["stage"] == "B" and state == "complete":
                raise sqlite3.OperationalError("database or disk is full")
            return real(self, execution_id, state, *args, **kwargs)
        monkeypatch.setattr(MetadataStore, "finish_execution", failing)

    with pytest.raises(StageError) as info:
        _fake_run(root)
    message = str(info.value)
    print(f"\n[{name}] {message}")
    assert "\n" not in message
    assert message.startswith(f"B failed: {words}")
    assert repr(str(root)) in message
    if names_path:
        assert f"while writing {seen_path[0]}" in message
    assert ("choose a writable --root" if "read-only" in words
            else "free some space on that disk or choose another --root") in message

    executions = {x["stage"]: x for x in inspect(str(root))["executions"]}
    assert executions["A"]["state"] == "complete" and "C" not in executions
    published_b = [e for e in os.listdir(root / "B") if not e.startswith(".")]
    assert not [e for e in os.listdir(root / "B") if e.startswith(".tmp-")]
    if where == "finish_execution":
        # Published before the store failed: the execution never became
        # `complete`, so the folder is never reused (the re-run below runs B).
        assert executions["B"]["state"] == "running"
        assert len(published_b) == 1
    else:
        assert executions["B"]["state"] == "failed"
        assert ERROR_TEXT[words] in executions["B"]["error"]
        assert published_b == []

    monkeypatch.undo()  # the disk has room again: the re-run completes
    summary = _fake_run(root)
    assert {n: s["status"] for n, s in summary["stages"].items()} == \
        {"A": "cached", "B": "ran", "C": "ran"}
