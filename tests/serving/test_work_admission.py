"""CPU admission: decode-work limits, lanes, the budget, deadlines; through gRPC and REST.

The scheduler's logic is tested with threads held at known points (no
timing assertions); the latency a normal request sees under load is
measured by benchmarks/decode_cpu.py and asserted loosely in
tests/reliability/test_decode_cpu.py.
"""
from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest

from serving.client.caption_client import CaptionClient, CaptionError
from serving.errors import ServingError
from serving.limits.decode_work import check_work
from serving.limits.image_headers import probe_image
from serving.limits.work_admission import WorkScheduler, default_lanes, mark_pool, request_work
from serving.server.flags import DEFAULTS, build_parser
from tests.serving.conftest import RED, make_base, start_server  # noqa: F401  (fixtures)
from tests.serving.fixtures import b64, expected_caption, rest_call, solid_image
from tests.serving.hostile_images import jpeg, repeated_scan_jpeg

PREDICT = "/v1/models/captioner:predict"
INVALID, BUSY, LATE = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                       grpc.StatusCode.DEADLINE_EXCEEDED)


def _wait_until(condition, timeout: float = 10.0) -> None:
    """Polls `condition` (a synchronisation point, not a timing assertion)."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        time.sleep(0.005)


class _Holder:
    """A thread inside `scheduler.admit(work)` until `release()`; records what happened."""

    def __init__(self, scheduler: WorkScheduler, work: int, deadline=None, log=None, name="",
                 pool=None):
        self.entered, self._release = threading.Event(), threading.Event()
        self.error = None

        def run():
            if pool is not None:
                mark_pool(*pool)
            try:
                with scheduler.admit(work, deadline):
                    if log is not None:
                        log.append(name)
                    self.entered.set()
                    self._release.wait(30)
            except ServingError as e:
                self.error = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def release(self) -> None:
        self._release.set()
        self.thread.join(30)


def test_light_requests_never_wait():
    scheduler = WorkScheduler(budget=100, light_work=10, lanes=1, max_waiting=1)
    heavy = _Holder(scheduler, 60)
    assert heavy.entered.wait(10)
    queued = _Holder(scheduler, 60)
    _wait_until(lambda: scheduler.waiting == 1)
    with scheduler.admit(10):  # the lane is taken and the queue is full
        assert scheduler.running == 1 and scheduler.waiting == 1
    heavy.release()
    assert queued.entered.wait(10)
    queued.release()
    assert scheduler.admitted == {"light": 1, "heavy": 2}
    assert (scheduler.held, scheduler.running, scheduler.waiting) == (0, 0, 0)


def test_heavy_requests_wait_for_a_lane_in_arrival_order():
    scheduler = WorkScheduler(budget=1000, light_work=10, lanes=2)
    log = []
    first = [_Holder(scheduler, 100, log=log, name=f"run{i}") for i in range(2)]
    for holder in first:
        assert holder.entered.wait(10)
    waiting = []
    for i in range(4):  # queued one at a time: their order is known
        waiting.append(_Holder(scheduler, 100, log=log, name=f"wait{i}"))
        _wait_until(lambda i=i: scheduler.waiting == i + 1)
    assert scheduler.running == 2 and scheduler.peak_running == 2
    for holder in first + waiting:
        holder.release()
    assert log[2:] == ["wait0", "wait1", "wait2", "wait3"]
    assert scheduler.peak_running == 2 and scheduler.held == 0


def test_the_budget_bounds_heavy_work_in_progress():
    scheduler = WorkScheduler(budget=100, light_work=10, lanes=4)
    a = _Holder(scheduler, 60)
    assert a.entered.wait(10)
    b = _Holder(scheduler, 60)  # a lane is free, the budget is not
    _wait_until(lambda: scheduler.waiting == 1)
    assert not b.entered.is_set() and scheduler.held == 60
    a.release()
    assert b.entered.wait(10) and scheduler.held == 60
    b.release()


def test_a_request_over_the_whole_budget_is_invalid():
    scheduler = WorkScheduler(budget=100, light_work=10, lanes=1)
    with pytest.raises(ServingError) as e:
        with scheduler.admit(101, what="a request of 3 images"):
            pass
    assert e.value.code is INVALID and "--decode-work-budget" in e.value.message
    assert "a request of 3 images" in e.value.message


def test_a_passed_deadline_starts_nothing():
    now = [100.0]
    scheduler = WorkScheduler(budget=100, light_work=10, lanes=1, clock=lambda: now[0])
    ran = []
    for work in (5, 50):  # light and heavy alike
        with pytest.raises(ServingError) as e:
            with scheduler.admit(work, deadline=99.0):
                ran.append(work)
        assert e.value.code is LATE
    assert ran == [] and scheduler.refused["deadline"] == 2
    with scheduler.admit(50, deadline=100.5):
        ran.append(50)
    assert ran == [50]


def test_a_deadline_passing_in_the_queue_leaves_it_cleanly():
    scheduler = WorkScheduler(budget=100, light_work=10, lanes=1)
    holder = _Holder(scheduler, 50)
    assert holder.entered.wait(10)
    late = _Holder(scheduler, 50, deadline=time.monotonic() + 0.05)
    later = _Holder(scheduler, 50)
    late.thread.join(10)
    assert late.error is not None and late.error.code is LATE
    assert "nothing was decoded" in late.error.message and not late.entered.is_set()
    _wait_until(lambda: scheduler.waiting == 1)  # `later` is still queued
    holder.release()
    assert later.entered.wait(10)
    later.release()
    assert (scheduler.held, scheduler.running, scheduler.waiting) == (0, 0, 0)


def test_a_full_queue_is_resource_exhausted():
    scheduler = WorkScheduler(budget=100, light_work=10, lanes=1, max_waiting=2)
    holders = [_Holder(scheduler, 50)]
    assert holders[0].entered.wait(10)
    for i in range(2):
        holders.append(_Holder(scheduler, 50))
        _wait_until(lambda i=i: scheduler.waiting == i + 1)
    with pytest.raises(ServingError) as e:
        with scheduler.admit(50):
            pass
    assert e.value.code is BUSY and "retry later" in e.value.message
    assert scheduler.refused["busy"] == 1
    for holder in holders:
        holder.release()


def test_one_pool_may_fill_at_most_half_its_threads_waiting():
    scheduler = WorkScheduler(budget=100, light_work=10, lanes=1, max_waiting=16)
    holders = [_Holder(scheduler, 50)]
    assert holders[0].entered.wait(10)
    for i in range(2):  # a pool of 4 threads: 2 may wait
        holders.append(_Holder(scheduler, 50, pool=("rest", 4)))
        _wait_until(lambda i=i: scheduler.waiting == i + 1)
    third = _Holder(scheduler, 50, pool=("rest", 4))
    third.thread.join(10)
    assert third.error is not None and third.error.code is BUSY
    holders.append(_Holder(scheduler, 50, pool=("grpc", 64)))  # another pool still queues
    _wait_until(lambda: scheduler.waiting == 3)
    for holder in holders:
        holder.release()
    assert (scheduler.held, scheduler.running, scheduler.waiting) == (0, 0, 0)


def test_no_budget_admits_everything_at_once():
    scheduler = WorkScheduler(budget=0, lanes=1)
    with scheduler.admit(10 ** 15):
        with scheduler.admit(10 ** 15):
            assert scheduler.running == 0
    assert scheduler.admitted["light"] == 2


def test_many_threads_never_exceed_lanes_or_budget():
    scheduler = WorkScheduler(budget=1000, light_work=50, lanes=3, max_waiting=200)
    rng = np.random.default_rng(0)
    works = [int(w) for w in rng.integers(1, 700, 200)]
    seen, errors = [], []
    lock = threading.Lock()

    def run(work):
        try:
            with scheduler.admit(work):
                if work > 50:
                    with lock:
                        seen.append((scheduler.running, scheduler.held))
                time.sleep(0.001)
        except ServingError as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(w,)) for w in works]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and len(seen) == sum(w > 50 for w in works)
    assert max(r for r, _ in seen) <= 3 and max(h for _, h in seen) <= 1000
    assert (scheduler.held, scheduler.running, scheduler.waiting) == (0, 0, 0)


def test_default_lanes_leave_one_thread_free():
    assert default_lanes() >= 1


def test_request_work_sums_images_and_names_the_one_over():
    photo = jpeg((256, 256), noise=5, progressive=True)
    inputs = {"image_bytes": np.array([photo, photo, b"not an image"], dtype=object),
              "n": np.zeros(3, np.float32)}
    one = check_work(photo, probe_image(photo), 0)
    assert request_work(inputs, 10 ** 9, 10 ** 10) == (2 * one, 3)
    hostile = repeated_scan_jpeg(512, 100)
    inputs["image_bytes"] = np.array([photo, hostile], dtype=object)
    with pytest.raises(ServingError) as e:
        request_work(inputs, 10 ** 7, 10 ** 10)
    assert e.value.code is INVALID and e.value.message.startswith("input image_bytes[1]: ")
    assert "with 110 scans" in e.value.message
    with pytest.raises(ServingError) as e:  # each image fits, the request does not
        request_work({"image_bytes": np.array([photo] * 5, dtype=object)}, 10 ** 9, 3 * one - 1)
    assert "--decode-work-budget" in e.value.message and "image_bytes[2]" in e.value.message


def test_a_repeated_image_object_is_walked_once(monkeypatch):
    from serving.limits import work_admission
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return check_work(*args, **kwargs)

    monkeypatch.setattr(work_admission, "check_work", counting)
    photo = jpeg((256, 256), noise=5, progressive=True)
    array = np.array([photo] * 1000, dtype=object)  # what TensorProto's padding rule makes
    one = check_work(photo, probe_image(photo), 0)
    assert request_work({"image_bytes": array}, 10 ** 9, 10 ** 12) == (1000 * one, 1000)
    assert len(calls) == 1


def test_flags_and_defaults():
    args = build_parser().parse_args(["--max-decode-work", "123", "--decode-work-budget", "456"])
    assert (args.max_decode_work, args.decode_work_budget) == (123, 456)
    args = build_parser().parse_args([])
    assert args.max_decode_work == DEFAULTS.max_decode_work == 2_000_000_000
    assert args.decode_work_budget is None
    assert "--max-decode-work" in build_parser().format_help()


# -- through the server ---------------------------------------------------------

def _calls(server) -> int:
    return int(server.manager.get("captioner").module.calls.numpy())


def test_hostile_jpeg_is_refused_before_decoding_grpc_and_rest(make_base, start_server):  # noqa: F811
    server = start_server(make_base({1: "image"}), warmup=False)
    hostile = repeated_scan_jpeg(2000, 4000)
    client = CaptionClient(server.grpc_address)
    with pytest.raises(CaptionError) as e:
        client.caption([solid_image(RED), hostile])
    assert e.value.code is INVALID
    assert e.value.details.startswith("input image_bytes[1]: progressive JPEG of 2000x2000 "
                                      "with 4010 scans: estimated decode work exceeds "
                                      "--max-decode-work 2000000000")
    status, body = rest_call(server.rest_url, PREDICT, {"instances": [b64(hostile)]})
    assert status == 400 and "4010 scans" in body["error"] and "--max-decode-work" in \
        body["error"]
    assert _calls(server) == 0  # nothing reached the model
    assert client.caption([solid_image(RED)])[0]["caption"] == expected_caption(RED)


def test_heavy_requests_wait_light_ones_pass_deadlines_hold(make_base, start_server):  # noqa: F811
    # 16 M pixel-passes per image: a 1024x768 progressive JPEG (6.3 M) is
    # heavy (over 1 M) but allowed; an 8x8 PNG is light.
    server = start_server(make_base({1: "image"}), warmup=False, max_decode_work=16_000_000,
                          decode_lanes=1)
    work = server.predictor.work
    assert (work.budget, work.light_work, work.lanes) == (32_000_000, 1_000_000, 1)
    heavy = jpeg((1024, 768), color=(200, 30, 30), progressive=True)
    holder = _Holder(work, 32_000_000)  # stands for expensive requests decoding
    assert holder.entered.wait(10)
    light = CaptionClient(server.grpc_address)
    assert light.caption([solid_image(RED)])[0]["caption"] == expected_caption(RED)
    with pytest.raises(CaptionError) as late:
        CaptionClient(server.grpc_address, timeout=0.3).caption([heavy])
    assert late.value.code is LATE
    _wait_until(lambda: work.waiting == 0 and work.refused["deadline"] == 1)
    rest = {}
    waiter = threading.Thread(target=lambda: rest.update(answer=rest_call(
        server.rest_url, PREDICT, {"instances": [b64(heavy)]})))
    waiter.start()
    _wait_until(lambda: work.waiting == 1)  # REST has no deadline: it waits
    assert _calls(server) == 1  # the light request only: the late one decoded nothing
    holder.release()
    waiter.join(30)
    status, body = rest["answer"]
    assert status == 200 and body["predictions"][0]["caption"] == expected_caption(RED)
    assert work.admitted["heavy"] == 2 and _calls(server) == 2


def test_a_request_whose_deadline_passed_is_not_decoded(make_base, start_server):  # noqa: F811
    from tensorflow_serving.apis import predict_pb2

    from serving.tensors import ndarray_to_tensor_proto

    server = start_server(make_base({1: "image"}), warmup=False)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "captioner"
    request.inputs["image_bytes"].CopyFrom(
        ndarray_to_tensor_proto(np.array([solid_image(RED)], dtype=object)))
    with pytest.raises(ServingError) as e:
        server.predictor.predict(request, deadline=time.monotonic() - 0.01)
    assert e.value.code is LATE and _calls(server) == 0
    assert server.predictor.predict(request, deadline=time.monotonic() + 30).outputs


def test_busy_decoder_gives_resource_exhausted_and_429(make_base, start_server):  # noqa: F811
    server = start_server(make_base({1: "image"}), warmup=False, max_decode_work=16_000_000,
                          decode_lanes=1)
    work = server.predictor.work
    work.max_waiting = 0  # nothing may queue
    heavy = jpeg((1024, 768), progressive=True)
    holder = _Holder(work, 2_000_000)  # heavy: holds the only lane
    assert holder.entered.wait(10)
    with pytest.raises(CaptionError) as e:
        CaptionClient(server.grpc_address).caption([heavy])
    assert e.value.code is BUSY and "retry later" in e.value.details
    status, body = rest_call(server.rest_url, PREDICT, {"instances": [b64(heavy)]})
    assert status == 429 and "retry later" in body["error"]
    assert CaptionClient(server.grpc_address).caption([solid_image(RED)])  # light: runs
    holder.release()


def test_waiting_rest_requests_leave_rest_threads_free(make_base, start_server):  # noqa: F811
    server = start_server(make_base({1: "image"}), warmup=False, max_decode_work=16_000_000,
                          decode_lanes=1, rest_threads=4)
    work = server.predictor.work
    heavy = jpeg((1024, 768), color=(200, 30, 30), progressive=True)
    holder = _Holder(work, 2_000_000)
    assert holder.entered.wait(10)
    answers = []
    waiters = [threading.Thread(target=lambda: answers.append(rest_call(
        server.rest_url, PREDICT, {"instances": [b64(heavy)]})[0])) for _ in range(2)]
    for waiter in waiters:
        waiter.start()
    _wait_until(lambda: work.waiting == 2)  # half of the 4 REST threads
    status, body = rest_call(server.rest_url, PREDICT, {"instances": [b64(heavy)]})
    assert status == 429 and "retry later" in body["error"]
    for _ in range(3):  # light requests still find a thread
        assert rest_call(server.rest_url, PREDICT, {"instances": [b64(solid_image(RED))]})[0] \
            == 200
    holder.release()
    for waiter in waiters:
        waiter.join(30)
    assert answers == [200, 200]
