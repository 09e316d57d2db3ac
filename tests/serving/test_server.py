"""The server's gRPC and REST APIs: captions, metadata, status, and every fault's code."""
from __future__ import annotations

import struct
import time
import zlib

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving.client.caption_client import CaptionClient, CaptionError, ClientOptions
from serving.server.model_server import ModelServer
from serving.server.options import ServerOptions
from serving.tensors import ndarray_to_tensor_proto
from tests.serving.conftest import BLUE, GREEN, RED
from tests.serving.fixtures import b64, expected_caption, publish_version, rest_call, solid_image

MAX_REQUEST_BYTES = 1 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_store):
    base = tmp_path_factory.mktemp("server") / "captioner"
    base.mkdir()
    publish_version(model_store["image"], str(base), 1)
    server = ModelServer(str(base), options=ServerOptions(port=0, rest_port=0, poll_seconds=0.2, max_request_bytes=MAX_REQUEST_BYTES, max_image_pixels=1_000_000)).start()
    yield server
    server.stop(grace=1)


@pytest.fixture(scope="module")
def client(server):
    with CaptionClient(server.grpc_address, options=ClientOptions(max_attempts=1)) as client:
        yield client


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(server.grpc_address)
    yield prediction_service_pb2_grpc.PredictionServiceStub(channel)
    channel.close()


def png_header(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims width x height (a decompression bomb's header)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk + b"\x00" * 64


def predict_request(images=None, signature="", name="captioner", **spec) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest(model_spec=model_pb2.ModelSpec(
        name=name, signature_name=signature, **spec))
    if images is not None:
        request.inputs["image_bytes"].CopyFrom(ndarray_to_tensor_proto(
            np.array(images, dtype=object)))
    return request


def rest(server, path, body=None, raw=None):
    """(HTTP status, JSON body) of a REST call."""
    return rest_call(server.rest_url, path, body, raw)


# -- gRPC: the happy path -----------------------------------------------------


def test_caption_through_client(client):
    images = [solid_image(RED), solid_image(BLUE, fmt="JPEG"), solid_image(GREEN, fmt="GIF"),
              solid_image((250, 240, 10), fmt="BMP"), solid_image(GREEN, fmt="WEBP")]
    results = client.caption(images)
    assert [r["caption"] for r in results] == [
        expected_caption(RED), expected_caption(BLUE), expected_caption(GREEN),
        expected_caption((250, 240, 10)), expected_caption(GREEN)]
    for r in results:
        assert r["version"] == 1
        assert r["length"] == 5 and r["tokens"].shape == (5,) and r["tokens"][-1] == 2
        assert r["attention"].shape == (5, 3, 3)
        np.testing.assert_allclose(r["attention"].sum(axis=(1, 2)), 1.0, rtol=1e-5)
        assert isinstance(r["score"], float) and r["score"] < 0


def test_caption_without_attention_filters_outputs(client):
    (result,) = client.caption([solid_image(RED)], attention=False)
    assert result["caption"] == expected_caption(RED) and result["attention"] is None


def test_second_signature_takes_annotations(client):
    annotations = np.zeros((2, 9, 3), np.float32)
    annotations[0, :, 0] = 200.0   # red
    annotations[1, :, 2] = 250.0   # blue
    results = client.caption_annotations(annotations)
    assert [r["caption"] for r in results] == ["a dark red image", "a dark blue image"]


def test_output_filter_and_response_model_spec(stub):
    request = predict_request([solid_image(RED)])
    request.output_filter.extend(["caption", "score"])
    response = stub.Predict(request, timeout=30)
    assert set(response.outputs) == {"caption", "score"}
    assert response.model_spec.name == "captioner"
    assert response.model_spec.version.value == 1
    assert response.model_spec.signature_name == "serving_default"


def test_version_pinned_request(stub):
    response = stub.Predict(predict_request([solid_image(RED)], version={"value": 1}), timeout=30)
    assert response.model_spec.version.value == 1


def test_metadata_like_tf_serving(client, stub):
    meta = client.metadata()
    assert meta["name"] == "captioner" and meta["version"] == 1
    default = meta["signatures"]["serving_default"]
    assert default["inputs"] == {"image_bytes": {"dtype": "DT_STRING", "shape": [-1]}}
    assert set(default["outputs"]) == {"caption", "tokens", "lengths", "score", "attention"}
    assert default["outputs"]["attention"] == {"dtype": "DT_FLOAT", "shape": [-1, 6, 3, 3]}
    assert meta["signatures"]["caption_annotations"]["inputs"]["annotations"]["shape"] == [-1, -1, 3]
    # The raw response packs a SignatureDefMap under "signature_def".
    raw = stub.GetModelMetadata(get_model_metadata_pb2.GetModelMetadataRequest(
        model_spec=model_pb2.ModelSpec(name="captioner"), metadata_field=["signature_def"]))
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    assert raw.metadata["signature_def"].Unpack(signature_map)
    assert signature_map.signature_def["serving_default"].method_name == "tensorflow/serving/predict"


def test_model_status(server, client):
    assert client.status() == [{"version": 1, "state": "AVAILABLE", "error_code": 0,
                                "error_message": ""}]
    channel = grpc.insecure_channel(server.grpc_address)
    models = model_service_pb2_grpc.ModelServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        models.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(
            model_spec=model_pb2.ModelSpec(name="nope")))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as info:
        models.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(
            model_spec=model_pb2.ModelSpec(name="captioner", version={"value": 7})))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    channel.close()


