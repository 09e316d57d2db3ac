"""The Trainer hands a finished input iterator's teardown to a daemon thread."""
from __future__ import annotations

import threading

from components.trainer.loop import release_in_background


class _SlowTeardown:
    """Stands in for a tf.data iterator whose teardown blocks until `proceed` is set."""

    def __init__(self, proceed: threading.Event, log: list):
        self.proceed, self.log = proceed, log

    def __del__(self):
        self.log.append(("start", threading.current_thread().name))
        self.proceed.wait(timeout=30)
        self.log.append(("end", threading.current_thread().name))


def test_the_teardown_runs_on_its_own_thread_and_the_caller_goes_on():
    proceed, log, done = threading.Event(), [], threading.Event()
    release_in_background(_SlowTeardown(proceed, log))
    # The caller is back while the teardown is still blocked on its thread.
    assert not proceed.is_set()
    for _ in range(300):
        if log:
            break
        done.wait(0.01)
    assert log == [("start", "release-input-iterator")]
    proceed.set()
    [thread] = [t for t in threading.enumerate() if t.name == "release-input-iterator"] or [None]
    if thread is not None:
        thread.join(timeout=30)
    assert log == [("start", "release-input-iterator"), ("end", "release-input-iterator")]


def test_nothing_to_release():
    before = threading.active_count()
    release_in_background(None)
    assert threading.active_count() == before
