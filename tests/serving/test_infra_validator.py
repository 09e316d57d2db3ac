"""InfraValidator: the session-based load, op registry and warmup checks, in a child process."""
from __future__ import annotations

import os

import tensorflow as tf

from serving.server.infra_validator import check_ops, graph_ops, validate
from tests.serving.conftest import BLUE, RED
from tests.serving.fixtures import solid_image, write_warmup_requests


class _PyFunctionCaptioner(tf.Module):
    """Captions through a Python callback: loads with tf.saved_model.load, not in TF Serving."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
    def serve(self, image_bytes):
        caption = tf.py_function(lambda x: x, [image_bytes], Tout=tf.string)
        caption.set_shape([None])
        return {"caption": caption}


def _py_function_model(path: str) -> str:
    module = _PyFunctionCaptioner()
    tf.saved_model.save(module, path, signatures={
        "serving_default": module.serve.get_concrete_function()})
    write_warmup_requests(path, [[solid_image(RED)]])
    return path


class _UnbatchedCaptioner(tf.Module):
    """Returns one caption for the whole batch: TF Serving's batching could not split it."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
    def serve(self, image_bytes):
        return {"caption": tf.strings.reduce_join(image_bytes)}


def test_a_servable_model_passes_with_its_ops_and_tf_version(model_store):
    report = validate(model_store["image"])
    assert report["ok"], report
    assert report["reason"] == ""
    assert report["warmup_requests"] == 2
    assert report["tensorflow_version"] == tf.__version__
    assert report["checked_with"] == tf.__version__
    assert "DecodeImage" in report["ops"] and "StatefulPartitionedCall" in report["ops"]
    assert not {"PyFunc", "EagerPyFunc"} & set(report["ops"])
    assert report["signatures"] == ["caption_annotations", "serving_default"]


def test_a_model_with_py_function_is_refused(tmp_path):
    path = _py_function_model(str(tmp_path / "1"))
    # It works through Python's object restore, in this process...
    loaded = tf.saved_model.load(path)
    out = loaded.signatures["serving_default"](image_bytes=tf.constant([b"x"]))
    assert out["caption"].numpy().tolist() == [b"x"]
    # ...and is refused for TF Serving.
    report = validate(path)
    assert not report["ok"]
    assert "EagerPyFunc" in report["reason"] and "calls back into Python" in report["reason"]
    assert "EagerPyFunc" in report["ops"]


def test_unregistered_ops_are_named():
    assert check_ops(["MatMul", "Const"]) == []
    problems = check_ops(["MatMul", "MyCustomOp", "PyFunc"])
    assert len(problems) == 2
    assert "PyFunc" in problems[0] and "MyCustomOp" in problems[1]


def test_outputs_without_a_batch_dimension_are_refused(tmp_path):
    path = str(tmp_path / "1")
    module = _UnbatchedCaptioner()
    tf.saved_model.save(module, path, signatures={
        "serving_default": module.serve.get_concrete_function()})
    write_warmup_requests(path, [[solid_image(RED), solid_image(BLUE)]])
    report = validate(path)
    assert not report["ok"]
    assert "output 'caption'" in report["reason"] and "dimension 0" in report["reason"]


def test_a_broken_folder_is_refused_with_the_reason(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "saved_model.pb").write_bytes(b"not a protobuf")
    report = validate(str(tmp_path / "1"))
    assert not report["ok"] and "saved_model.pb" in report["reason"]


def test_graph_ops_include_the_function_library(model_store):
    from tensorflow.core.protobuf import saved_model_pb2
    with open(os.path.join(model_store["image"], "saved_model.pb"), "rb") as f:
        meta_graph = saved_model_pb2.SavedModel.FromString(f.read()).meta_graphs[0]
    top_level = {node.op for node in meta_graph.graph_def.node}
    ops = graph_ops(meta_graph)
    assert "DecodeImage" in ops and "DecodeImage" not in top_level
