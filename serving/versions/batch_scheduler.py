"""Dynamic batching across concurrent requests, with TF Serving's semantics.

One scheduler serves one (model, version, signature). Requests are queued;
a batch closes when it holds `max_batch_size` rows or when its first request
has waited `batch_timeout_micros`; the inputs are concatenated along
dimension 0, the signature runs once, and every request gets its slice of
each output. `num_batch_threads` batches may run at once; while they run,
the next batch fills up, so under load batches grow by themselves.

Only requests whose inputs agree on dtype and on every dimension but the
first are merged. A request larger than `max_batch_size` runs on its own
(TF Serving would reject it unless large-batch splitting is on). If a merged
batch fails with INVALID_ARGUMENT (say one request carries an undecodable
image), each request is rerun alone, so only the bad one fails.

Load shedding: a request with a deadline is queued only while
its expected answer time fits in it (within `DEADLINE_SHARE` of the time
left); the rest are refused at once with RESOURCE_EXHAUSTED (HTTP 429),
instead of waiting to be answered too late.
The expected time is the batches ahead of it (queued rows over
`max_batch_size`, plus those running) over `num_batch_threads`, times the
measured run time of a batch (an exponentially weighted mean,
`serving/limits/load_shedding.py`), plus the batch timeout when its batch
will not be full.
Beyond `max_enqueued_batches` batches of rows, requests fail fast with
UNAVAILABLE, as in TF Serving. A queued request whose deadline passed, or
whose client went away (`is_active()` false: a cancelled RPC, a closed
connection), is dropped when its batch forms, never run: DEADLINE_EXCEEDED
or CANCELLED.
"""
from __future__ import annotations

import collections
import logging
import math
import threading
import time
from concurrent.futures import Future
from typing import Callable, Dict, List, Optional

import grpc
import numpy as np

from serving.errors import ServingError, internal, unavailable
from serving.limits.load_shedding import DEADLINE_SHARE, RunTimes, expected_seconds, fits
from serving.versions.batching_parameters import BatchingParameters

log = logging.getLogger(__name__)

Arrays = Dict[str, np.ndarray]


class _Task:
    __slots__ = ("inputs", "size", "key", "future", "enqueued", "deadline", "is_active")

    def __init__(self, inputs: Arrays, size: int, key: tuple, enqueued: float,
                 deadline: Optional[float], is_active: Optional[Callable[[], bool]]):
        self.inputs = inputs
        self.size = size
        self.key = key
        self.future: Future = Future()
        self.enqueued = enqueued
        self.deadline = deadline
        self.is_active = is_active

    def dropped(self, now: float) -> Optional[ServingError]:
        """Why this queued request must not run (deadline passed, client gone), or None."""
        if self.deadline is not None and now >= self.deadline:
            return ServingError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"the deadline passed after {1e3 * (now - self.enqueued):.0f} ms "
                                f"waiting for a batch; the request was not run")
        if self.is_active is not None and not self.is_active():
            return ServingError(grpc.StatusCode.CANCELLED,
                                "the client went away while the request waited for a batch; "
                                "it was not run")
        return None