def test_health_and_reflection(server):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )
    channel = grpc.insecure_channel(server.grpc_address)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "tensorflow.serving.PredictionService"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
    assert {"tensorflow.serving.PredictionService", "tensorflow.serving.ModelService",
            "grpc.health.v1.Health"} <= services
    channel.close()


# -- gRPC: faults -------------------------------------------------------------


def _bad_tensor_content():
    request = predict_request(signature="caption_annotations")
    proto = ndarray_to_tensor_proto(np.zeros((1, 9, 3), np.float32))
    proto.tensor_content = proto.tensor_content[:-4]
    request.inputs["annotations"].CopyFrom(proto)
    return request


def _extra_input():
    request = predict_request([solid_image(RED)])
    request.inputs["extra"].CopyFrom(ndarray_to_tensor_proto(np.zeros(1, np.float32)))
    return request


def _wrong_dtype():
    request = predict_request()
    request.inputs["image_bytes"].CopyFrom(ndarray_to_tensor_proto(np.zeros(1, np.float32)))
    return request


def _wrong_shape():
    request = predict_request()
    request.inputs["image_bytes"].CopyFrom(ndarray_to_tensor_proto(
        np.array([[solid_image(RED)]], dtype=object)))
    return request


def _with_filter(*names):
    request = predict_request([solid_image(RED)])
    request.output_filter.extend(names)
    return request


FAULTS = {
    "unknown model": (lambda: predict_request([solid_image(RED)], name="nope"),
                      grpc.StatusCode.NOT_FOUND, "Servable not found"),
    "unknown version": (lambda: predict_request([solid_image(RED)], version={"value": 9}),
                        grpc.StatusCode.NOT_FOUND, "Specific(captioner, 9)"),
    "unknown label": (lambda: predict_request([solid_image(RED)], version_label="canary"),
                      grpc.StatusCode.INVALID_ARGUMENT, "version label"),
    "unknown signature": (lambda: predict_request([solid_image(RED)], signature="nope"),
                          grpc.StatusCode.FAILED_PRECONDITION, 'signature key "nope"'),
    "empty batch": (lambda: predict_request([]), grpc.StatusCode.INVALID_ARGUMENT,
                    "empty batch: input 'image_bytes' has 0 rows"),
    "missing input": (lambda: predict_request(), grpc.StatusCode.INVALID_ARGUMENT,
                      "Missing but required: {image_bytes}"),
    "extra input": (_extra_input, grpc.StatusCode.INVALID_ARGUMENT, "Sent extra: {extra}"),
    "wrong dtype": (_wrong_dtype, grpc.StatusCode.INVALID_ARGUMENT,
                    "Expects arg[0] to be string but float is provided"),
    "unparsable tensor": (_bad_tensor_content, grpc.StatusCode.INVALID_ARGUMENT,
                          "tensor parsing error: annotations"),
    "wrong shape": (_wrong_shape, grpc.StatusCode.INVALID_ARGUMENT, "not compatible"),
    "undecodable image": (lambda: predict_request([b"not an image at all"]),
                          grpc.StatusCode.INVALID_ARGUMENT, "Unknown image file format"),
    "truncated png": (lambda: predict_request([solid_image(RED)[:40]]),
                      grpc.StatusCode.INVALID_ARGUMENT, ""),
    "pixel bomb": (lambda: predict_request([png_header(100_000, 100_000)]),
                   grpc.StatusCode.INVALID_ARGUMENT, "exceeds the limit of 1000000 pixels"),
    "bad output filter": (lambda: _with_filter("logits"), grpc.StatusCode.INVALID_ARGUMENT,
                          "output tensor alias not found in signature: logits"),
    "duplicate output filter": (lambda: _with_filter("caption", "caption"),
                                grpc.StatusCode.INVALID_ARGUMENT, "duplicate output tensor alias"),
    "message too large": (lambda: predict_request([b"\xff\xd8\xff" + b"0" * MAX_REQUEST_BYTES]),
                          grpc.StatusCode.RESOURCE_EXHAUSTED, ""),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_gives_tf_serving_code_and_server_survives(stub, fault):
    make, code, text = FAULTS[fault]
    request = make()
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request, timeout=30)
    refused_in = time.monotonic() - started
    assert info.value.code() == code, info.value.details()
    assert text in info.value.details()
    response = stub.Predict(predict_request([solid_image(RED)]), timeout=30)
    assert response.outputs["caption"].string_val == [expected_caption(RED).encode()]
    if fault == "pixel bomb":
        # Refused from the header: faster than 100 decodes of an image at the pixel
        # limit, which has 10^4 times fewer pixels than the bomb claims.
        started = time.monotonic()
        stub.Predict(predict_request([solid_image(RED, size=1000)]), timeout=30)
        at_the_limit = time.monotonic() - started
        assert refused_in < 100 * at_the_limit, (refused_in, at_the_limit)


