"""Dynamic batching parameters, with TF Serving's names and meaning.

`tensorflow-serving-api` does not ship the `BatchingParameters` proto, so
the `--batching_parameters_file` text format is read with a small parser:

    max_batch_size { value: 32 }
    batch_timeout_micros { value: 2000 }
    num_batch_threads { value: 2 }
    max_enqueued_batches { value: 10 }
    allowed_batch_sizes: 8
    allowed_batch_sizes: 32
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class BatchingParameters:
    """How concurrent requests are merged (TF Serving's BatchingParameters).

    Attributes:
      max_batch_size: most rows (dim 0) in one run of the signature.
      batch_timeout_micros: how long the first request of a batch waits for
        others before the batch runs anyway.
      num_batch_threads: batches that may run at the same time, per
        (model, version, signature).
      max_enqueued_batches: queue bound, in batches; beyond it requests fail
        fast with UNAVAILABLE instead of queueing without limit. 10, as TF
        Serving's batch scheduler (`BasicBatchScheduler`): at 100, the queue
        held about 10 s of work at the load benchmark's capacity (docs/RELIABILITY.md).
      allowed_batch_sizes: when set, a batch is padded (repeating its last
        row) up to the next allowed size, so the model sees few shapes; the
        last entry must equal `max_batch_size`.
    """
    max_batch_size: int = 32
    batch_timeout_micros: int = 2000
    num_batch_threads: int = max(2, os.cpu_count() or 2)
    max_enqueued_batches: int = 10
    allowed_batch_sizes: Tuple[int, ...] = ()

    def __post_init__(self):
        if self.max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if self.batch_timeout_micros < 0:
            raise ValueError("batch_timeout_micros must be >= 0")
        if self.num_batch_threads < 1:
            raise ValueError("num_batch_threads must be >= 1")
        if self.max_enqueued_batches < 1:
            raise ValueError("max_enqueued_batches must be >= 1")
        sizes = tuple(self.allowed_batch_sizes)
        if sizes:
            if list(sizes) != sorted(set(sizes)) or sizes[0] < 1:
                raise ValueError("allowed_batch_sizes must be increasing positive integers")
            if sizes[-1] != self.max_batch_size:
                raise ValueError("the last allowed_batch_sizes entry must equal max_batch_size")
        object.__setattr__(self, "allowed_batch_sizes", sizes)

    @classmethod
    def from_text(cls, text: str) -> "BatchingParameters":
        """Parses TF Serving's batching parameters text format (unknown keys ignored)."""
        values = {}
        for key, value in re.findall(r"(\w+)\s*\{\s*value\s*:\s*([0-9]+)\s*\}", text):
            values[key] = int(value)
        sizes = tuple(int(v) for v in re.findall(r"allowed_batch_sizes\s*:\s*([0-9]+)", text))
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in values.items() if k in fields}
        if sizes:
            kwargs["allowed_batch_sizes"] = sizes
        return cls(**kwargs)

    @classmethod
    def from_file(cls, path: str) -> "BatchingParameters":
        """Reads a `batching_parameters.txt` file."""
        with open(path, encoding="utf-8") as f:
            return cls.from_text(f.read())

    def to_text(self) -> str:
        """The TF Serving text format of these parameters."""
        lines = [f"max_batch_size {{ value: {self.max_batch_size} }}",
                 f"batch_timeout_micros {{ value: {self.batch_timeout_micros} }}",
                 f"num_batch_threads {{ value: {self.num_batch_threads} }}",
                 f"max_enqueued_batches {{ value: {self.max_enqueued_batches} }}"]
        lines += [f"allowed_batch_sizes: {s}" for s in self.allowed_batch_sizes]
        return "\n".join(lines) + "\n"
