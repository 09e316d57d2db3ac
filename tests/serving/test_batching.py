"""Dynamic batching: the scheduler's semantics, and the server with batching on vs off."""
from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest

from serving.client.caption_client import CaptionClient, CaptionError, ClientOptions
from serving.errors import ServingError, invalid_argument
from serving.versions.batch_scheduler import BatchScheduler
from serving.versions.batching_parameters import BatchingParameters
from tests.serving.conftest import BLUE, GREEN, RED, run_concurrently
from tests.serving.fixtures import expected_caption, solid_image


class Recorder:
    """A fake signature: doubles `x`, records each batch's size, rejects negatives."""

    def __init__(self, delay: float = 0.0):
        self.batches = []
        self.delay = delay

    def __call__(self, inputs):
        x = inputs["x"]
        self.batches.append(x.shape[0])
        time.sleep(self.delay)
        if (x < 0).any():
            raise invalid_argument("negative input")
        return {"y": x * 2, "n": np.full(x.shape[0], x.shape[0])}


def test_concurrent_requests_are_merged_and_split_back():
    run = Recorder()
    scheduler = BatchScheduler(run, BatchingParameters(max_batch_size=16, batch_timeout_micros=200_000,
                                                       num_batch_threads=1))
    inputs = [{"x": np.full((2, 3), i, np.float32)} for i in range(8)]
    results = run_concurrently(scheduler.submit, inputs)
    scheduler.close()
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result["y"], np.full((2, 3), 2 * i))
    assert run.batches == [16]  # 8 requests x 2 rows, closed as soon as it was full


def test_batch_closes_at_timeout_and_respects_max_size():
    run = Recorder()
    scheduler = BatchScheduler(run, BatchingParameters(max_batch_size=4, batch_timeout_micros=20_000,
                                                       num_batch_threads=1))
    started = time.monotonic()
    (alone,) = run_concurrently(scheduler.submit, [{"x": np.ones((1, 2), np.float32)}])
    assert time.monotonic() - started >= 0.015 and alone["n"].tolist() == [1]
    results = run_concurrently(scheduler.submit, [{"x": np.ones((1, 2), np.float32)}] * 10)
    scheduler.close()
    assert all(not isinstance(r, Exception) for r in results)
    assert max(run.batches) <= 4 and sum(run.batches) == 11


def test_oversized_and_incompatible_requests():
    run = Recorder()
    scheduler = BatchScheduler(run, BatchingParameters(max_batch_size=4, batch_timeout_micros=50_000,
                                                       num_batch_threads=1))
    big = scheduler.submit({"x": np.ones((9, 2), np.float32)})  # runs alone, unbatched
    assert big["y"].shape == (9, 2)
    mixed = [{"x": np.ones((1, 2), np.float32)}, {"x": np.ones((1, 5), np.float32)},
             {"x": np.ones((1, 2), np.float32)}]
    results = run_concurrently(scheduler.submit, mixed)
    scheduler.close()
    assert [r["y"].shape for r in results] == [(1, 2), (1, 5), (1, 2)]


def test_one_bad_request_fails_alone():
    run = Recorder()
    scheduler = BatchScheduler(run, BatchingParameters(max_batch_size=8, batch_timeout_micros=100_000,
                                                       num_batch_threads=1))
    inputs = [{"x": np.full((1,), v, np.float32)} for v in (1, -1, 2, 3)]
    results = run_concurrently(scheduler.submit, inputs)
    scheduler.close()
    assert isinstance(results[1], ServingError)
    assert results[1].code == grpc.StatusCode.INVALID_ARGUMENT
    assert [results[i]["y"].tolist() for i in (0, 2, 3)] == [[2], [4], [6]]


def test_padding_to_allowed_batch_sizes():
    run = Recorder()
    params = BatchingParameters(max_batch_size=8, batch_timeout_micros=100_000,
                                num_batch_threads=1, allowed_batch_sizes=(2, 4, 8))
    scheduler = BatchScheduler(run, params)
    results = run_concurrently(scheduler.submit, [{"x": np.full((1,), i, np.float32)}
                                                  for i in range(3)])
    scheduler.close()
    assert run.batches == [4]
    assert sorted(r["y"][0] for r in results) == [0, 2, 4]


def test_queue_full_is_unavailable():
    run = Recorder(delay=0.3)
    scheduler = BatchScheduler(run, BatchingParameters(max_batch_size=1, batch_timeout_micros=0,
                                                       num_batch_threads=1,
                                                       max_enqueued_batches=1))
    results = run_concurrently(scheduler.submit, [{"x": np.ones(1, np.float32)}] * 4)
    scheduler.close()
    codes = [r.code for r in results if isinstance(r, ServingError)]
    assert codes and set(codes) == {grpc.StatusCode.UNAVAILABLE}


def test_batching_parameters_text_round_trip():
    params = BatchingParameters(max_batch_size=32, batch_timeout_micros=1000, num_batch_threads=3,
                                max_enqueued_batches=7, allowed_batch_sizes=(8, 16, 32))
    assert BatchingParameters.from_text(params.to_text()) == params
    text = "max_batch_size { value: 16 }\nbatch_timeout_micros { value: 500 }\n"
    parsed = BatchingParameters.from_text(text)
    assert (parsed.max_batch_size, parsed.batch_timeout_micros) == (16, 500)
    with pytest.raises(ValueError):
        BatchingParameters(max_batch_size=8, allowed_batch_sizes=(4, 6))


IMAGES = [solid_image(RED), solid_image(BLUE, fmt="JPEG"), solid_image(GREEN, fmt="GIF"),
          solid_image((200, 190, 20)), solid_image((10, 10, 10), fmt="BMP"),
          solid_image((30, 90, 250), fmt="WEBP")]


