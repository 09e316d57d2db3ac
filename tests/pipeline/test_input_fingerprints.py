"""Outside inputs: the content of every file or folder a config key names keys the cache."""
import io
import json
import os
import sqlite3

import pytest
from PIL import Image

from components.contract.config_paths import _PATH_KEYS
from pipeline import config as config_lib
from pipeline import dag
from pipeline import input_fingerprints as fps
from pipeline.metadata import MetadataStore
from pipeline.runner import Runner, StageError
from tests.pipeline import fake_stages

# A -> B -> C (data, train, eval) and E, which declares `encoder`.
STAGES = fake_stages.STAGES + (
    dag.StageSpec("E", "tests.pipeline.fake_stages_push", outputs={"pushed": "PushedModel"},
                  config_sections=("encoder",)),)


def _bump_mtime(path):
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5 * 10 ** 9))


def _edit(path, text):
    """Rewrites `path` and moves its mtime on (a coarse clock could keep it)."""
    with open(path, "w") as f:
        f.write(text)
    _bump_mtime(path)


# ----------------------------------------------------------------------------- records

def test_a_small_file_is_known_by_its_content(tmp_path):
    path = tmp_path / "captions.json"
    path.write_text('{"a": 1}')
    first = fps.path_record(str(path))
    assert first["type"] == "file" and first["size"] == 8 and "sha256" in first
    _bump_mtime(path)  # touch: the same content
    assert fps.content_key(fps.path_record(str(path))) == fps.content_key(first)
    _edit(path, '{"a": 2}')  # same size, other bytes
    assert fps.describe_changes({"k": first}, {"k": fps.path_record(str(path))}) == \
        {"k": "same size, content differs"}


def test_a_file_over_the_limit_is_known_by_size_and_mtime(tmp_path, monkeypatch):
    monkeypatch.setattr(fps, "HASH_LIMIT", 4)
    path = tmp_path / "weights.h5"
    path.write_bytes(b"0123456789")
    first = fps.path_record(str(path))
    assert "sha256" not in first and first["size"] == 10 and first["mtime_ns"]
    assert fps.path_record(str(path)) == first
    _bump_mtime(path)
    assert fps.describe_changes({"k": first}, {"k": fps.path_record(str(path))}) == \
        {"k": "same size, modified"}


def test_a_folder_is_known_by_its_manifest(tmp_path):
    top = tmp_path / "images"
    (top / "sub").mkdir(parents=True)
    (top / "a.png").write_bytes(b"aa")
    (top / "sub" / "b.png").write_bytes(b"bbb")
    first = fps.path_record(str(top))
    assert (first["type"], first["files"], first["bytes"]) == ("dir", 2, 5)
    assert fps.path_record(str(top)) == first
    _bump_mtime(top / "sub" / "b.png")  # a nested file rewritten in place, same size
    second = fps.path_record(str(top))
    assert fps.describe_changes({"k": first}, {"k": second}) == \
        {"k": "same 2 files and size, names or modification times differ"}
    (top / "sub" / "c.png").write_bytes(b"c")
    assert fps.describe_changes({"k": second}, {"k": fps.path_record(str(top))}) == \
        {"k": "2 -> 3 files, 5 -> 6 bytes"}
    os.remove(top / "a.png")
    assert fps.path_record(str(top))["files"] == 2


def test_missing_and_retyped_paths(tmp_path):
    missing = fps.path_record(str(tmp_path / "nope"))
    assert missing["type"] == "missing"
    (tmp_path / "nope").write_text("x")
    assert fps.describe_changes({"k": missing}, {"k": fps.path_record(str(tmp_path / "nope"))}) \
        == {"k": "was missing, now a file"}


def _config(overrides=()):
    return config_lib.apply_overrides(config_lib.PipelineConfig(), list(overrides))


def test_only_the_keys_a_stage_declares_and_its_config_uses_count(tmp_path, monkeypatch):
    (tmp_path / "c.json").write_text("{}")
    coco = ["data.source=coco", f"data.captions_json={tmp_path / 'c.json'}",
            f"data.images_dir={tmp_path}", "data.tfds_data_dir=/somewhere"]
    assert set(fps.stage_paths(("data",), _config(coco))) == {"data.captions_json",
                                                              "data.images_dir"}
    assert fps.stage_paths(("data.seed",), _config(coco)) == {}
    # The synthetic source reads none of them.
    assert fps.stage_paths(("data",), _config(coco[1:])) == {}
    # encoder.weights: only a path, only for keras_app.
    for kind, weights, counted in (("keras_app", str(tmp_path / "w.h5"), True),
                                   ("keras_app", "imagenet", False),
                                   ("keras_app", "None", False), ("keras_app", "", False),
                                   ("small_cnn", str(tmp_path / "w.h5"), False)):
        config = _config([f"encoder.kind={kind}", f"encoder.weights={weights}"])
        assert bool(fps.stage_paths(("encoder",), config)) == counted, (kind, weights)
    assert fps.stage_paths(("train",), _config(["train.init_model="])) == {}
    assert fps.stage_paths(("train",), _config(["train.init_model=m"])) == \
        {"train.init_model": os.path.abspath("m")}