def test_unimplemented_methods(stub):
    with pytest.raises(grpc.RpcError) as info:
        stub.Classify(classification_pb2.ClassificationRequest(), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_metadata_faults(stub):
    with pytest.raises(grpc.RpcError) as info:
        stub.GetModelMetadata(get_model_metadata_pb2.GetModelMetadataRequest(
            model_spec=model_pb2.ModelSpec(name="captioner")))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as info:
        stub.GetModelMetadata(get_model_metadata_pb2.GetModelMetadataRequest(
            model_spec=model_pb2.ModelSpec(name="nope"), metadata_field=["signature_def"]))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_client_error_is_clear(client):
    with pytest.raises(CaptionError) as info:
        client.caption([b"garbage"])
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "INVALID_ARGUMENT" in str(info.value) and "Unknown image file format" in str(info.value)


# -- REST -----------------------------------------------------------------------


def test_rest_predict_row_format(server):
    status, body = rest(server, "/v1/models/captioner:predict",
                        {"instances": [b64(solid_image(RED)), b64(solid_image(BLUE, fmt="JPEG"))]})
    assert status == 200
    predictions = body["predictions"]
    assert [p["caption"] for p in predictions] == [expected_caption(RED), expected_caption(BLUE)]
    assert np.asarray(predictions[0]["attention"]).shape == (6, 3, 3)
    assert predictions[0]["tokens"][:5] == [4, 5, 7, 10, 2]


def test_rest_predict_columnar_and_named_instances(server):
    status, body = rest(server, "/v1/models/captioner/versions/1:predict",
                        {"signature_name": "serving_default",
                         "inputs": {"image_bytes": [b64(solid_image(GREEN))]}})
    assert status == 200 and body["outputs"]["caption"] == [expected_caption(GREEN)]
    status, body = rest(server, "/v1/models/captioner:predict",
                        {"instances": [{"image_bytes": b64(solid_image(RED))}]})
    assert status == 200 and body["predictions"][0]["caption"] == expected_caption(RED)
    annotations = np.zeros((1, 9, 3), np.float32)
    annotations[0, :, 1] = 250.0
    status, body = rest(server, "/v1/models/captioner:predict",
                        {"signature_name": "caption_annotations",
                         "inputs": annotations.tolist()})
    assert status == 200 and body["outputs"]["caption"] == ["a dark green image"]


def test_rest_status_and_metadata(server):
    status, body = rest(server, "/v1/models/captioner")
    assert status == 200
    assert body == {"model_version_status": [{"version": "1", "state": "AVAILABLE", "status": {
        "error_code": "OK", "error_message": ""}}]}
    status, body = rest(server, "/v1/models/captioner/versions/1/metadata")
    assert status == 200
    assert body["model_spec"]["name"] == "captioner" and body["model_spec"]["version"] == "1"
    inputs = body["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]
    assert inputs["image_bytes"]["dtype"] == "DT_STRING"


@pytest.mark.parametrize("path, body, raw, code, text", [
    ("/v1/models/nope:predict", {"instances": ["x"]}, None, 404, "Servable not found"),
    ("/v1/models/nope", None, None, 404, "Could not find any versions"),
    ("/v1/models/captioner/versions/5", None, None, 404, "Could not find version 5"),
    ("/v1/models/captioner:predict", None, b"{not json", 400, "JSON Parse error"),
    ("/v1/models/captioner:predict", None, b"", 400, "document is empty"),
    ("/v1/models/captioner:predict", {"instances": [{"b64": "***"}]}, None, 400, "base64"),
    ("/v1/models/captioner:predict", {"instances": [b64(b"garbage")]}, None, 400,
     "Unknown image file format"),
    ("/v1/models/captioner:predict", {"instances": [b64(png_header(50_000, 50_000))]}, None,
     400, "exceeds the limit"),
    ("/v1/models/captioner:predict", {"instances": [1.5]}, None, 400, "not of expected type"),
    ("/v1/models/captioner:predict", {"instances": []}, None, 400, "No values"),
    ("/v1/models/captioner:predict", {"nothing": 1}, None, 400, "Missing 'inputs' or 'instances'"),
    ("/v1/models/captioner:predict", {"signature_name": "nope", "instances": ["x"]}, None, 400,
     "not found in signature def"),
    ("/v1/models/captioner:predict", {"instances": [{"image_bytes": "x", "other": 1}]}, None,
     400, "keys must be equal"),
    ("/v1/models/captioner:classify", {"examples": []}, None, 501, "not supported"),
    ("/v1/models/captioner:predict", None, b"x" * (MAX_REQUEST_BYTES + 1), 413, "exceeds"),
    ("/v1/models/captioner/bogus", {"instances": []}, None, 400, "Malformed request"),
    ("/v2/anything", None, None, 404, "Not found"),
])
def test_rest_faults(server, path, body, raw, code, text):
    status, payload = rest(server, path, body, raw)
    assert status == code, payload
    assert text in payload["error"]
    status, payload = rest(server, "/v1/models/captioner:predict",
                           {"instances": [b64(solid_image(RED))]})
    assert status == 200 and payload["predictions"][0]["caption"] == expected_caption(RED)


def test_rest_and_grpc_agree(server, client):
    image = solid_image((90, 200, 180), fmt="JPEG")
    (grpc_result,) = client.caption([image])
    _, body = rest(server, "/v1/models/captioner:predict", {"instances": [b64(image)]})
    (prediction,) = body["predictions"]
    assert prediction["caption"] == grpc_result["caption"]
    assert prediction["score"] == pytest.approx(grpc_result["score"])
    np.testing.assert_allclose(np.asarray(prediction["attention"])[:5], grpc_result["attention"],
                               rtol=1e-6)


def _raw_rest(server, path: str, body: bytes):
    """(status, raw body bytes) of a REST POST: the bytes as sent, not parsed."""
    import urllib.error
    import urllib.request
    request = urllib.request.Request(server.rest_url + path, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e40"])
def test_non_finite_annotations_are_refused_over_rest(server, value):
    row = ", ".join(["[1.0, 2.0, 3.0]"] * 8 + [f"[1.0, {value}, 3.0]"])
    body = ('{"signature_name": "caption_annotations", "inputs": [[' + row + ']]}').encode()
    status, raw = _raw_rest(server, "/v1/models/captioner:predict", body)
    assert status == 400, raw
    import json

    def no_constants(token):  # NaN / Infinity / -Infinity tokens: not JSON (RFC 8259)
        raise AssertionError(f"the body carries the token {token}")

    message = json.loads(raw, parse_constant=no_constants)["error"]
    assert "annotations" in message and ("non-finite" in message or "JSON" in message)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_annotations_are_refused_over_grpc(client, value):
    annotations = np.ones((1, 9, 3), np.float32)
    annotations[0, 8, 1] = value
    with pytest.raises(CaptionError) as info:
        client.caption_annotations(annotations)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "'annotations'" in info.value.details and "non-finite" in info.value.details


def test_a_value_beyond_float32_over_grpc_double_val_is_refused(stub):
    request = predict_request(signature="caption_annotations")
    if "image_bytes" in request.inputs:
        del request.inputs["image_bytes"]
    proto = request.inputs["annotations"]
    proto.dtype = 1  # DT_FLOAT, filled from float_val: 1e40 is inf in float32
    for n in (1, 9, 3):
        proto.tensor_shape.dim.add().size = n
    proto.float_val.extend([1.0] * 26 + [1e40])
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "non-finite" in info.value.details()


def test_non_finite_outputs_never_reach_a_json_body():
    from serving.errors import ServingError
    from serving.server import rest_json
    outputs = {"caption": np.array([b"a"], dtype=object), "score": np.array([np.nan], np.float32)}
    with pytest.raises(ServingError, match="score") as info:
        rest_json.encode_outputs(outputs, row_format=True)
    assert info.value.code == grpc.StatusCode.INTERNAL
    with pytest.raises(ValueError):
        rest_json.encode({"x": float("inf")})