def caption_concurrently(address, images):
    def one(image):
        with CaptionClient(address, options=ClientOptions(max_attempts=1)) as client:
            return client.caption([image])[0]
    return run_concurrently(one, images)


def test_server_batching_on_and_off_give_the_same_captions(make_base, start_server):
    base = make_base({1: "image"})
    plain = start_server(base)
    batched = start_server(base, batching=BatchingParameters(
        max_batch_size=8, batch_timeout_micros=50_000, num_batch_threads=1))
    images = IMAGES + [b"not an image"] + IMAGES
    off = caption_concurrently(plain.grpc_address, images)
    on = caption_concurrently(batched.grpc_address, images)
    for a, b, image in zip(off, on, images, strict=True):
        if image == b"not an image":  # fails alone, in both modes, with the same code
            assert isinstance(a, CaptionError) and isinstance(b, CaptionError)
            assert a.code == b.code == grpc.StatusCode.INVALID_ARGUMENT
            continue
        assert a["caption"] == b["caption"]
        np.testing.assert_array_equal(a["tokens"], b["tokens"])
        assert a["score"] == pytest.approx(b["score"], abs=1e-5)
        np.testing.assert_allclose(a["attention"], b["attention"], atol=1e-6)
    assert [r["caption"] for r in on[:3]] == [expected_caption(c) for c in (RED, BLUE, GREEN)]
    sizes = batched.manager.get("captioner").batch_sizes()["serving_default"]
    assert max(sizes) > 1, sizes  # requests really were merged


# Load shedding (issue #43): the queue held 100 batches (10 s of work at the
# benchmark's capacity), so under overload every request waited past its
# deadline and was answered too late. Deadlines here are on a fake clock: the
# tests depend on what the scheduler decides, not on how fast the host is.

class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class Gated(Recorder):
    """A Recorder whose runs wait for `release` (the first batch holds the only thread)."""

    def __init__(self):
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, inputs):
        self.entered.set()
        assert self.release.wait(60)
        return super().__call__(inputs)


def wait_until(condition, what: str) -> None:
    """Waits for another thread to reach a state (a synchronisation, not a time limit)."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.001)


def _one_row():
    return {"x": np.ones((1, 2), np.float32)}


def _start(scheduler, results, **kwargs) -> threading.Thread:
    def submit():
        try:
            results.append(scheduler.submit(_one_row(), **kwargs))
        except ServingError as e:
            results.append(e)
    thread = threading.Thread(target=submit)
    thread.start()
    return thread


def test_a_request_answered_after_its_deadline_is_refused_at_once():
    clock = FakeClock()
    run = Gated()
    scheduler = BatchScheduler(run, BatchingParameters(
        max_batch_size=2, batch_timeout_micros=0, num_batch_threads=1), clock=clock)
    scheduler.times.observe(10.0)  # a batch is measured to take 10 s
    with pytest.raises(ServingError) as info:  # idle: answered in one batch, 10 s
        scheduler.submit(_one_row(), deadline=clock() + 15)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "server busy" in info.value.message and "10000 ms a batch" in info.value.message
    first, queued = [], []
    threads = [_start(scheduler, first)]  # runs, holding the only batch thread
    assert run.entered.wait(60)
    threads.append(_start(scheduler, queued))  # waits for the next batch
    wait_until(lambda: scheduler.queued_rows == 1, "a queued row")
    # One batch running and one queued: a new row joins the queued batch,
    # answered after two batches (20 s), admitted with at least twice that
    # left (DEADLINE_SHARE: the estimate is a mean).
    with pytest.raises(ServingError) as info:
        scheduler.submit(_one_row(), deadline=clock() + 39)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    threads.append(_start(scheduler, queued, deadline=clock() + 41))
    wait_until(lambda: scheduler.queued_rows == 2, "the admitted row queued")
    run.release.set()
    for thread in threads:
        thread.join()
    scheduler.close()
    assert run.batches == [1, 2]  # the refused requests never ran
    assert all(not isinstance(r, Exception) for r in first + queued)
    assert scheduler.refused["busy"] == 2


@pytest.mark.parametrize("why", ["deadline", "cancelled"])
def test_a_queued_request_whose_deadline_passed_or_client_left_is_dropped_unrun(why):
    clock = FakeClock()
    run = Gated()
    scheduler = BatchScheduler(run, BatchingParameters(
        max_batch_size=4, batch_timeout_micros=0, num_batch_threads=1), clock=clock)
    first, late, kept = [], [], []
    client = {"active": True}
    threads = [_start(scheduler, first)]
    assert run.entered.wait(60)
    if why == "deadline":
        threads.append(_start(scheduler, late, deadline=clock() + 5))
    else:
        threads.append(_start(scheduler, late, is_active=lambda: client["active"]))
    wait_until(lambda: scheduler.queued_rows == 1, "the request queued")
    threads.append(_start(scheduler, kept, deadline=clock() + 50,
                          is_active=lambda: True))
    wait_until(lambda: scheduler.queued_rows == 2, "the second request queued")
    clock.now += 10  # the first's deadline passes while it waits
    client["active"] = False  # or its client goes away
    run.release.set()
    for thread in threads:
        thread.join()
    scheduler.close()
    (error,) = late
    expected = (grpc.StatusCode.DEADLINE_EXCEEDED if why == "deadline"
                else grpc.StatusCode.CANCELLED)
    assert isinstance(error, ServingError) and error.code == expected
    assert "not run" in error.message
    assert run.batches == [1, 1]  # the first request, then only the one kept
    assert kept[0]["y"].tolist() == [[2.0, 2.0]]
    assert scheduler.refused[why] == 1
