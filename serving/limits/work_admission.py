"""CPU admission: a request's decode work is bounded, and admitted by it, before it runs.

Images are decoded inside the SavedModel's graph (`serving_default` takes
encoded bytes), on TensorFlow's inter-op thread pool, one thread per image
decode, as many threads as cores by default. When expensive decodes occupy
every thread, every other request's ops queue behind them: four 40-second
JPEGs stalled a 10 ms request for 41-48 s. So, before a signature runs:

1. **Per image**: its decode work (pixel-passes, `serving/limits/decode_work.py`)
   may not exceed `--max-decode-work`: INVALID_ARGUMENT, naming the cause.
2. **Per request**: all its images together may not exceed the server's
   decode-work budget (`--decode-work-budget`): INVALID_ARGUMENT, since it
   could never be admitted.
3. **Light requests** (work at most `light_work`, 1/16 of --max-decode-work
   by default: one 12 Mpx progressive or 40 Mpx baseline colour JPEG) run
   at once, never waiting here.
4. **Heavy requests** run in `lanes` (one less than TensorFlow's inter-op
   threads, at least one), and together hold at most the budget's work;
   the others wait in arrival order, up to `max_waiting` of them, and from
   one worker pool (gRPC's, REST's: `mark_pool`) at most half its threads,
   so waiting requests never take every thread of an API (beyond:
   RESOURCE_EXHAUSTED, retry later); and up to their deadline (then
   DEADLINE_EXCEEDED, without having decoded anything).

So a thread of the pool stays free for light requests while heavy ones
decode, however many arrive; a light request waits for a thread only when
one heavy request decodes several images at once, and then for at most one
image's decode, bounded by --max-decode-work (docs/RELIABILITY.md, "CPU").
"""
from __future__ import annotations

import collections
import os
import threading
import time
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, Mapping, Optional, Sequence, Tuple

import grpc
import numpy as np

from serving.errors import ServingError, invalid_argument
from serving.limits.admission import resource_exhausted
from serving.limits.decode_work import check_work
from serving.limits.image_headers import ImageHeaderError, ImageInfo, probe_image

# Requests with at most this fraction of --max-decode-work never wait.
LIGHT_FRACTION = 16
MAX_WAITING = 16
_POOL = threading.local()


def mark_pool(name: str, threads: int) -> None:
    """Marks the calling thread as a worker of the pool `name` of `threads` threads.

    Used as a `ThreadPoolExecutor` initializer by the gRPC and REST servers:
    heavy requests from one pool may fill at most half its threads waiting.

    Args:
      name: the pool's name ("grpc", "rest").
      threads: the pool's size.
    """
    _POOL.name, _POOL.threads = name, threads


def deadline_exceeded(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.DEADLINE_EXCEEDED, message)


def default_lanes() -> int:
    """Heavy requests that may decode at once: TensorFlow's inter-op threads less one.

    Returns:
      At least 1. The inter-op pool has one thread per schedulable core unless
      `--tensorflow_inter_op_parallelism` set another size.
    """
    threads = 0
    try:
        import tensorflow as tf
        threads = tf.config.threading.get_inter_op_parallelism_threads()
    except Exception:  # TF not importable here: fall back to the cores
        threads = 0
    if threads <= 0:
        try:
            threads = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            threads = os.cpu_count() or 1
    return max(threads - 1, 1)


def request_work(inputs: Mapping[str, np.ndarray], max_work: int, budget: int,
                 headers: Optional[Sequence[Tuple[str, int, Optional[ImageInfo]]]] = None
                 ) -> Tuple[int, int]:
    """The decode work of a request's images, checked against both limits.

    Args:
      inputs: alias -> array; string (object) arrays hold the images.
      max_work: limit per image (0: none).
      budget: limit for all images together (0: none).
      headers: `(alias, flat index, probe_image result)` of every string
        element, as `Servable.check_inputs` read them; None: read here.
    Returns:
      (work, images): the estimated pixel-passes of all images, and their count.
    Raises:
      ServingError: INVALID_ARGUMENT for an image over `max_work` or a
        request over `budget`. Counting stops as soon as either is exceeded.
    """
    if headers is None:
        headers = [(alias, i, None) for alias, array in sorted(inputs.items())
                   if array.dtype == object for i in range(array.size)]
        probe = True
    else:
        probe = False
    flat = {alias: array.reshape(-1) for alias, array in inputs.items()}
    total = images = 0
    known: Dict[int, int] = {}  # id of a repeated object -> its work
    for alias, i, info in headers:
        value = flat[alias][i]
        if not isinstance(value, bytes):
            continue
        images += 1
        if id(value) in known:
            total += known[id(value)]
        else:
            try:
                if probe:
                    info = probe_image(value)
                stop = budget - total if budget else 0
                work = check_work(value, info, max_work, stop_above=max(stop, 0))
            except ImageHeaderError as e:  # DecodeWorkError included
                raise invalid_argument(f"input {alias}[{i}]: {e}") from None
            known[id(value)] = work
            total += work
        if budget and total > budget:
            raise invalid_argument(
                f"the request's images need an estimated decode work of at least {total} "
                f"pixel-passes (counted up to input {alias}[{i}]), more than the server's "
                f"decode-work budget of {budget} (--decode-work-budget); send them in "
                f"several requests")
    return total, images


class _Ticket:
    __slots__ = ("work",)

    def __init__(self, work: int):
        self.work = work


