"""Exporter: the SavedModel written once, infra-validated, recorded by digest."""
import json
import os

import pytest

from components import exporter
from components.contract import io_utils, schema
from components.contract.artifacts import Artifact
from pipeline.config import PipelineConfig
from pipeline.runner import StageContext


def _exporter_context(tmp_path, monkeypatch, build):
    """An Exporter context whose export writes what `build(path)` writes."""
    import keras

    from serving.signature import export as export_lib
    # The encoder: one 3x3 conv from 8x8x3 to 4 channels (2 * 6,912 multiply-adds).
    inputs = keras.Input((8, 8, 3))
    encoder = keras.Model(inputs, keras.layers.Conv2D(4, 3, padding="same")(inputs))
    monkeypatch.setattr(keras.saving, "load_model", lambda path: encoder if path.endswith(
        schema.ENCODER_FILE) else None)
    monkeypatch.setattr(schema, "read_vocabulary", lambda uri: ["<pad>"])
    monkeypatch.setattr(export_lib, "export_saved_model",
                        lambda path, *args, **kwargs: build(path))
    inputs = {name: Artifact(type=name, uri=str(tmp_path / name), fingerprint=f"fp-{name}",
                             properties={"image_size": 8, schema.GRID_SHAPE: [3, 3, 3]})
              for name in ("model", "encoder", "vocabulary")}
    out = tmp_path / "serving_model"
    out.mkdir()
    return StageContext(stage="Exporter", config=PipelineConfig(), inputs=inputs,
                        outputs={"serving_model": str(out)}, work_dir=str(tmp_path),
                        root=str(tmp_path), execution_id=1)


def test_the_export_records_its_digest_decoding_and_infra_validation(tmp_path, monkeypatch):
    import tensorflow as tf

    from tests.serving.fixtures import build_fixture_model, solid_image
    ctx = _exporter_context(tmp_path, monkeypatch, lambda path: build_fixture_model(
        path, warmup_images=[solid_image((200, 10, 10))]))
    properties = exporter.run(ctx)["serving_model"]["properties"]
    saved = os.path.join(ctx.outputs["serving_model"], schema.SAVED_MODEL_DIR)
    assert properties["digest"] == io_utils.tree_digest(saved)
    config = PipelineConfig().eval
    assert properties["decoding"] == {"beam_size": config.beam_size,
                                      "max_length": config.max_length,
                                      "length_normalization": config.length_normalization}
    report = properties["infra_validation"]
    assert report["ok"] and report["tensorflow_version"] == tf.__version__
    assert report["warmup_requests"] == 1 and "DecodeImage" in report["ops"]
    with open(os.path.join(saved, schema.EXPORT_RECORD)) as f:
        record = json.load(f)  # inside the digest: pushed with the SavedModel
    assert record["model"] == "fp-model" and record["infra_validation"] == report
    # What the server sizes its thread pools by (serving/server/thread_choice.py); the
    # conv's 13,824 FLOPs and its bias's 256 adds.
    assert record["encoder_gflops"] == pytest.approx(14_080 / 1e9, rel=1e-3)


def test_a_model_tf_serving_cannot_run_is_recorded_and_never_blessed(tmp_path, monkeypatch):
    from components.evaluator import stage as evaluator
    from tests.serving.test_infra_validator import _py_function_model
    ctx = _exporter_context(tmp_path, monkeypatch, _py_function_model)
    properties = exporter.run(ctx)["serving_model"]["properties"]
    assert properties["infra_validation"]["ok"] is False
    assert "EagerPyFunc" in properties["infra_validation"]["reason"]
    serving = Artifact(type="ServingModel", uri=ctx.outputs["serving_model"],
                       properties=properties)
    examples = Artifact(type="Examples", uri=str(tmp_path / "no-examples-needed"))
    outputs = {name: str(tmp_path / name) for name in ("evaluation", "blessing")}
    for path in outputs.values():
        os.makedirs(path)
    eval_ctx = StageContext(stage="Evaluator", config=PipelineConfig(),
                            inputs={"serving_model": serving, "examples": examples},
                            outputs=outputs, work_dir=str(tmp_path), root=str(tmp_path),
                            execution_id=2)
    blessing = evaluator.run(eval_ctx)["blessing"]["properties"]
    assert blessing["blessed"] is False
    assert "infra validation" in blessing["reasons"][0] and "EagerPyFunc" in blessing["reasons"][0]
    assert os.path.exists(os.path.join(outputs["blessing"], "NOT_BLESSED"))


def test_a_changed_export_is_not_evaluated(tmp_path, monkeypatch):
    from components.evaluator import stage as evaluator
    from tests.serving.fixtures import build_fixture_model
    ctx = _exporter_context(tmp_path, monkeypatch, build_fixture_model)
    properties = exporter.run(ctx)["serving_model"]["properties"]
    saved = os.path.join(ctx.outputs["serving_model"], schema.SAVED_MODEL_DIR)
    with open(os.path.join(saved, "saved_model.pb"), "ab") as f:
        f.write(b"\0")
    serving = Artifact(type="ServingModel", uri=ctx.outputs["serving_model"],
                       properties=properties)
    eval_ctx = StageContext(stage="Evaluator", config=PipelineConfig(),
                            inputs={"serving_model": serving,
                                    "examples": Artifact(type="Examples", uri=str(tmp_path))},
                            outputs={}, work_dir=str(tmp_path), root=str(tmp_path),
                            execution_id=2)
    with pytest.raises(RuntimeError, match="is not the SavedModel the Exporter wrote"):
        evaluator.run(eval_ctx)
