"""SIGTERM with a request in flight: the answer is still sent (REST and gRPC alike).

The model is the fixture captioner with a gate: while a `hold` file exists,
a request writes an `entered` file and then waits inside the model. So the
order is fixed by events, not by how fast the host runs: the request is
inside the model (`entered`) before the server gets SIGTERM, the server is
seen shutting down before the gate opens, and only then can the request
finish. It must get its full, correct answer, and the process must then
exit 0.

How far the shutdown has got is seen from outside, by what the server does
(`ModelServer.stop` marks health NOT_SERVING, stops gRPC, then REST):

- gRPC request: the REST port refuses connections, so gRPC's stop was
  called before it;
- REST request on the pool ("rest-pool", a body past the fast path's size):
  uvicorn logs that it waits for the open connections, so its graceful
  shutdown (after it closed the port and its 0.1 s pause) is under way;
- a lone small REST request runs on the event loop itself (the fast path,
  "rest-inline") and blocks it until it ends, so nothing of REST's can be
  seen: gRPC refusing calls shows that `ModelServer.stop` is running (REST's
  stop comes right after gRPC's, in the same call).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.request

import grpc
import pytest
import tensorflow as tf
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from serving.tensors import ndarray_to_tensor_proto, tensor_proto_to_ndarray
from tests.reliability.server_process import ServerProcess
from tests.serving.fixtures import (
    FixtureCaptioner,
    b64,
    expected_caption,
    publish_version,
    solid_image,
)

# Three server processes, one per API path: about 25 s on 2 idle cores, 40 s and more
# when they are loaded.
pytestmark = pytest.mark.slow

RED = (220, 30, 30)
# Past the REST fast path's body limit (INLINE_MAX_BODY of the REST server: 256 KiB):
# JSON whitespace, so the request runs on the pool.
POOL_PADDING = b" " * (512 * 1024)
WAIT_S = 60.0  # fail-safe for each awaited event; none is expected to take more than a second
# uvicorn's log line once its graceful shutdown waits for open connections (Server.shutdown).
UVICORN_WAITING = "Waiting for connections to close"


class GatedCaptioner(FixtureCaptioner):
    """The fixture captioner; while `<gate>/hold` exists a request writes `<gate>/entered`
    and waits in the model until `hold` is removed."""

    def __init__(self, gate: str):
        super().__init__(noun="image")
        # Variables, not constants: TensorFlow would fold a file test on a constant
        # path once, at the first run, and never look at the file again.
        self.hold = tf.Variable(os.path.join(gate, "hold"), trainable=False, name="hold")
        self.entered = tf.Variable(os.path.join(gate, "entered"), trainable=False,
                                   name="entered")

    def _caption(self, annotations):
        def held():
            return tf.size(tf.io.matching_files(self.hold.read_value())) > 0

        def wait():
            with tf.control_dependencies([tf.io.write_file(self.entered.read_value(), "")]):
                return tf.while_loop(lambda n: held(), lambda n: n + 1, (tf.constant(0),))[0]

        spins = tf.cond(held(), wait, lambda: tf.constant(0))
        with tf.control_dependencies([spins]):
            annotations = tf.identity(annotations)
        return super()._caption(annotations)


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """(model base path, gate folder)."""
    root = tmp_path_factory.mktemp("gated")
    gate = root / "gate"
    gate.mkdir()
    module = GatedCaptioner(str(gate))
    tf.saved_model.save(module, str(root / "model"), signatures={
        "serving_default": module.serve_images.get_concrete_function(),
        "caption_annotations": module.serve_annotations.get_concrete_function()})
    base = root / "captioner"
    base.mkdir()
    publish_version(str(root / "model"), str(base), 1)
    return str(base), str(gate)


def _start(base, tmp_path) -> ServerProcess:
    return ServerProcess(["--model-base-path", base, "--port", "0", "--rest-port", "0",
                          "--poll-seconds", "0", "--enable_model_warmup", "false"],
                         str(tmp_path / "server.log"))


def _rest_predict(server: ServerProcess, padding: bytes = b""):
    body = json.dumps({"instances": [b64(solid_image(RED))]}).encode() + padding
    request = urllib.request.Request(server.rest_url + "/v1/models/captioner:predict",
                                     data=body, method="POST")
    with urllib.request.urlopen(request, timeout=WAIT_S) as response:
        return response.status, json.loads(response.read())["predictions"][0]["caption"]


def _grpc_predict(server: ServerProcess):
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "captioner"
        ndarray_to_tensor_proto([solid_image(RED)], out=request.inputs["image_bytes"])
        response = stub.Predict(request, timeout=WAIT_S)
        return "OK", tensor_proto_to_ndarray(response.outputs["caption"])[0].decode()


CALLS = {"grpc": _grpc_predict, "rest-inline": _rest_predict,
         "rest-pool": lambda server: _rest_predict(server, POOL_PADDING)}


def _health(server: ServerProcess) -> str:
    """The server's overall health: "SERVING", "NOT_SERVING", or the gRPC error's code."""
    with grpc.insecure_channel(server.grpc_address) as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=2)
        except grpc.RpcError as e:
            return e.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)


def _rest_port_refuses(server: ServerProcess) -> bool:
    host, port = server.rest_url[len("http://"):].rsplit(":", 1)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
        return False
    except ConnectionRefusedError:
        return True


def _grpc_refuses(server: ServerProcess) -> bool:
    return _health(server) not in ("SERVING", "NOT_SERVING")


# api -> (the shutdown seen from outside, far enough for the request's API; what it is)
SHUTDOWN_SEEN = {
    "grpc": (_rest_port_refuses, "REST port closed"),
    "rest-inline": (_grpc_refuses, "gRPC refusing calls"),
    "rest-pool": (lambda server: UVICORN_WAITING in server.log(),
                  f"'{UVICORN_WAITING}' in the server log"),
}


def _wait_for(condition, what: str) -> None:
    """Polls `condition` until it holds; WAIT_S is a fail-safe, not a verdict on speed."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {WAIT_S:.0f} s"
        time.sleep(0.01)


