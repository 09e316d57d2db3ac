"""SIGTERM with a request in flight: the answer is still sent (REST and gRPC alike).

The server process gets SIGTERM a quarter of the way into one request (its
duration measured on a warm call first, so the test holds on a quiet host and
a loaded one) while nothing else runs; the request must get its full, correct
answer, and the process must then exit 0.
"""
from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request

import grpc
import pytest
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from serving.tensors import ndarray_to_tensor_proto, tensor_proto_to_ndarray
from tests.reliability.server_process import ServerProcess
from tests.serving.fixtures import (b64, build_fixture_model, expected_caption, publish_version,
                                    solid_image)

RED = (220, 30, 30)
# Decoder work per request: 0.3-2 s on 2 cores, depending on the load (FixtureCaptioner).
SLOW = dict(decoder_units=512, decoder_steps=4000)


@pytest.fixture(scope="module")
def slow_base(tmp_path_factory):
    root = tmp_path_factory.mktemp("slow")
    model = build_fixture_model(str(root / "model"), **SLOW)
    base = root / "captioner"
    base.mkdir()
    publish_version(model, str(base), 1)
    return str(base)


def _start(slow_base, tmp_path) -> ServerProcess:
    return ServerProcess(["--model-base-path", slow_base, "--port", "0", "--rest-port", "0",
                          "--poll-seconds", "0", "--enable_model_warmup", "false"],
                         str(tmp_path / "server.log"))


def _rest_predict(server: ServerProcess):
    body = json.dumps({"instances": [b64(solid_image(RED))]}).encode()
    request = urllib.request.Request(server.rest_url + "/v1/models/captioner:predict",
                                     data=body, method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, json.loads(response.read())["predictions"][0]["caption"]


def _grpc_predict(server: ServerProcess):
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "captioner"
        ndarray_to_tensor_proto([solid_image(RED)], out=request.inputs["image_bytes"])
        response = stub.Predict(request, timeout=60)
        return "OK", tensor_proto_to_ndarray(response.outputs["caption"])[0].decode()


@pytest.mark.parametrize("api", ["rest", "grpc"])
def test_sigterm_drains_the_request_in_flight(api, slow_base, tmp_path):
    server = _start(slow_base, tmp_path)
    try:
        call = _rest_predict if api == "rest" else _grpc_predict
        call(server)  # the first run traces
        started = time.monotonic()
        call(server)
        warm = time.monotonic() - started  # ~0.3 s on a quiet host, seconds under load
        result = {}

        def client():
            try:
                result["answer"] = call(server)
            except Exception as e:  # noqa: BLE001 (reported below)
                result["error"] = e
            result["done"] = time.monotonic()

        thread = threading.Thread(target=client)
        thread.start()
        time.sleep(warm / 4)  # the request is now running, well before it ends
        signalled = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        thread.join(60)
        code = server.proc.wait(60)
    finally:
        server.stop()
    assert "error" not in result, f"{api}: no answer after SIGTERM: {result.get('error')!r}"
    assert result["done"] > signalled, "the request finished before SIGTERM: make it slower"
    status, caption = result["answer"]
    assert status in (200, "OK")
    assert caption == expected_caption(RED)
    assert code == 0, server.log()[-2000:]