class BatchScheduler:
    """Merges concurrent calls of one signature into batches.

    Args:
      run: runs the signature on a dict of arrays and returns a dict of
        arrays whose dimension 0 is the batch; raises `ServingError`.
      params: the batching parameters.
      name: for thread names and logs.
      observer: `observer(name, queued_micros)` after each batch runs, with
        how long each of its requests waited in the queue (metrics), or None.
      clock: monotonic seconds; deadlines are on this clock.
    """

    def __init__(self, run: Callable[[Arrays], Arrays], params: BatchingParameters,
                 name: str = "batch", observer: Optional[Callable] = None,
                 clock: Callable[[], float] = time.monotonic):
        self._run = run
        self._observer = observer
        self.params = params
        self.name = name
        self.clock = clock
        self._tasks: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._form_lock = threading.Lock()
        self._closed = False
        self._queued_rows = 0
        self._running = 0  # batches being run
        self.times = RunTimes()  # seconds a batch takes to run
        self.batch_sizes: collections.Counter = collections.Counter()  # rows -> batches run
        # "busy" (refused: the expected wait did not fit the deadline), "full"
        # (max_enqueued_batches), "deadline" / "cancelled" (dropped when dequeued)
        self.refused: collections.Counter = collections.Counter()
        self._threads = [threading.Thread(target=self._worker, daemon=True,
                                          name=f"{name}-{i}")
                         for i in range(params.num_batch_threads)]
        for thread in self._threads:
            thread.start()

    @property
    def queued_rows(self) -> int:
        """Rows waiting for a batch."""
        with self._cond:
            return self._queued_rows

    @property
    def running(self) -> int:
        """Batches being run."""
        with self._cond:
            return self._running

    def submit(self, inputs: Arrays, deadline: Optional[float] = None,
               is_active: Optional[Callable[[], bool]] = None) -> Arrays:
        """Runs `inputs` as part of a batch; blocks until its outputs are ready.

        Args:
          inputs: alias -> array, dimension 0 the rows.
          deadline: `clock()` time by which the answer is due; None: none.
          is_active: returns False once the client is gone; None: never.
        Raises:
          ServingError: RESOURCE_EXHAUSTED when the answer is expected after
            `deadline`; UNAVAILABLE when `max_enqueued_batches` batches of rows
            wait; DEADLINE_EXCEEDED or CANCELLED when dropped from the queue
            (see the module doc); any error of the run.
        """
        return self.submit_async(inputs, deadline, is_active).result()

    def submit_async(self, inputs: Arrays, deadline: Optional[float] = None,
                     is_active: Optional[Callable[[], bool]] = None) -> Future:
        """As `submit`, but returns once `inputs` is queued, with a Future of its outputs.

        Refusals (RESOURCE_EXHAUSTED, UNAVAILABLE) are raised here, at once;
        the Future carries the run's outputs or its error. A request that
        cannot be batched (too large, no common dimension 0) or that arrives
        once the scheduler is closed runs here, unbatched, and its Future is
        done on return. Never cancel the Future: the scheduler sets it.
        """
        size = _batch_size(inputs)
        if size is None or size == 0 or size > self.params.max_batch_size:
            return _done(self._run, inputs)
        key = tuple((name, arr.dtype.str, arr.shape[1:]) for name, arr in sorted(inputs.items()))
        with self._cond:
            now = self.clock()
            task = None if self._closed else _Task(inputs, size, key, now, deadline, is_active)
            if task is not None:
                self._check_admission(size, deadline, now)
                self._tasks.append(task)
                self._queued_rows += size
                self._cond.notify_all()
        if task is None:  # closed (version unloading): run unbatched
            return _done(self._run, inputs)
        return task.future

    def check_admission(self, rows: int, deadline: Optional[float]) -> None:
        """Raises now what `submit` of `rows` rows would raise at once (RESOURCE_EXHAUSTED,
        UNAVAILABLE, DEADLINE_EXCEEDED), so that a caller can refuse a request before
        parsing it (with `rows` a lower bound of its rows)."""
        with self._cond:
            if not self._closed:
                self._check_admission(rows, deadline, self.clock())

    def _check_admission(self, rows: int, deadline: Optional[float], now: float) -> None:
        """`check_admission`; the caller holds `_cond`."""
        limit = self.params.max_enqueued_batches * self.params.max_batch_size
        if self._queued_rows + rows > limit:
            self.refused["full"] += 1
            raise unavailable(f"The batch scheduling queue of {self.name} is full "
                              f"({self._queued_rows} rows waiting)")
        if deadline is not None:
            self._check_wait(rows, deadline - now)

    def expected_seconds(self, rows: int) -> Optional[float]:
        """When a request of `rows` rows queued now is expected to be answered (seconds
        from now), or None before any batch ran. The caller holds `_cond`."""
        queued = self._queued_rows + rows
        batches = math.ceil(queued / self.params.max_batch_size)  # its own included
        seconds = expected_seconds(self._running + batches - 1, self.params.num_batch_threads,
                                   self.times.mean)
        if seconds is None:
            return None
        fill = self.params.batch_timeout_micros / 1e6 if queued < self.params.max_batch_size \
            else 0.0
        return seconds + fill

    def _check_wait(self, rows: int, left: float) -> None:
        """RESOURCE_EXHAUSTED (or DEADLINE_EXCEEDED) unless the answer is expected within
        `left` seconds. The caller holds `_cond`."""
        if left <= 0:
            self.refused["deadline"] += 1
            raise ServingError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               "the deadline passed before the request was queued for a batch")
        expected = self.expected_seconds(rows)
        if not fits(expected, left):
            self.refused["busy"] += 1
            raise ServingError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"server busy: {self.name} would answer in about {1e3 * expected:.0f} ms "
                f"({self._queued_rows} rows queued, {self._running} batches running, "
                f"{1e3 * self.times.mean:.0f} ms a batch), more than {DEADLINE_SHARE:.0%} of "
                f"the {1e3 * left:.0f} ms left before the request's deadline; retry later")

    def close(self) -> None:
        """Stops taking requests; queued ones still run, then the threads exit."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def join(self, timeout: Optional[float] = None) -> None:
        for thread in self._threads:
            thread.join(timeout)

    def _worker(self) -> None:
        while True:
            dropped: list = []
            with self._form_lock:  # one batch fills at a time; others run
                batch = self._form_batch(dropped)
            for task, error in dropped:  # outside the queue's lock
                task.future.set_exception(error)
            if batch is None:
                return
            if not batch:  # every queued task was dropped
                continue
            try:
                self._execute(batch)
            finally:
                with self._cond:
                    self._running -= 1

    def _drop_dead(self, dropped: list) -> None:
        """Moves queued tasks that must not run to `dropped`. The caller holds `_cond`."""
        now = self.clock()
        kept: collections.deque = collections.deque()
        for task in self._tasks:
            error = task.dropped(now)
            if error is None:
                kept.append(task)
            else:
                dropped.append((task, error))
                self._queued_rows -= task.size
                self.refused["deadline" if error.code == grpc.StatusCode.DEADLINE_EXCEEDED
                             else "cancelled"] += 1
        self._tasks = kept

    def _form_batch(self, dropped: list) -> Optional[List[_Task]]:
        limit = self.params.max_batch_size
        timeout = self.params.batch_timeout_micros / 1e6
        with self._cond:
            while not self._tasks:
                if self._closed:
                    return None
                self._cond.wait()
            self._drop_dead(dropped)
            if not self._tasks:
                return []
            first = self._tasks[0]
            deadline = first.enqueued + timeout
            while not self._closed:
                rows = sum(t.size for t in self._tasks if t.key == first.key)
                if rows >= limit:
                    break
                remaining = deadline - self.clock()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            self._drop_dead(dropped)
            if not self._tasks:  # every one went while the batch filled
                return []
            first = self._tasks[0]
            batch, rest, rows = [], collections.deque(), 0
            while self._tasks:
                task = self._tasks.popleft()
                if task.key == first.key and rows + task.size <= limit:
                    batch.append(task)
                    rows += task.size
                else:
                    rest.append(task)
            self._tasks = rest
            self._queued_rows -= rows
            self._running += 1
            return batch

    def _execute(self, batch: List[_Task]) -> None:
        rows = sum(t.size for t in batch)
        padded = rows
        for allowed in self.params.allowed_batch_sizes:
            if allowed >= rows:
                padded = allowed
                break
        names = batch[0].inputs.keys()
        merged = {}
        for name in names:
            parts = [t.inputs[name] for t in batch]
            if padded > rows:  # repeat the last row; its outputs are dropped
                parts.append(np.repeat(parts[-1][-1:], padded - rows, axis=0))
            merged[name] = np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
        self.batch_sizes[rows] += 1
        started = self.clock()
        if self._observer is not None:
            self._observer(self.name, [1e6 * (started - t.enqueued) for t in batch])
        try:
            outputs = self._run(merged)
            self.times.observe(self.clock() - started)
        except ServingError as e:
            if e.code == grpc.StatusCode.INVALID_ARGUMENT and len(batch) > 1:
                self._run_alone(batch)
            else:
                for task in batch:
                    task.future.set_exception(e)
            return
        except Exception as e:  # never leave a caller waiting
            log.exception("batch of %s failed", self.name)
            for task in batch:
                task.future.set_exception(internal(f"batch failed: {e}"))
            return
        if any(np.ndim(v) == 0 or np.shape(v)[0] != padded for v in outputs.values()):
            # Some output is not batched along dim 0: splitting is impossible.
            self._run_alone(batch)
            return
        start = 0
        for task in batch:
            end = start + task.size
            task.future.set_result({k: v[start:end] for k, v in outputs.items()})
            start = end

    def _run_alone(self, batch: List[_Task]) -> None:
        for task in batch:
            try:
                task.future.set_result(self._run(task.inputs))
            except ServingError as e:
                task.future.set_exception(e)
            except Exception as e:
                task.future.set_exception(internal(f"request failed: {e}"))


def _done(run: Callable[[Arrays], Arrays], inputs: Arrays) -> Future:
    """A Future done with `run(inputs)`'s outputs, or with its error."""
    future: Future = Future()
    try:
        future.set_result(run(inputs))
    except Exception as e:
        future.set_exception(e)
    return future


def _batch_size(inputs: Arrays) -> Optional[int]:
    """The common dimension 0 of all inputs, or None when they have none."""
    sizes = {arr.shape[0] if np.ndim(arr) else None for arr in inputs.values()}
    if len(sizes) != 1:
        return None
    return sizes.pop()
