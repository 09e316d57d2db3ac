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
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import Future
from typing import Callable, Dict, List, Optional

import grpc
import numpy as np

from serving.errors import ServingError, internal, unavailable
from serving.versions.batching_parameters import BatchingParameters

log = logging.getLogger(__name__)

Arrays = Dict[str, np.ndarray]


class _Task:
    __slots__ = ("inputs", "size", "key", "future", "enqueued")

    def __init__(self, inputs: Arrays, size: int, key: tuple):
        self.inputs = inputs
        self.size = size
        self.key = key
        self.future: Future = Future()
        self.enqueued = time.monotonic()


class BatchScheduler:
    """Merges concurrent calls of one signature into batches.

    Args:
      run: runs the signature on a dict of arrays and returns a dict of
        arrays whose dimension 0 is the batch; raises `ServingError`.
      params: the batching parameters.
      name: for thread names and logs.
      observer: `observer(name, queued_micros)` after each batch runs, with
        how long each of its requests waited in the queue (metrics), or None.
    """

    def __init__(self, run: Callable[[Arrays], Arrays], params: BatchingParameters,
                 name: str = "batch", observer: Optional[Callable] = None):
        self._run = run
        self._observer = observer
        self.params = params
        self.name = name
        self._tasks: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._form_lock = threading.Lock()
        self._closed = False
        self._queued_rows = 0
        self.batch_sizes: collections.Counter = collections.Counter()  # rows -> batches run
        self._threads = [threading.Thread(target=self._worker, daemon=True,
                                          name=f"{name}-{i}")
                         for i in range(params.num_batch_threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, inputs: Arrays) -> Arrays:
        """Runs `inputs` as part of a batch; blocks until its outputs are ready."""
        size = _batch_size(inputs)
        if size is None or size == 0 or size > self.params.max_batch_size:
            return self._run(inputs)
        key = tuple((name, arr.dtype.str, arr.shape[1:]) for name, arr in sorted(inputs.items()))
        task = _Task(inputs, size, key)
        with self._cond:
            if self._closed:
                task = None
            else:
                limit = self.params.max_enqueued_batches * self.params.max_batch_size
                if self._queued_rows + size > limit:
                    raise unavailable(f"The batch scheduling queue of {self.name} is full "
                                      f"({self._queued_rows} rows waiting)")
                self._tasks.append(task)
                self._queued_rows += size
                self._cond.notify_all()
        if task is None:  # closed (version unloading): run unbatched
            return self._run(inputs)
        return task.future.result()

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
            with self._form_lock:  # one batch fills at a time; others run
                batch = self._form_batch()
            if batch is None:
                return
            self._execute(batch)

    def _form_batch(self) -> Optional[List[_Task]]:
        limit = self.params.max_batch_size
        timeout = self.params.batch_timeout_micros / 1e6
        with self._cond:
            while not self._tasks:
                if self._closed:
                    return None
                self._cond.wait()
            first = self._tasks[0]
            deadline = first.enqueued + timeout
            while not self._closed:
                rows = sum(t.size for t in self._tasks if t.key == first.key)
                if rows >= limit:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
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
        if self._observer is not None:
            now = time.monotonic()
            self._observer(self.name, [1e6 * (now - t.enqueued) for t in batch])
        try:
            outputs = self._run(merged)
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


def _batch_size(inputs: Arrays) -> Optional[int]:
    """The common dimension 0 of all inputs, or None when they have none."""
    sizes = {arr.shape[0] if np.ndim(arr) else None for arr in inputs.values()}
    if len(sizes) != 1:
        return None
    return sizes.pop()