class WorkScheduler:
    """Admits signature runs by their estimated decode work (see the module doc).

    Args:
      budget: pixel-passes that heavy requests in progress may hold
        together; 0: no admission (every request runs at once).
      light_work: requests with at most this much work never wait.
      lanes: heavy requests that may run at once; None: `default_lanes()`.
      max_waiting: heavy requests that may wait; more get RESOURCE_EXHAUSTED.
      clock: monotonic seconds (deadlines are on this clock).
    """

    def __init__(self, budget: int, light_work: int = 0, lanes: Optional[int] = None,
                 max_waiting: int = MAX_WAITING, clock: Callable[[], float] = time.monotonic):
        self.budget = max(int(budget), 0)
        self.light_work = max(int(light_work), 0)
        self.lanes = max(int(lanes if lanes is not None else default_lanes()), 1)
        self.max_waiting = max(int(max_waiting), 0)
        self.clock = clock
        self._cond = threading.Condition()
        self._queue: collections.deque = collections.deque()
        self._waiting_from: collections.Counter = collections.Counter()  # pool -> waiting
        self._held = 0
        self._running = 0
        self.peak_running = 0
        self.admitted = collections.Counter()  # "light", "heavy" -> requests admitted
        self.refused = collections.Counter()  # "busy", "deadline" -> requests refused

    @property
    def held(self) -> int:
        """Work held by heavy requests in progress."""
        with self._cond:
            return self._held

    @property
    def running(self) -> int:
        """Heavy requests in progress."""
        with self._cond:
            return self._running

    @property
    def waiting(self) -> int:
        """Heavy requests waiting for a lane or for budget."""
        with self._cond:
            return len(self._queue)

    def is_light(self, work: int) -> bool:
        """Whether a request of `work` pixel-passes runs without waiting."""
        return not self.budget or work <= self.light_work

    def check_deadline(self, deadline: Optional[float], what: str = "request") -> None:
        """DEADLINE_EXCEEDED when `deadline` (on `clock`) has passed."""
        if deadline is not None and self.clock() >= deadline:
            with self._cond:
                self.refused["deadline"] += 1
            raise deadline_exceeded(f"the deadline of {what} passed before it ran; nothing "
                                    f"was decoded")

    @contextmanager
    def admit(self, work: int, deadline: Optional[float] = None,
              what: str = "request") -> Iterator[None]:
        """Holds a lane and `work` of the budget for the `with` block (light: nothing).

        Args:
          work: the request's estimated decode work (`request_work`).
          deadline: `clock()` time after which the request must not start.
          what: the request in words, for messages.
        Raises:
          ServingError: INVALID_ARGUMENT over the whole budget; RESOURCE_EXHAUSTED
            when `max_waiting` requests already wait; DEADLINE_EXCEEDED when
            the deadline passes first.
        """
        work = max(int(work), 0)
        self.check_deadline(deadline, what)
        if self.budget and work > self.budget:
            raise invalid_argument(
                f"{what} needs an estimated decode work of {work} pixel-passes, more than the "
                f"server's decode-work budget of {self.budget} (--decode-work-budget); send "
                f"fewer images per request")
        if self.is_light(work):
            with self._cond:
                self.admitted["light"] += 1
            yield
            return
        ticket = self._enter(work, deadline, what)
        try:
            yield
        finally:
            with self._cond:
                self._held -= ticket.work
                self._running -= 1
                self._cond.notify_all()

    def _enter(self, work: int, deadline: Optional[float], what: str) -> _Ticket:
        ticket = _Ticket(work)
        pool, threads = getattr(_POOL, "name", ""), getattr(_POOL, "threads", 0)
        pool_cap = threads // 2 if threads else self.max_waiting
        with self._cond:
            if (self._queue or not self._fits_now(work)) and (
                    len(self._queue) >= self.max_waiting or self._waiting_from[pool] >= pool_cap):
                self.refused["busy"] += 1
                raise resource_exhausted(
                    f"server busy: {what} needs an estimated decode work of {work} "
                    f"pixel-passes, {self._running} expensive requests are decoding and "
                    f"{len(self._queue)} wait (--decode-work-budget); retry later")
            self._queue.append(ticket)
            self._waiting_from[pool] += 1
            try:
                while not (self._queue[0] is ticket and self._fits_now(work)):
                    timeout = None if deadline is None else deadline - self.clock()
                    if timeout is not None and timeout <= 0:
                        self.refused["deadline"] += 1
                        raise deadline_exceeded(
                            f"the deadline of {what} passed while it waited for decode "
                            f"capacity ({self._running} expensive requests decoding, "
                            f"{len(self._queue) - 1} others waiting); nothing was decoded")
                    self._cond.wait(timeout)
            except BaseException:
                self._queue.remove(ticket)
                self._waiting_from[pool] -= 1
                self._cond.notify_all()  # the next one may be at the head now
                raise
            self._queue.popleft()
            self._waiting_from[pool] -= 1
            self._held += work
            self._running += 1
            self.peak_running = max(self.peak_running, self._running)
            self.admitted["heavy"] += 1
            self._cond.notify_all()  # the next in line may fit too
        return ticket

    def _fits_now(self, work: int) -> bool:
        return self._running < self.lanes and self._held + work <= self.budget


def grpc_deadline(context) -> Optional[float]:
    """The RPC's deadline on `time.monotonic()`'s clock, or None when it has none.

    Args:
      context: a `grpc.ServicerContext`.
    Returns:
      The monotonic time at which the client stops waiting.
    """
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining
