"""The client's TF Serving messages (`serving/protos.py`) against the installed packages."""
import numpy as np
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import get_model_status_pb2, predict_pb2

from serving import protos
from serving.tensors import dtype_name, ndarray_to_tensor_proto, tensor_proto_to_ndarray


def test_the_shipped_descriptors_equal_the_installed_tensorflow_serving_api():
    with open(protos.DESCRIPTOR_SET, "rb") as f:
        shipped = f.read()
    assert shipped == protos.descriptor_set().SerializeToString(deterministic=True), \
        "run python -m serving.protos --write after upgrading tensorflow-serving-api"


def test_a_request_crosses_to_tensorflow_serving_s_classes_byte_for_byte():
    request = protos.PredictRequest(output_filter=["caption"])
    request.model_spec.name = "captioner"
    request.model_spec.version.value = 7
    ndarray_to_tensor_proto(np.arange(6, dtype=np.float32).reshape(2, 3),
                            out=request.inputs["annotations"])
    theirs = predict_pb2.PredictRequest.FromString(request.SerializeToString())
    assert theirs.model_spec.version.value == 7 and list(theirs.output_filter) == ["caption"]
    assert theirs.SerializeToString(deterministic=True) == \
        request.SerializeToString(deterministic=True)
    np.testing.assert_array_equal(tensor_proto_to_ndarray(theirs.inputs["annotations"]),
                                  np.arange(6, dtype=np.float32).reshape(2, 3))


def test_dtype_and_state_names_match_tensorflow_s_enums():
    for value in types_pb2.DataType.values():
        assert dtype_name(value) == types_pb2.DataType.Name(value)
    assert dtype_name(12345) == "12345"
    states = get_model_status_pb2.ModelVersionStatus.State
    for value in states.values():
        assert protos.VERSION_STATE.values_by_number[value].name == states.Name(value)


def test_the_service_methods_are_the_generated_stubs_paths():
    from tensorflow_serving.apis import model_service_pb2, prediction_service_pb2
    ours = {(s, m) for s in ("tensorflow.serving.PredictionService",
                             "tensorflow.serving.ModelService")
            for m in protos.POOL.FindServiceByName(s).methods_by_name}
    theirs = {(d.full_name, m) for d in (
        prediction_service_pb2.DESCRIPTOR.services_by_name["PredictionService"],
        model_service_pb2.DESCRIPTOR.services_by_name["ModelService"])
        for m in d.methods_by_name}
    assert ours == theirs
    assert {"Predict", "GetModelMetadata"} <= set(protos.PredictionService.__dataclass_fields__)
