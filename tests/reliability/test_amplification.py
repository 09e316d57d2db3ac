"""Amplification: few bytes in, much memory out. Every class is refused before decoding.

The server runs as a child process with a small decode-memory budget
(`BUDGET_MB`); its peak resident memory during each class is read from
VmHWM, reset before the class (and sampled every 5 ms where the reset is
not allowed). Asserted per class: every request gets its exact
code, the server is alive and still captions correctly, and the largest
RSS seen stays within the budget above the idle RSS. The idle RSS is read
once it has settled, and the RSS after a burst is polled until it is within
its bound (SETTLE_S is only a fail-safe), so a slow host waits longer
instead of failing. `-s` prints the table that docs/RELIABILITY.md quotes.
"""
from __future__ import annotations

import io
import json
import struct
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from typing import Dict

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from serving.limits.image_headers import probe_image
from serving.tensors import ndarray_to_tensor_proto
from tests.serving.fixtures import b64, expected_caption, publish_version, solid_image

BUDGET_MB = 256
MAX_IMAGES = 100
MAX_IMAGE_PIXELS = 4_000_000
MAX_REQUEST_PIXELS = 6_000_000
RED, BLUE = (220, 30, 30), (20, 20, 90)
TINY_PNG = solid_image(RED, size=1)
PREDICT = "/v1/models/captioner:predict"
INVALID, EXHAUSTED, OK = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                          grpc.StatusCode.OK)
FIGURES: Dict[str, dict] = {}  # class -> requests, codes, peak RSS above idle (for -s)

# Memory measured against the server's own idle RSS, taken in the same module.
pytestmark = pytest.mark.slow
# RSS is polled, never read after a fixed pause: a slow host only waits longer. This is
# the fail-safe on each wait (memory that is kept is never given back, however long).
SETTLE_S = 60.0


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_store, serve_process):
    base = tmp_path_factory.mktemp("amplification") / "captioner"
    base.mkdir()
    publish_version(model_store["image"], str(base), 1)
    process = serve_process([
        "--model-base-path", str(base), "--port", "0", "--rest-port", "0",
        "--poll-seconds", "0", "--max-image-pixels", str(MAX_IMAGE_PIXELS),
        "--max-images-per-request", str(MAX_IMAGES),
        "--max-request-pixels", str(MAX_REQUEST_PIXELS),
        "--decode-memory-budget-mb", str(BUDGET_MB)])
    stub = _stub(process)
    for _ in range(5):  # warm: traces, first-use allocations
        _check_alive(process, stub)
    big = solid_image(BLUE, size=1900)  # 3.6 M pixels: the largest allowed image, once
    assert _grpc(stub, [big]).code() is OK
    process.idle_rss = _settled_rss(process)
    process.stub = stub
    yield process
    _print_figures(process)


def _stub(process):
    channel = grpc.insecure_channel(process.grpc_address, options=[
        ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)])
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


class _Answer:
    def __init__(self, code, details="", response=None):
        self._code, self.details, self.response = code, details, response

    def code(self):
        return self._code


def _request(images=None, shape=None, proto=None, signature="") -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "captioner"
    request.model_spec.signature_name = signature
    if proto is not None:
        request.inputs["annotations" if signature else "image_bytes"].CopyFrom(proto)
    elif shape is not None:  # TensorProto's padding rule: the last value fills the shape
        tensor = request.inputs["image_bytes"]
        tensor.dtype = types_pb2.DT_STRING
        for size in shape:
            tensor.tensor_shape.dim.add().size = size
        tensor.string_val.extend(images)
    else:
        ndarray_to_tensor_proto(list(images), out=request.inputs["image_bytes"])
    return request


def _grpc(stub, images=None, **kwargs) -> _Answer:
    try:
        response = stub.Predict(_request(images, **kwargs), timeout=60)
        return _Answer(OK, response=response)
    except grpc.RpcError as e:
        return _Answer(e.code(), e.details())


