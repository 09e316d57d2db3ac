"""Overload (issue #43): refuse at once what would be answered too late, drop what nobody awaits.

`benchmarks/serving_load.py` offered 1x-4x the server's capacity with 2 s
deadlines: nothing was refused; requests waited in unbounded queues (gRPC's
and REST's worker pools, a 100-batch batch queue) and were answered after
their client gave up; the REST port held a connection and a request for
each abandoned one, until the process ran out of file descriptors. These
tests pin each cause without timing the host: requests are held where they
wait (by gates, not sleeps), and the measured run times the estimates use
are set by the test.
"""
from __future__ import annotations

import http.client
import json
import socket
import struct
import threading
import time

import grpc
import numpy as np
import pytest
from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_service_pb2_grpc

from serving.client.caption_client import CaptionClient, CaptionError, ClientOptions
from serving.tensors import ndarray_to_tensor_proto
from serving.versions.batching_parameters import BatchingParameters
from tests.serving.conftest import RED
from tests.serving.fixtures import b64, solid_image

PREDICT = "/v1/models/captioner:predict"
BODY = json.dumps({"instances": [b64(solid_image(RED))]})


def wait_until(condition, what: str) -> None:
    """Waits for the server to reach a state (a synchronisation, not a time limit)."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.002)


class Gate:
    """Wraps a callable: each call counts, then (while closed) waits for `release`."""

    def __init__(self, fn):
        self.fn = fn
        self.calls = 0
        self.release = threading.Event()

    def __call__(self, *args, **kwargs):
        self.calls += 1
        assert self.release.wait(60)
        return self.fn(*args, **kwargs)


def in_thread(fn, *args) -> tuple[threading.Thread, list]:
    result: list = []

    def run():
        try:
            result.append(fn(*args))
        except Exception as e:  # the test looks at it
            result.append(e)
    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def grpc_caption(address: str):
    with CaptionClient(address, timeout=60, options=ClientOptions(max_attempts=1)) as client:
        return client.caption([solid_image(RED)], attention=False)[0]["caption"]


def rest_post(port: int, timeout: float = 60):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", PREDICT, BODY, {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_grpc_requests_beyond_the_worker_threads_are_refused_at_once(make_base, start_server):
    # Before: an RPC beyond --max-threads waited in the pool's unbounded queue
    # and, under overload, started after its deadline.
    server = start_server(make_base({1: "image"}), max_threads=2)
    gate = Gate(server.predictor.predict)
    server.predictor.predict = gate  # the servicer calls it per request
    held = [in_thread(grpc_caption, server.grpc_address) for _ in range(2)]
    wait_until(lambda: gate.calls == 2, "both worker threads busy")
    with CaptionClient(server.grpc_address, timeout=60,
                       options=ClientOptions(max_attempts=1)) as client:
        with pytest.raises(CaptionError) as info:
            client.caption([solid_image(RED)], attention=False)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert gate.calls == 2  # refused without taking a thread
    gate.release.set()
    for thread, result in held:
        thread.join()
        assert isinstance(result[0], str)


def test_a_rest_request_that_would_wait_past_its_timeout_is_refused_at_once(
        make_base, start_server):
    server = start_server(make_base({1: "image"}), rest_threads=1, rest_timeout_ms=5000)
    app = server._rest.app
    app.fast_path = False  # the held request must hold a pool thread, not the event loop
    gate = Gate(server.predictor.run)
    server.predictor.run = gate
    held, result = in_thread(rest_post, server.rest_port)
    wait_until(lambda: gate.calls == 1, "the only REST thread busy")
    app.job_times.observe(10.0)  # a request holds a thread 10 s (as if measured)
    status, answer = rest_post(server.rest_port)  # would start in 10 s, end in 20 s
    assert status == 429 and "server busy" in answer["error"]
    assert "--rest-timeout-ms" in answer["error"]
    assert gate.calls == 1 and app.refused["busy"] == 1
    gate.release.set()
    held.join()
    assert result[0][0] == 200


def test_a_rest_request_still_waiting_at_its_timeout_is_answered_504_unrun(
        make_base, start_server):
    server = start_server(make_base({1: "image"}), rest_threads=1, rest_timeout_ms=0)
    app = server._rest.app
    app.fast_path = False  # the held request must hold a pool thread, not the event loop
    gate = Gate(server.predictor.run)
    server.predictor.run = gate
    held, first = in_thread(rest_post, server.rest_port)
    wait_until(lambda: gate.calls == 1, "the only REST thread busy")
    app.timeout = 0.001  # the next request's timeout: 1 ms after its arrival
    late, second = in_thread(rest_post, server.rest_port)
    wait_until(lambda: app.pool_jobs == 2, "the second request waiting for the thread")
    time.sleep(0.01)  # only lets its 1 ms pass: it cannot start before the release
    gate.release.set()
    held.join()
    late.join()
    assert first[0][0] == 200
    status, answer = second[0]
    assert status == 504 and "--rest-timeout-ms" in answer["error"]
    assert gate.calls == 1  # the late request never reached the model


def _batched_server(make_base, start_server):
    """A server batching one row at a time on one thread, its run held by a gate."""
    server = start_server(make_base({1: "image"}), batching=BatchingParameters(
        max_batch_size=1, batch_timeout_micros=0, num_batch_threads=1))
    servable = server.manager.get("captioner")
    gate = Gate(servable.call)
    servable.call = gate  # what the batch thread runs
    return server, servable, gate


def test_a_batched_rest_request_holds_no_thread_while_it_waits(make_base, start_server):
    # Before: each REST request waiting for its batch held one of the
    # --rest_api_num_threads threads (8 here), so from 1x capacity REST
    # requests queued for a thread, and answered after their timeout.
    server = start_server(make_base({1: "image"}), rest_threads=1, batching=BatchingParameters(
        max_batch_size=1, batch_timeout_micros=0, num_batch_threads=1))
    servable = server.manager.get("captioner")
    gate = Gate(servable.call)
    servable.call = gate
    app = server._rest.app
    app.fast_path = False
    held, result = in_thread(rest_post, server.rest_port)
    wait_until(lambda: gate.calls == 1, "the request's batch running")
    connection = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=60)
    try:  # the only REST thread is free: another request is answered meanwhile
        connection.request("GET", "/v1/models/captioner")
        assert connection.getresponse().status == 200
    finally:
        connection.close()
    assert app.pool_jobs == 0  # the held request holds no thread
    gate.release.set()
    held.join()
    status, answer = result[0]
    assert status == 200 and answer["predictions"][0]["caption"].endswith("image")


def test_a_queued_request_whose_rest_connection_is_lost_is_dropped_unrun(
        make_base, start_server):
    server, servable, gate = _batched_server(make_base, start_server)
    held, result = in_thread(grpc_caption, server.grpc_address)
    wait_until(lambda: gate.calls == 1, "the batch thread busy")
    batcher = servable._batchers["serving_default"]
    sock = socket.create_connection(("127.0.0.1", server.rest_port), timeout=60)
    sock.sendall(f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(BODY)}\r\n\r\n{BODY}".encode())
    wait_until(lambda: batcher.queued_rows == 1, "the REST request queued for a batch")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # a reset: the connection is lost (a FIN alone may be a half-close)
    wait_until(lambda: not batcher._tasks[0].is_active(), "the server saw the reset")
    gate.release.set()
    held.join()
    assert isinstance(result[0], str)
    wait_until(lambda: batcher.queued_rows == 0, "the queue emptied")
    assert batcher.refused["cancelled"] == 1
    assert gate.calls == 1  # the abandoned request never ran


def test_a_queued_request_whose_rpc_is_cancelled_is_dropped_unrun(make_base, start_server):
    server, servable, gate = _batched_server(make_base, start_server)
    held, result = in_thread(grpc_caption, server.grpc_address)
    wait_until(lambda: gate.calls == 1, "the batch thread busy")
    batcher = servable._batchers["serving_default"]
    request = predict_pb2.PredictRequest(model_spec=model_pb2.ModelSpec(name="captioner"))
    request.inputs["image_bytes"].CopyFrom(ndarray_to_tensor_proto(
        np.array([solid_image(RED)], dtype=object)))
    with grpc.insecure_channel(server.grpc_address) as channel:
        call = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict.future(
            request, timeout=60)
        wait_until(lambda: batcher.queued_rows == 1, "the RPC queued for a batch")
        call.cancel()
        wait_until(lambda: not batcher._tasks[0].is_active(), "the server saw the cancel")
    gate.release.set()
    held.join()
    assert isinstance(result[0], str)
    wait_until(lambda: batcher.queued_rows == 0, "the queue emptied")
    assert batcher.refused["cancelled"] == 1
    assert gate.calls == 1


def test_rest_connections_beyond_the_limit_get_503_and_are_closed(make_base, start_server):
    server = start_server(make_base({1: "image"}), rest_max_connections=1)
    first = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=60)
    second = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=60)
    try:
        first.request("GET", "/v1/models/captioner")
        assert first.getresponse().read() and True  # open, kept alive
        second.request("GET", "/v1/models/captioner")
        response = second.getresponse()
        answer = json.loads(response.read())
        assert response.status == 503 and "--rest-max-connections" in answer["error"]
        assert response.getheader("connection") == "close"
        first.request("GET", "/v1/models/captioner")  # the open one still serves
        assert first.getresponse().status == 200
    finally:
        first.close()
        second.close()
    assert server._rest.app.refused["connections"] == 1


def test_the_default_connection_limit_is_half_the_open_file_limit():
    import resource

    from serving.server.rest_server import default_max_connections
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert default_max_connections() == (0 if soft == resource.RLIM_INFINITY else soft // 2)


def test_a_full_batch_queue_refuses_before_the_request_is_parsed(make_base, start_server,
                                                                  monkeypatch):
    # Refusing must cost less than queueing: at 4x capacity the server spent
    # its CPU parsing requests (JSON, tensors, image headers) only to refuse
    # them, and the requests it admitted timed out.
    from serving.server import rest
    server = start_server(make_base({1: "image"}), batching=BatchingParameters(
        max_batch_size=1, batch_timeout_micros=0, num_batch_threads=1, max_enqueued_batches=1))
    servable = server.manager.get("captioner")
    gate = Gate(servable.call)
    servable.call = gate
    held = [in_thread(grpc_caption, server.grpc_address)]
    wait_until(lambda: gate.calls == 1, "the batch thread busy")
    held.append(in_thread(grpc_caption, server.grpc_address))
    batcher = servable._batchers["serving_default"]
    wait_until(lambda: batcher.queued_rows == 1, "the queue full (one batch of one row)")
    parsed = []
    monkeypatch.setattr(rest.rest_json, "parse_json", lambda body: parsed.append(body))
    parse_inputs = server.predictor.parse_inputs
    monkeypatch.setattr(server.predictor, "parse_inputs",
                        lambda *a, **k: parsed.append(a) or parse_inputs(*a, **k))
    status, answer = rest_post(server.rest_port)
    assert status == 503 and "is full" in answer["error"]
    with pytest.raises(CaptionError) as info:
        grpc_caption(server.grpc_address)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert parsed == []  # neither request was parsed
    monkeypatch.undo()
    gate.release.set()
    for thread, result in held:
        thread.join()
        assert isinstance(result[0], str)


@pytest.mark.parametrize("body,signature", [
    (b'{"instances": [1]}', ""),
    (b'{"signature_name": "serving_default", "instances": [1]}', "serving_default"),
    (b'{"instances": [1], "signature_name" : "caption_annotations"}', "caption_annotations"),
    (b'{"signature_name": "a", "inputs": {"signature_name": "b"}}', None),  # which one?
    (b'{"signature\\u005fname": "a", "instances": [1]}', None),  # escaped: not certain
    (b'{"signature_name": 7}', None),
])
def test_the_signature_a_body_names_is_read_without_parsing_it(body, signature):
    from serving.server.rest import signature_hint
    assert signature_hint(body) == signature
