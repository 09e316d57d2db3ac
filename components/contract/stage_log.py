"""The stages' progress lines: `[<Stage>] <text>` on stderr, flushed, one line at a time.

A stage logs through its context (`ctx.log(...)`, `pipeline.runner.StageContext`);
code that runs outside a stage context (the Trainer's child process) makes
the same logger with `logger(stage)`.
"""
from __future__ import annotations

import functools
import sys
from typing import Callable


def write(stage: str, line: str) -> None:
    """Prints `[stage] line` to stderr."""
    print(f"[{stage}] {line}", file=sys.stderr, flush=True)


def logger(stage: str) -> Callable[[str], None]:
    """`log(line)` for `stage`."""
    return functools.partial(write, stage)