def test_tfds_reads_the_datasets_folder_of_its_data_dir(tmp_path, monkeypatch):
    tfds = ["data.source=tfds", "data.tfds_name=synthetic_shapes/small:1.0.0"]
    given = _config(tfds + [f"data.tfds_data_dir={tmp_path}"])
    assert fps.stage_paths(("data",), given) == \
        {"data.tfds_data_dir": str(tmp_path / "synthetic_shapes")}
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "default"))
    assert fps.stage_paths(("data",), _config(tfds)) == \
        {"data.tfds_data_dir": str(tmp_path / "default" / "synthetic_shapes")}
    monkeypatch.delenv("TFDS_DATA_DIR")
    assert fps.stage_paths(("data",), _config(tfds))["data.tfds_data_dir"] == \
        os.path.join(os.path.expanduser("~"), "tensorflow_datasets", "synthetic_shapes")


def test_the_product_stages_declare_the_path_keys_they_read(tmp_path):
    # Every key of components.contract.config_paths._PATH_KEYS in use, by coco and by tfds.
    common = ["encoder.kind=keras_app", f"encoder.weights={tmp_path / 'w.h5'}",
              f"train.init_model={tmp_path / 'model'}"]
    read = {}
    for source in (["data.source=coco", "data.captions_json=c.json", "data.images_dir=i",
                    "data.instances_json=inst.json"],
                   ["data.source=tfds"]):
        config = _config(common + source)
        for spec in dag.STAGES:
            for key in fps.stage_paths(spec.config_sections, config):
                read.setdefault(key, set()).add(spec.name)
    assert read == {key: {stage} for stage, key, _ in _PATH_KEYS}


def test_a_store_from_before_the_column_stays_readable(tmp_path):
    db = tmp_path / "metadata.sqlite"
    old = sqlite3.connect(db)
    old.executescript("CREATE TABLE executions (id INTEGER PRIMARY KEY AUTOINCREMENT,"
                      " stage TEXT NOT NULL, fingerprint TEXT NOT NULL, state TEXT NOT NULL,"
                      " reused_execution INTEGER, started REAL NOT NULL, finished REAL,"
                      " config TEXT, counts TEXT, error TEXT);"
                      "INSERT INTO executions(stage, fingerprint, state, started)"
                      " VALUES ('A', 'f', 'complete', 1.0);")
    old.commit()
    old.close()
    store = MetadataStore(str(db))
    try:
        assert [x["stage"] for x in store.executions()] == ["A"]
        assert store.external_inputs("A") == []
        store.set_external_inputs(1, {"base": "b", "inputs": {}})
        assert store.external_inputs("A") == [(1, {"base": "b", "inputs": {}})]
    finally:
        store.close()
    MetadataStore(str(db)).close()  # a second open finds the column


# ----------------------------------------------------------------------------- the runner

def _run(root, overrides, stages=None):
    log = []
    summary = Runner(_config(overrides), str(root), stages=STAGES, log=log.append).run(stages)
    return {name: st["status"] for name, st in summary["stages"].items()}, summary, log