def _rest(process, body: bytes):
    request = urllib.request.Request(process.rest_url + PREDICT, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _settled_rss(process) -> float:
    """The RSS once it has stopped moving: 10 samples 50 ms apart within 2 MB of each other
    (the lowest sample seen if it never settles within SETTLE_S)."""
    samples, deadline = [], time.monotonic() + SETTLE_S
    while True:
        samples.append(process.rss_mb())
        recent = samples[-10:]
        if len(recent) == 10 and max(recent) - min(recent) <= 2.0:
            return recent[-1]
        if time.monotonic() > deadline:
            return min(samples)
        time.sleep(0.05)


def _rss_above_idle_within(process, limit_mb: float) -> float:
    """The RSS above idle, polled until it is within `limit_mb`: the first value within it,
    or the last one after SETTLE_S (which the caller's assertion then reports)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        above = process.rss_mb() - process.idle_rss
        if above <= limit_mb or time.monotonic() > deadline:
            return above
        time.sleep(0.05)


def _check_alive(process, stub) -> None:
    assert process.alive(), process.log()[-3000:]
    answer = _grpc(stub, [solid_image(RED)])
    assert answer.code() is OK, answer.details
    assert answer.response.outputs["caption"].string_val[0].decode() == expected_caption(RED)


@contextmanager
def _measured(process, name: str):
    """The server's peak RSS while the block runs (VmHWM, reset first; else sampled)."""
    record = {"requests": 0, "codes": {}, "peak": 0.0}
    exact = process.reset_peak()
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            try:
                record["peak"] = max(record["peak"], process.rss_mb())
            except (OSError, RuntimeError):
                return
            stop.wait(0.005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield record
    finally:
        stop.set()
        thread.join()
    if exact:
        record["peak"] = max(record["peak"], process.peak_rss_mb())
    record["peak_above_idle"] = record["peak"] - process.idle_rss
    FIGURES[name] = record
    _check_alive(process, process.stub)
    assert record["peak_above_idle"] <= BUDGET_MB, (name, record)


def _count(record, code) -> None:
    record["requests"] += 1
    key = code.name if isinstance(code, grpc.StatusCode) else str(code)
    record["codes"][key] = record["codes"].get(key, 0) + 1


def _print_figures(process) -> None:
    print(f"\nbudget {BUDGET_MB} MiB; first server idle RSS {process.idle_rss:.0f} MB, after "
          f"all classes {process.rss_mb():.0f} MB")
    for name, r in FIGURES.items():
        after = (f", {r['after_above_idle']:+.0f} MB after" if "after_above_idle" in r else "")
        print(f"  {name}: {r['requests']} requests {r['codes']}, peak RSS {r['peak']:.0f} MB "
              f"(+{r['peak_above_idle']:.0f} MB over idle{after})")


def gif_with_frame(frame_w: int, frame_h: int, screen=(1, 1)) -> bytes:
    """A real GIF whose frame is frame_w x frame_h and whose header claims `screen`."""
    out = io.BytesIO()
    Image.new("P", (frame_w, frame_h), 1).save(out, format="GIF")
    data = bytearray(out.getvalue())
    data[6:10] = struct.pack("<HH", *screen)
    return bytes(data)


# -- the classes ----------------------------------------------------------------------


def test_one_string_replicated_by_the_shape(server):
    """A ~100-byte request claiming millions of images is refused from its shape."""
    cases = [([16_000_000], "16000000 rows"), ([50_000], "50000 rows"),
             ([MAX_IMAGES + 1], f"{MAX_IMAGES + 1} rows"), ([4, 30], "120 images")]
    with _measured(server, "one string, replicated by the shape (gRPC)") as record:
        for shape, fragment in cases * 5:
            answer = _grpc(server.stub, [TINY_PNG], shape=shape)
            _count(record, answer.code())
            assert answer.code() is INVALID, (shape, answer.code())
            assert fragment in answer.details and "--max-images-per-request" in answer.details
        # Annotations: rows count too, also when sent as content (no padding).
        rows = np.zeros((MAX_IMAGES + 1, 9, 3), np.float32)
        answer = _grpc(server.stub, proto=ndarray_to_tensor_proto(rows),
                       signature="caption_annotations")
        _count(record, answer.code())
        assert answer.code() is INVALID and "101 rows" in answer.details
        assert _grpc(server.stub, [TINY_PNG], shape=[MAX_IMAGES]).code() is OK
        _count(record, OK)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.lists(st.integers(0, 10 ** 7), min_size=1, max_size=3))
def test_generated_shapes_are_bounded_before_replication(server, shape):
    answer = _grpc(server.stub, [TINY_PNG], shape=shape)
    n = int(np.prod(shape))
    if n > 16 << 20:  # the tensor parser's own limit (--max-request-bytes elements) comes first
        assert answer.code() is INVALID and "more than the limit" in answer.details
    elif shape[0] > MAX_IMAGES or n > MAX_IMAGES:
        assert answer.code() is INVALID and "--max-images-per-request" in answer.details
    elif n == 0:  # one value for no elements
        assert answer.code() is INVALID and "0 elements" in answer.details
    else:
        assert answer.code() in (OK, INVALID), answer.details  # rank 2+: the signature's shape
    assert server.alive()


def test_many_tiny_images_over_rest(server):
    with _measured(server, "many tiny images (REST)") as record:
        for count, status, fragment in [(150_000, 400, "whole decode-memory budget"),
                                        (2_000, 400, "--max-images-per-request"),
                                        (MAX_IMAGES + 1, 400, "--max-images-per-request"),
                                        (MAX_IMAGES, 200, None)]:
            body = json.dumps({"instances": [b64(TINY_PNG)] * count}).encode()
            code, payload = _rest(server, body)
            _count(record, code)
            assert code == status, (count, payload)
            if fragment:
                assert fragment in payload["error"], payload
            else:
                assert len(payload["predictions"]) == MAX_IMAGES
        # The columnar form and nested lists are counted too.
        body = json.dumps({"inputs": [[b64(TINY_PNG)] * 2] * 60}).encode()
        code, payload = _rest(server, body)
        _count(record, code)
        assert code == 400 and "120 images" in payload["error"], payload


def test_gif_frame_larger_than_its_screen(server):
    bomb = gif_with_frame(5000, 5000)  # header: 1x1; frame: 25 M pixels
    assert probe_image(bomb).width == 1
    with _measured(server, "GIF frame larger than its screen") as record:
        for _ in range(5):
            answer = _grpc(server.stub, [bomb])
            _count(record, answer.code())
            assert answer.code() is INVALID and "frame of 25000000 pixels" in answer.details
            code, payload = _rest(server, json.dumps({"instances": [b64(bomb)]}).encode())
            _count(record, code)
            assert code == 400 and "exceeds the limit" in payload["error"]
        fine = gif_with_frame(1500, 1000)  # 1.5 M pixels: decodes
        answer = _grpc(server.stub, [fine])
        _count(record, answer.code())
        assert answer.code() is OK, answer.details


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.integers(1, 3000), st.integers(1, 3000), st.integers(1, 65535), st.integers(1, 65535),
       st.integers(1, 3))
