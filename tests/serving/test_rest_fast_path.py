"""REST's fast path: a small predict request alone on the server runs on the event loop."""
from __future__ import annotations

import http.client
import json
import threading
from types import SimpleNamespace

import pytest

from serving.server.predictor import INLINE_MAX_WORK, Predictor, RequestLimits
from serving.versions.servable import Servable
from tests.serving.conftest import BLUE, RED
from tests.serving.fixtures import b64, expected_caption, rest_call, solid_image

PATH = "/v1/models/captioner:predict"
METRICS = "/monitoring/prometheus/metrics"


@pytest.fixture
def run_threads(monkeypatch):
    """Names of the threads that ran the model, in order."""
    names = []
    call = Servable.call

    def recording(self, signature, inputs):
        names.append(threading.current_thread().name)
        return call(self, signature, inputs)

    monkeypatch.setattr(Servable, "call", recording)
    return names


def ok_count(server) -> int:
    return server.metrics._counts.get(("captioner", "OK"), 0)


def test_small_request_alone_runs_on_the_event_loop(make_base, start_server, run_threads):
    server = start_server(make_base({1: "image"}), warmup=False, metrics_path=METRICS)
    app = server._rest.app
    for color in (RED, BLUE):
        status, body = rest_call(server.rest_url, PATH,
                                 {"instances": [b64(solid_image(color, fmt="JPEG"))]})
        assert status == 200
        assert body["predictions"][0]["caption"] == expected_caption(color)
    assert run_threads == ["rest-server", "rest-server"]
    assert app.inline_runs == 2 and app.in_flight == 0
    assert ok_count(server) == 2


def test_errors_on_the_fast_path_keep_their_status(make_base, start_server, run_threads):
    server = start_server(make_base({1: "image"}), warmup=False)
    status, body = rest_call(server.rest_url, PATH, {"instances": [b64(b"not an image")]})
    assert status == 400 and "error" in body
    status, body = rest_call(server.rest_url, "/v1/models/nope:predict",
                             {"instances": [b64(solid_image(RED))]})
    assert status == 404
    assert server._rest.app.in_flight == 0


def test_costly_request_runs_on_the_pool_and_counts_once(make_base, start_server, run_threads):
    # Light requests are those of at most 1/16 of max_decode_work: here none.
    server = start_server(make_base({1: "image"}), warmup=False, max_decode_work=1_000_000,
                          metrics_path=METRICS)
    status, body = rest_call(server.rest_url, PATH, {"instances": [b64(solid_image(RED))]})
    assert status == 200 and body["predictions"][0]["caption"] == expected_caption(RED)
    assert len(run_threads) == 1 and run_threads[0].startswith("rest_")
    assert server._rest.app.inline_runs == 0
    assert ok_count(server) == 1


def test_a_second_open_connection_turns_the_fast_path_off(make_base, start_server,
                                                          run_threads):
    server = start_server(make_base({1: "image"}), warmup=False)
    idle = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=30)
    idle.connect()
    busy = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=30)
    try:
        idle.request("GET", "/v1/models/captioner")  # the server has seen both connections
        assert idle.getresponse().read()
        body = json.dumps({"instances": [b64(solid_image(RED))]})
        busy.request("POST", PATH, body, {"Content-Type": "application/json"})
        response = busy.getresponse()
        assert response.status == 200
        assert json.loads(response.read())["predictions"][0]["caption"] == expected_caption(RED)
    finally:
        idle.close()
        busy.close()
    assert len(run_threads) == 1 and run_threads[0].startswith("rest_")
    assert server._rest.app.inline_runs == 0


def test_may_run_inline_only_unbatched_cheap_light_requests():
    predictor = Predictor(limits=RequestLimits(max_decode_work=2_000_000_000))
    plain = SimpleNamespace(batching=None)
    batched = SimpleNamespace(batching=object())
    assert predictor.may_run_inline(plain, 0)
    assert predictor.may_run_inline(plain, INLINE_MAX_WORK)
    assert not predictor.may_run_inline(plain, INLINE_MAX_WORK + 1)
    assert not predictor.may_run_inline(batched, 1)
    strict = Predictor(limits=RequestLimits(max_decode_work=16_000))  # light: <= 1,000
    assert strict.may_run_inline(plain, 1000)
    assert not strict.may_run_inline(plain, 1001)


# -- TensorFlow's thread pools (`--tensorflow_intra_op_parallelism`) ---------------------------


def test_intra_op_flag_reaches_the_eager_config_through_the_public_api():
    from tests.serving.conftest import fresh_process_words
    code = ("import tensorflow as tf\n"
            "from serving.server.model_server import _set_tf_threads\n"
            "_set_tf_threads(1, 0)\n"
            "tf.constant(1.0) + 1.0\n"
            "print(tf.config.threading.get_intra_op_parallelism_threads())\n")
    assert fresh_process_words(code)[-1:] == ["1"]