def _coco_inputs(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    for name in ("a.png", "b.png"):
        (images / name).write_bytes(b"png")
    captions = tmp_path / "captions.json"
    captions.write_text('{"images": [], "annotations": []}')
    return captions, images


def _keys(tmp_path):
    """key -> (overrides, the file to edit, the stages that re-run)."""
    captions, images = _coco_inputs(tmp_path)
    coco = ["data.source=coco", f"data.captions_json={captions}", f"data.images_dir={images}"]
    tfds_dir = tmp_path / "tfds" / "my_dataset" / "1.0.0"
    tfds_dir.mkdir(parents=True)
    (tfds_dir / "my_dataset-train.tfrecord-00000-of-00001").write_text("records")
    weights = tmp_path / "vgg19.weights.h5"
    weights.write_text("weights")
    model = tmp_path / "model"
    model.mkdir()
    (model / "best.keras").write_text("model")
    instances = tmp_path / "instances.json"
    instances.write_text('{"categories": [{"id": 1, "name": "dog"}]}')
    return {
        "data.captions_json": (coco, captions, {"A", "B", "C"}),
        "data.instances_json": (coco + [f"data.instances_json={instances}"], instances,
                                {"A", "B", "C"}),
        "data.images_dir": (coco, images / "b.png", {"A", "B", "C"}),
        "data.tfds_data_dir": (["data.source=tfds", "data.tfds_name=my_dataset:1.0.0",
                                f"data.tfds_data_dir={tmp_path / 'tfds'}"],
                               tfds_dir / "my_dataset-train.tfrecord-00000-of-00001",
                               {"A", "B", "C"}),
        "encoder.weights": (["encoder.kind=keras_app", f"encoder.weights={weights}"],
                            weights, {"E"}),
        "train.init_model": ([f"train.init_model={model}"], model / "best.keras", {"B", "C"}),
    }


@pytest.mark.parametrize("key", [key for _, key, _ in _PATH_KEYS])
def test_editing_an_outside_input_reruns_the_stage_that_reads_it(tmp_path, key):
    overrides, edited, reruns = _keys(tmp_path)[key]
    root = tmp_path / "root"
    statuses, _, _ = _run(root, overrides)
    assert set(statuses.values()) == {"ran"}
    statuses, _, _ = _run(root, overrides)
    assert set(statuses.values()) == {"cached"}
    _edit(edited, "edited in place")
    statuses, summary, log = _run(root, overrides)
    assert {s for s, status in statuses.items() if status == "ran"} == reruns
    reader = "E" if key == "encoder.weights" else "B" if key == "train.init_model" else "A"
    first = 1 if reader == "A" else {"E": 4, "B": 2}[reader]
    lines = [line for line in log if "changed since" in line]
    assert len(lines) == 1 and lines[0].startswith(f"[{reader}] {key} changed since execution "
                                                   f"{first} (") and lines[0].endswith(": running")
    changed = summary["stages"][reader]["changed_inputs"]
    assert [(c["key"], c["since_execution"]) for c in changed] == [(key, first)]
    for stage in reruns - {reader}:  # downstream re-runs because its input changed
        assert "changed_inputs" not in summary["stages"][stage]
    with open(root / "run_summary.json") as f:
        assert json.load(f)["stages"][reader]["changed_inputs"] == changed
    statuses, _, _ = _run(root, overrides)
    assert set(statuses.values()) == {"cached"}


def test_the_changed_line_says_how(tmp_path):
    captions, images = _coco_inputs(tmp_path)
    coco = ["data.source=coco", f"data.captions_json={captions}", f"data.images_dir={images}"]
    _run(tmp_path / "root", coco, ["A"])
    _edit(captions, "{}")
    (images / "c.png").write_bytes(b"png")
    _, summary, log = _run(tmp_path / "root", coco, ["A"])
    assert [line for line in log if "changed" in line] == [
        "[A] data.captions_json changed since execution 1 (size 33 -> 2 bytes, content differs); "
        "data.images_dir changed since execution 1 (2 -> 3 files, 6 -> 9 bytes): running"]


def test_touching_a_small_file_or_reverting_an_edit_keeps_the_cache(tmp_path):
    captions, images = _coco_inputs(tmp_path)
    coco = ["data.source=coco", f"data.captions_json={captions}", f"data.images_dir={images}"]
    text = captions.read_text()
    first, _, _ = _run(tmp_path / "root", coco, ["A"])
    _bump_mtime(captions)
    assert _run(tmp_path / "root", coco, ["A"])[0] == {"A": "cached"}
    _edit(captions, "{}")
    assert _run(tmp_path / "root", coco, ["A"])[0] == {"A": "ran"}
    _edit(captions, text)
    statuses, summary, log = _run(tmp_path / "root", coco, ["A"])
    assert statuses == {"A": "cached"} and summary["stages"]["A"]["execution_id"] == 1
    assert not [line for line in log if "changed" in line]


def test_an_upstream_stage_with_changed_inputs_is_not_served_from_the_cache(tmp_path):
    captions, images = _coco_inputs(tmp_path)
    coco = ["data.source=coco", f"data.captions_json={captions}", f"data.images_dir={images}"]
    _run(tmp_path / "root", coco)
    _edit(captions, "{}")
    with pytest.raises(StageError, match=r"A has no outputs for the current config "
                                         r"\(data.captions_json changed since execution 1 "):
        _run(tmp_path / "root", coco, ["B"])


def _png():
    buf = io.BytesIO()
    Image.new("RGB", (12, 10), (200, 10, 10)).save(buf, format="PNG")
    return buf.getvalue()


def test_the_real_example_gen_reruns_when_captions_json_is_edited(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    for i in range(4):
        (images / f"{i}.png").write_bytes(_png())
    captions = tmp_path / "captions.json"
    data = {"images": [{"id": i, "file_name": f"{i}.png"} for i in range(4)],
            "annotations": [{"image_id": i, "caption": f"picture {i}"} for i in range(4)]}
    captions.write_text(json.dumps(data))
    config = _config(["data.source=coco", f"data.captions_json={captions}",
                      f"data.images_dir={images}"])

    def run():
        log = []
        summary = Runner(config, str(tmp_path / "root"), log=log.append).run(["ExampleGen"])
        return summary["stages"]["ExampleGen"], log

    first, _ = run()
    assert first["status"] == "ran" and first["counts"]["accepted"] == 4
    assert run()[0]["status"] == "cached"
    data["annotations"] = data["annotations"][:3]  # one image loses its caption
    captions.write_text(json.dumps(data))
    again, log = run()
    assert again["status"] == "ran" and again["counts"]["accepted"] == 3
    assert any(line.startswith("[ExampleGen] data.captions_json changed since execution 1 (size ")
               for line in log)