def test_generated_gif_frames_are_counted(server, screen_w, screen_h, frame_w, frame_h, frames):
    """Crafted GIFs: refused exactly when a frame or the screen, times frames, is over."""
    frame = (b"\x2c" + struct.pack("<HHHHB", 0, 0, frame_w, frame_h, 0) + b"\x02"
             + b"\x02\x4c\x01\x00")
    data = (b"GIF89a" + struct.pack("<HHBBB", screen_w, screen_h, 0, 0, 0) + frame * frames
            + b";")
    answer = _grpc(server.stub, [data])
    pixels = max(screen_w * screen_h, frame_w * frame_h) * frames
    if pixels > MAX_IMAGE_PIXELS:
        assert answer.code() is INVALID and "exceeds the limit" in answer.details
    else:
        assert "exceeds the limit" not in answer.details
    assert server.alive()


def test_total_pixels_of_a_request(server):
    image = solid_image(RED, size=1500)  # 2.25 M pixels, under the per-image limit
    with _measured(server, "total pixels of a request") as record:
        for count, code in [(3, INVALID), (2, OK)]:
            answer = _grpc(server.stub, [image] * count)
            _count(record, answer.code())
            assert answer.code() is code, answer.details
            if code is INVALID:
                assert "--max-request-pixels" in answer.details
        code, payload = _rest(server, json.dumps({"instances": [b64(image)] * 3}).encode())
        _count(record, code)
        assert code == 400 and "--max-request-pixels" in payload["error"]


