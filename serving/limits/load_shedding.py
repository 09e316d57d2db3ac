"""Load shedding by deadline: admit a request only while it can be answered in time.

Under overload a queue only turns requests that would have been refused
into requests answered too late: the open-loop load benchmark (load
at 1x-4x capacity, `benchmarks/serving_load.py`) queued about 10 s of work
for requests with 2 s deadlines, so from 1x capacity most answers came after
the client had given up, nothing was refused, and the server held a file
descriptor and a request body for every abandoned REST request.

So every place where a request waits estimates, from measured run times,
when it would be answered, and refuses it at once (RESOURCE_EXHAUSTED,
HTTP 429: retry later, elsewhere) unless that is within `DEADLINE_SHARE`
of the time left before its deadline:

- the batch queue (`serving/versions/batch_scheduler.py`): the batches ahead
  of the request over the batch threads, times the mean batch run time;
- the REST worker pool (`serving/server/rest.py`): the requests waiting for a
  thread over the threads, times the mean time a request holds a thread;
- gRPC requests never wait for a worker thread: beyond `--max-threads` in
  progress they are refused by gRPC itself (`maximum_concurrent_rpcs`).

A request's deadline is its gRPC deadline, or for REST its arrival plus
`--rest-timeout-ms` (TF Serving's `--rest_api_timeout_in_ms`). A request
that still waits when its deadline passes is dropped without running
(DEADLINE_EXCEEDED, HTTP 504), and so is a queued request whose client went
away (CANCELLED).
"""
from __future__ import annotations

import math
import threading
from typing import Optional

# A request is admitted while its expected answer time is at most this share
# of the time left before its deadline. The estimate is a mean: the rest is
# for the spread around it (a slower batch, threads waiting for the GIL, the
# client's own time to send and read), so that admitted requests are
# answered in time rather than just after.
DEADLINE_SHARE = 0.5


def fits(expected: Optional[float], left: float) -> bool:
    """Whether an answer expected in `expected` seconds (None: unknown) may be
    promised to a request with `left` seconds before its deadline."""
    return expected is None or expected <= DEADLINE_SHARE * left


class RunTimes:
    """How long one unit of work (a batch, a request on a thread) takes to run: an
    exponentially weighted mean of measured runs, so that it follows the load.

    Args:
      weight: the weight of the newest run (0 < weight <= 1).
    """

    def __init__(self, weight: float = 0.2):
        self.weight = weight
        self._mean: Optional[float] = None
        self.runs = 0
        self._lock = threading.Lock()

    @property
    def mean(self) -> Optional[float]:
        """The mean run time in seconds; None until a run was measured."""
        return self._mean

    def observe(self, seconds: float) -> None:
        """Adds one run's time (seconds)."""
        seconds = max(float(seconds), 0.0)
        with self._lock:
            self._mean = seconds if self._mean is None else (
                self._mean + self.weight * (seconds - self._mean))
            self.runs += 1


def expected_seconds(ahead: int, workers: int, mean: Optional[float]) -> Optional[float]:
    """When a unit of work queued now behind `ahead` others (those running included)
    is expected to be done, in seconds, with `workers` running units at once, each
    taking `mean` seconds; None when `mean` is unknown.

    The units ahead run in rounds of `workers`; the new one runs in the round
    after them: `(ceil((ahead + 1) / workers)) * mean`.
    """
    if mean is None:
        return None
    return math.ceil((max(ahead, 0) + 1) / max(workers, 1)) * mean
