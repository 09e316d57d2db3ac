"""Step timing: throughput and input wait, not counting the step that traces."""
from __future__ import annotations

import dataclasses
import time


@dataclasses.dataclass
class Timing:
    """Wall-clock accounting of one training run (this process).

    Attributes:
      started: when `train` began (for the artifact's `wall_seconds`).
      run_start: when the time not yet added to `TrainState.train_seconds` began.
      wait_seconds: time spent waiting for input batches.
      step_seconds: time of whole steps (input wait included).
      examples: examples trained in the timed steps.
      traced: the first step (which traces the `tf.function`) is done.
    """
    started: float = dataclasses.field(default_factory=time.time)
    run_start: float = dataclasses.field(default_factory=time.time)
    wait_seconds: float = 0.0
    step_seconds: float = 0.0
    examples: int = 0
    traced: bool = False

    def record(self, t0: float, t1: float, t2: float, batch_size: int) -> None:
        """One step: asked for its batch at `t0`, got it at `t1`, finished at `t2`."""
        if self.traced:  # the first call traces the step: not a throughput sample
            self.wait_seconds += t1 - t0
            self.step_seconds += t2 - t0
            self.examples += batch_size
        self.traced = True

    def throughput(self) -> float:
        """Examples per second of the timed steps (0 before any)."""
        return self.examples / self.step_seconds if self.step_seconds else 0.0

    def wait_fraction(self) -> float:
        """The share of step time spent waiting for input."""
        return self.wait_seconds / max(self.step_seconds, 1e-9)

    def lap(self) -> float:
        """Seconds since `run_start`, restarting it (for `TrainState.train_seconds`)."""
        now = time.time()
        seconds, self.run_start = now - self.run_start, now
        return seconds
