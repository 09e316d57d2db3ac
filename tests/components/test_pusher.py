"""Pusher: atomic versions, retention, TF Serving configs, nothing pushed when not blessed."""
import os
import threading
import time

import pytest
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from components import pusher, schema
from components.artifacts import Artifact
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


def test_the_export_decodes_as_the_evaluation_measured(tmp_path):
    measured = {"beam_size": 4, "max_length": 17, "length_normalization": 0.7}
    evaluation = Artifact(type="Evaluation", uri=str(tmp_path),
                          properties={"metrics": {}, "decoding": measured})
    assert pusher.blessed_decoding(evaluation) == measured
    older = Artifact(type="Evaluation", uri=str(tmp_path), properties={"metrics": {}})
    with pytest.raises(RuntimeError, match="decoding settings"):
        pusher.blessed_decoding(older)


def _fake_pusher_inputs(tmp_path, monkeypatch, export):
    """A Pusher context whose export writes what `export(path)` writes."""
    import keras
    from serving import export as export_lib
    monkeypatch.setattr(keras.saving, "load_model", lambda path: None)
    monkeypatch.setattr(schema, "read_vocabulary", lambda uri: ["<pad>"])
    monkeypatch.setattr(schema, "model_file", lambda uri: uri)
    monkeypatch.setattr(export_lib, "export_saved_model",
                        lambda path, *args, **kwargs: export(path))
    inputs = {name: Artifact(type=name, uri=str(tmp_path / name), fingerprint=f"fp-{name}")
              for name in ("model", "encoder", "vocabulary")}
    inputs["evaluation"] = Artifact(
        type="Evaluation", uri=str(tmp_path / "evaluation"), fingerprint="fp-evaluation",
        properties={"metrics": {}, "decoding": {"beam_size": 1, "max_length": 5,
                                                "length_normalization": 0.0}})
    inputs["blessing"] = Artifact(type="Blessing", uri=str(tmp_path / "b"),
                                  properties={"blessed": True})
    return StageContext(stage="Pusher", config=PipelineConfig(), inputs=inputs,
                        outputs={"pushed_model": str(tmp_path / "out")},
                        work_dir=str(tmp_path), root=str(tmp_path), execution_id=1)


def test_a_model_tf_serving_cannot_run_is_not_pushed(tmp_path, monkeypatch, capsys):
    from tests.serving.test_infra_validator import _py_function_model
    ctx = _fake_pusher_inputs(tmp_path, monkeypatch, _py_function_model)
    result = pusher.run(ctx)
    properties = result["pushed_model"]["properties"]
    assert properties["pushed"] is False
    assert "infra validation" in properties["reasons"][0]
    assert "EagerPyFunc" in properties["reasons"][0]
    model_dir = tmp_path / "serving" / "captioner"
    assert os.listdir(model_dir) == []  # no version, no leftover
    assert "NOT pushed" in capsys.readouterr().err


def test_a_pushed_version_records_its_ops_and_tensorflow_version(tmp_path, monkeypatch):
    import tensorflow as tf
    from tests.serving.fixtures import build_fixture_model, solid_image
    ctx = _fake_pusher_inputs(tmp_path, monkeypatch, lambda path: build_fixture_model(
        path, warmup_images=[solid_image((200, 10, 10))]))
    properties = pusher.run(ctx)["pushed_model"]["properties"]
    assert properties["pushed"] is True and properties["version"] == 1
    record = pusher.pushed_from(properties["path"])
    report = record["infra_validation"]
    assert report["ok"] and report["tensorflow_version"] == tf.__version__
    assert report["warmup_requests"] == 1 and "DecodeImage" in report["ops"]
    # The same model again is recognized as already pushed.
    assert pusher.run(ctx)["pushed_model"]["properties"]["version"] == 1
