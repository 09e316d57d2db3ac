"""Pusher: atomic versions, retention, TF Serving configs, nothing pushed when not blessed."""
import os
import threading
import time

import pytest
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from components import pusher
from components.contract import schema
from components.contract.artifacts import Artifact
from pipeline.config import PipelineConfig
from pipeline.runner import StageContext


def _slow_build(path):
    """Writes a fake SavedModel in several steps, like a real export."""
    os.makedirs(os.path.join(path, "variables"))
    for i in range(5):
        with open(os.path.join(path, "variables", f"part{i}"), "w") as f:
            f.write("x" * 1000)
        time.sleep(0.02)
    with open(os.path.join(path, "saved_model.pb"), "w") as f:
        f.write("pb")


def test_a_polling_reader_never_sees_a_partial_version(tmp_path):
    model_dir = str(tmp_path / "captioner")
    seen_partial, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            for v in pusher.existing_versions(model_dir):
                vdir = os.path.join(model_dir, str(v))
                try:
                    complete = (os.path.exists(os.path.join(vdir, "saved_model.pb")) and
                                len(os.listdir(os.path.join(vdir, "variables"))) == 5)
                except FileNotFoundError:  # removed by retention between the two calls
                    continue
                if not complete and os.path.exists(vdir):
                    seen_partial.append(v)

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        versions = [pusher.publish_version(model_dir, _slow_build, keep_versions=2)[0]
                    for _ in range(4)]
    finally:
        stop.set()
        reader.join()
    assert versions == [1, 2, 3, 4]
    assert seen_partial == []
    assert pusher.existing_versions(model_dir) == [3, 4]
    assert not [e for e in os.listdir(model_dir) if e.startswith(".")]


def test_leftovers_of_a_killed_push_are_cleaned(tmp_path):
    import subprocess
    import sys
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    model_dir = tmp_path / "captioner"
    (model_dir / f".tmp-1-{dead.pid}" / "variables").mkdir(parents=True)
    (model_dir / ".deleting-3").mkdir()
    version, path = pusher.publish_version(str(model_dir), _slow_build, keep_versions=3)
    assert version == 1 and os.listdir(model_dir) == ["1"]


def test_a_concurrent_push_in_progress_is_left_alone(tmp_path):
    import subprocess
    import sys
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        model_dir = tmp_path / "captioner"
        busy = model_dir / f".tmp-1-{other.pid}"
        (busy / "variables").mkdir(parents=True)
        version, _ = pusher.publish_version(str(model_dir), _slow_build, keep_versions=3)
        assert version == 1 and busy.is_dir()
    finally:
        other.kill()
        other.wait()


def test_models_config_and_batching_parameters_parse(tmp_path):
    text = pusher.models_config_text(str(tmp_path), ["captioner", "other"])
    config = text_format.Parse(text, model_server_config_pb2.ModelServerConfig())
    names = [c.name for c in config.model_config_list.config]
    assert names == ["captioner", "other"]
    assert config.model_config_list.config[0].base_path == str(tmp_path / "captioner")
    batching = pusher.batching_parameters_text(16, 1000)
    assert "max_batch_size { value: 16 }" in batching
    assert "batch_timeout_micros { value: 1000 }" in batching


def test_not_blessed_pushes_nothing(tmp_path, capsys):
    blessing = Artifact(type="Blessing", uri=str(tmp_path / "b"),
                        properties={"blessed": False, "reasons": ["Bleu_4 too low"]})
    ctx = StageContext(stage="Pusher", config=PipelineConfig(), inputs={"blessing": blessing},
                       outputs={"pushed_model": str(tmp_path / "out")}, work_dir=str(tmp_path),
                       root=str(tmp_path), execution_id=1)
    result = pusher.run(ctx)
    assert result["pushed_model"]["properties"]["pushed"] is False
    assert not os.path.exists(tmp_path / "serving")
    assert "NOT blessed" in capsys.readouterr().err


def _pusher_context(tmp_path, evaluated_digest=None, blessed=True):
    """A Pusher context over a fixture SavedModel in a ServingModel folder."""
    from components.contract import io_utils
    from tests.serving.fixtures import build_fixture_model, solid_image
    serving_uri = tmp_path / "serving_model"
    saved = build_fixture_model(str(serving_uri / schema.SAVED_MODEL_DIR),
                                warmup_images=[solid_image((200, 10, 10))])
    digest = io_utils.tree_digest(saved)
    inputs = {
        "serving_model": Artifact(type="ServingModel", uri=str(serving_uri),
                                  properties={"digest": digest, "model_uri": "m",
                                              "decoding": {"beam_size": 1}}),
        "evaluation": Artifact(type="Evaluation", uri=str(tmp_path / "evaluation"),
                               properties={"export_digest": evaluated_digest or digest}),
        "blessing": Artifact(type="Blessing", uri=str(tmp_path / "b"),
                             properties={"blessed": blessed})}
    ctx = StageContext(stage="Pusher", config=PipelineConfig(), inputs=inputs,
                       outputs={"pushed_model": str(tmp_path / "out")}, work_dir=str(tmp_path),
                       root=str(tmp_path), execution_id=1)
    return ctx, saved, digest


def test_the_pushed_version_is_a_byte_for_byte_copy_of_the_evaluated_export(tmp_path):
    from components.contract import io_utils
    ctx, saved, digest = _pusher_context(tmp_path)
    properties = pusher.run(ctx)["pushed_model"]["properties"]
    assert properties["pushed"] is True and properties["version"] == 1
    assert properties["digest"] == digest == io_utils.tree_digest(properties["path"])
    for dirpath, _, files in os.walk(saved):
        for name in files:
            rel = os.path.relpath(os.path.join(dirpath, name), saved)
            with open(os.path.join(saved, rel), "rb") as a, \
                    open(os.path.join(properties["path"], rel), "rb") as b:
                assert a.read() == b.read(), rel
    # The same bytes again are recognized as already pushed.
    assert pusher.run(ctx)["pushed_model"]["properties"]["version"] == 1
    assert pusher.existing_versions(os.path.dirname(properties["path"])) == [1]


def test_an_export_other_than_the_evaluated_one_is_refused(tmp_path):
    ctx, _, _ = _pusher_context(tmp_path, evaluated_digest="0" * 64)
    with pytest.raises(pusher.PushError, match="is not the one the Evaluation"):
        pusher.run(ctx)
    assert not os.path.exists(tmp_path / "serving" / "captioner")


def test_a_copy_that_differs_from_the_evaluated_bytes_is_not_published(tmp_path, monkeypatch):
    import shutil as shutil_lib
    ctx, _, _ = _pusher_context(tmp_path)
    real_copytree = shutil_lib.copytree

    def corrupting_copytree(src, dst, *args, **kwargs):
        real_copytree(src, dst, *args, **kwargs)
        with open(os.path.join(dst, "saved_model.pb"), "ab") as f:
            f.write(b"\0")
    monkeypatch.setattr(pusher.shutil, "copytree", corrupting_copytree)
    with pytest.raises(pusher.PushError, match="not the evaluated"):
        pusher.run(ctx)
    model_dir = tmp_path / "serving" / "captioner"
    assert os.listdir(model_dir) == []  # no version, no leftover