@pytest.mark.parametrize("api", ["grpc", "rest-inline", "rest-pool"])
def test_sigterm_drains_the_request_in_flight(api, gated, tmp_path):
    base, gate = gated
    hold, entered = os.path.join(gate, "hold"), os.path.join(gate, "entered")
    for path in (hold, entered):
        if os.path.exists(path):
            os.remove(path)
    call = CALLS[api]
    server = _start(base, tmp_path)
    result = {}
    try:
        # Not held: answered at once (and traced); nothing entered the gate.
        assert call(server)[1] == expected_caption(RED)
        assert not os.path.exists(entered)
        assert _health(server) == "SERVING"

        open(hold, "w").close()

        def client():
            try:
                result["answer"] = call(server)
            except Exception as e:  # noqa: BLE001 (reported below)
                result["error"] = e

        thread = threading.Thread(target=client)
        thread.start()
        _wait_for(lambda: os.path.exists(entered), "request inside the model")
        server.proc.send_signal(signal.SIGTERM)
        seen, what = SHUTDOWN_SEEN[api]
        _wait_for(lambda: seen(server), what)
        # The server is shutting down and the request is still held in the model.
        assert thread.is_alive() and not result, result
        assert _grpc_refuses(server)
        if api != "rest-inline":  # (its event loop is blocked by the request)
            assert _rest_port_refuses(server)
        os.remove(hold)
        thread.join(WAIT_S)
        code = server.proc.wait(WAIT_S)
    finally:
        if os.path.exists(hold):
            os.remove(hold)
        server.stop()
    assert "error" not in result, f"{api}: no answer after SIGTERM: {result.get('error')!r}"
    status, caption = result["answer"]
    assert status in (200, "OK")
    assert caption == expected_caption(RED)
    assert code == 0, server.log()[-2000:]
