"""Admission control: the decode-memory budget, request-wide limits, their flags and codes."""
from __future__ import annotations

import json
import threading

import grpc
import pytest

from serving.client.caption_client import CaptionClient, CaptionError
from serving.errors import ServingError
from serving.limits import admission
from serving.limits.admission import DecodeBudget, image_cost
from serving.server.flags import DEFAULTS, build_parser
from tests.serving.conftest import RED, make_base, start_server  # noqa: F401  (fixtures)
from tests.serving.fixtures import b64, expected_caption, rest_call, solid_image

PREDICT = "/v1/models/captioner:predict"


def test_budget_reserves_and_releases():
    budget = DecodeBudget(100)
    with budget.reserve(60):
        assert budget.held == 60
        with pytest.raises(ServingError) as busy:
            with budget.reserve(50):
                pass
        assert busy.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert busy.value.http_status == 429
        with budget.reserve(40):
            assert budget.held == 100
    assert budget.held == 0 and budget.peak == 100
    with budget.reserve(100):  # the whole budget, once free
        pass


def test_a_request_over_the_whole_budget_can_never_fit():
    with pytest.raises(ServingError) as never:
        with DecodeBudget(100).reserve(101):
            pass
    assert never.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "whole decode-memory budget" in never.value.message


def test_no_budget_admits_everything():
    budget = DecodeBudget(0)
    with budget.reserve(10 ** 15), budget.reserve(10 ** 15):
        assert budget.held == 2 * 10 ** 15


def test_released_on_error_and_large_releases_trim(monkeypatch):
    trims = []
    monkeypatch.setattr(admission, "release_free_memory", lambda: trims.append(1))
    budget = DecodeBudget(1 << 30)
    with pytest.raises(RuntimeError):
        with budget.reserve(admission.TRIM_AFTER_BYTES):
            raise RuntimeError("the run failed")
    assert budget.held == 0 and trims == [1]
    with budget.reserve(1000):
        pass
    assert trims == [1]  # small requests do not trim


def test_release_free_memory_runs_where_glibc_is():
    import platform
    # True exactly where the allocator is glibc (malloc_trim found and called).
    assert admission.release_free_memory() is (platform.libc_ver()[0] == "glibc")


def test_image_cost_grows_with_pixels_and_bytes():
    assert image_cost(0, 0) == admission.BYTES_PER_IMAGE
    assert image_cost(1000, 10) == 1000 * admission.DECODE_BYTES_PER_PIXEL + 20 + \
        admission.BYTES_PER_IMAGE


def test_flags_and_defaults():
    args = build_parser().parse_args(["--max-images-per-request", "7", "--max-request-pixels",
                                      "99", "--decode-memory-budget-mb", "64"])
    assert (args.max_images_per_request, args.max_request_pixels,
            args.decode_memory_budget_mb) == (7, 99, 64)
    args = build_parser().parse_args([])
    assert args.max_images_per_request == DEFAULTS.max_images_per_request == 1000
    assert args.max_request_pixels == DEFAULTS.max_request_pixels
    # The largest allowed request fits the default budget.
    cost = DEFAULTS.max_request_pixels * admission.DECODE_BYTES_PER_PIXEL
    assert cost < DEFAULTS.decode_memory_budget_mb << 20


def test_busy_budget_gives_resource_exhausted_and_429(make_base, start_server):  # noqa: F811
    server = start_server(make_base({1: "image"}), decode_memory_budget_mb=64)
    client = CaptionClient(server.grpc_address)
    image = solid_image(RED)
    assert client.caption([image])[0]["caption"] == expected_caption(RED)
    with server.budget.reserve(64 << 20):  # other requests hold the whole budget
        with pytest.raises(CaptionError) as busy:
            client.caption([image])
        assert busy.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--decode-memory-budget-mb" in busy.value.details
        status, body = rest_call(server.rest_url, PREDICT, {"instances": [b64(image)]})
        assert status == 429 and "retry later" in body["error"]
    assert server.budget.held == 0
    assert client.caption([image])[0]["caption"] == expected_caption(RED)
    status, _ = rest_call(server.rest_url, PREDICT, {"instances": [b64(image)]})
    assert status == 200


def test_concurrent_requests_never_hold_more_than_the_budget(make_base, start_server):  # noqa: F811
    server = start_server(make_base({1: "image"}), decode_memory_budget_mb=32)
    image = solid_image(RED, size=700)  # about 9.4 MiB each: three fit at once
    client = CaptionClient(server.grpc_address)
    codes = []

    def run():
        for _ in range(4):
            try:
                client.caption([image])
                codes.append("OK")
            except CaptionError as e:
                codes.append(e.code.name)

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"} and "OK" in codes
    assert 0 < server.budget.peak <= 32 << 20
    assert server.budget.held == 0


def test_request_limits_in_process(make_base, start_server):  # noqa: F811
    server = start_server(make_base({1: "image"}), max_images_per_request=3,
                          max_request_pixels=200)
    client = CaptionClient(server.grpc_address)
    with pytest.raises(CaptionError) as many:
        client.caption([solid_image(RED)] * 4)
    assert "--max-images-per-request" in many.value.details
    with pytest.raises(CaptionError) as pixels:
        client.caption([solid_image(RED, size=10)] * 3)  # 300 pixels
    assert "--max-request-pixels" in pixels.value.details
    assert len(client.caption([solid_image(RED, size=10)] * 2)) == 2
    status, body = rest_call(server.rest_url, PREDICT,
                             raw=json.dumps({"instances": [b64(solid_image(RED))] * 4}).encode())
    assert status == 400 and "--max-images-per-request" in body["error"]


def test_json_bodies_count_against_the_budget(make_base, start_server):  # noqa: F811
    # 2 MiB of JSON may become 64 MiB of Python objects: over a 32 MiB budget.
    server = start_server(make_base({1: "image"}), decode_memory_budget_mb=32)
    body = json.dumps({"instances": [b64(solid_image(RED))], "pad": "x" * (2 << 20)}).encode()
    status, payload = rest_call(server.rest_url, PREDICT, raw=body)
    assert status == 400 and "JSON body" in payload["error"], payload
    assert "whole decode-memory budget" in payload["error"]
    small = json.dumps({"instances": [b64(solid_image(RED))]}).encode()
    assert rest_call(server.rest_url, PREDICT, raw=small)[0] == 200


def test_counts_come_from_the_shape_before_any_tensor_exists():
    from tensorflow.core.framework import tensor_pb2, types_pb2

    from serving.server.predictor import check_counts
    from serving.tensors import tensor_shape

    proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[b"x"])
    proto.tensor_shape.dim.add().size = 10 ** 12  # a few bytes claiming 10^12 images
    shape = tensor_shape(proto)
    assert shape == (10 ** 12,)
    with pytest.raises(ServingError, match="1000000000000 rows"):
        check_counts({"image_bytes": (shape, True)}, 1000)
    with pytest.raises(ServingError, match="1200 images"):
        check_counts({"a": ((4, 300), True)}, 1000)
    check_counts({"a": ((4, 300), False)}, 1000)  # numbers are not images
    check_counts({"a": ((10 ** 12,), True)}, 0)  # 0: no limit