def test_json_that_cannot_be_a_request_is_refused_unparsed(server):
    size = 15 << 20
    bodies = [b"0" * size, b"\x00" * size, b"[" + b"0," * (size // 2) + b"0]",
              b" " * 1000 + b"[" * 10 + b"1" * size]
    with _measured(server, "JSON that cannot be a request (15 MB)") as record:
        for body in bodies:
            code, payload = _rest(server, body)
            _count(record, code)
            assert code == 400, payload
            assert "it starts with" in payload["error"], payload["error"][:200]
        # An object as large as the limit allows is parsed, within the budget.
        body = b'{"instances": [' + b"0," * (size // 2) + b"0]}"
        code, payload = _rest(server, body)
        _count(record, code)
        assert code == 400, payload


def test_concurrent_large_requests_stay_within_the_budget(server):
    """8 clients, each sending the largest allowed requests: the budget holds.

    Each request costs about 117 MiB (two 1700x1700 images, 5.8 M pixels),
    so two fit in the 256 MiB budget at once; the others get
    RESOURCE_EXHAUSTED (gRPC) / 429 (REST) until a slot frees.
    """
    images = [solid_image(RED, size=1700), solid_image(BLUE, size=1700)]
    body = json.dumps({"instances": [b64(i) for i in images]}).encode()
    lock = threading.Lock()
    with _measured(server, "concurrent largest requests (8 clients)") as record:
        def client(i):
            stub = _stub(server)
            for _ in range(6):
                if i % 2:
                    answer = _grpc(stub, images)
                    code = answer.code()
                    assert code in (OK, EXHAUSTED), answer.details
                    if code is EXHAUSTED:
                        assert "--decode-memory-budget-mb" in answer.details
                else:
                    code, payload = _rest(server, body)
                    assert code in (200, 429), payload
                with lock:
                    _count(record, code)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    codes = record["codes"]
    assert codes.get("OK", 0) + codes.get("200", 0) > 0, codes


def _burst(server, name: str, limit_mb: float) -> dict:
    """10 of the largest images; then the RSS above idle, given until SETTLE_S to come
    within `limit_mb` (released memory can take a moment to leave the process)."""
    image = solid_image(BLUE, size=1900)  # 3.6 M pixels: the largest allowed image
    with _measured(server, name) as record:
        for _ in range(10):
            answer = _grpc(server.stub, [image])
            _count(record, answer.code())
            assert answer.code() is OK, answer.details
    record["after_above_idle"] = _rss_above_idle_within(server, limit_mb)
    record["after"] = server.idle_rss + record["after_above_idle"]
    print(f"\n{name}: RSS after the burst {record['after']:.0f} MB "
          f"(idle {server.idle_rss:.0f} MB)")
    return record


def test_memory_after_large_requests_stays_within_the_budget(server):
    """TensorFlow's oneDNN allocator (the default on x86) keeps its peak pool for reuse."""
    record = _burst(server, "largest single image, 10 times", BUDGET_MB)
    assert record["after_above_idle"] <= BUDGET_MB, record


def test_memory_returns_after_large_requests_without_onednn(tmp_path_factory, model_store,
                                                            serve_process, monkeypatch):
    """With TF_ENABLE_ONEDNN_OPTS=0, freed decode buffers go back to the system."""
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    base = tmp_path_factory.mktemp("plain-allocator") / "captioner"
    base.mkdir()
    publish_version(model_store["image"], str(base), 1)
    process = serve_process([
        "--model-base-path", str(base), "--port", "0", "--rest-port", "0",
        "--poll-seconds", "0", "--max-image-pixels", str(MAX_IMAGE_PIXELS),
        "--decode-memory-budget-mb", str(BUDGET_MB)])
    process.stub = _stub(process)
    for _ in range(5):
        _check_alive(process, process.stub)
    process.idle_rss = _settled_rss(process)
    record = _burst(process, "largest single image, 10 times, TF_ENABLE_ONEDNN_OPTS=0",
                    BUDGET_MB / 8)
    assert record["after_above_idle"] <= BUDGET_MB / 8, record


def _bmp(dib: int, width: int, height: int, data: int = 64) -> bytes:
    head = (struct.pack("<Iii", dib, width, height) + struct.pack("<HH", 1, 24)
            + b"\0" * max(dib - 16, 0))
    return (b"BM" + struct.pack("<IHHI", 14 + len(head) + data, 0, 0, 14 + len(head)) + head
            + b"\0" * data)


def test_bmp_headers_cannot_claim_more_than_their_bytes(server):
    """A BMP's size is read by TensorFlow from fixed offsets, whatever its DIB header size;
    the decoder refuses sizes its data does not hold, before allocating."""
    cases = [_bmp(200, 20000, 20000),  # unknown DIB size: not probed here, refused by TF
             _bmp(40, 1500, 1500),     # under the pixel limit, but 64 bytes of pixels
             _bmp(40, 1500, -1500), _bmp(99, 1, 1)]
    with _measured(server, "BMP headers larger than their data") as record:
        for data in cases * 3:
            answer = _grpc(server.stub, [data])
            _count(record, answer.code())
            assert answer.code() is INVALID, answer.details
