"""Admission control: what a request may make the server allocate, bounded before it runs.

A few bytes of request can ask for gigabytes: TensorProto's padding rule
repeats one string to fill any shape, a small PNG header can claim 10^10
pixels, a GIF frame can be larger than its screen, and a JSON body becomes
many times its size in Python objects. Every request's memory is estimated
from what is known before anything is decoded (image headers, tensor
shapes, the body's length) and reserved from one server-wide budget; a
request that does not fit while others hold the budget gets
RESOURCE_EXHAUSTED (HTTP 429), as TF Serving answers when its queues are
full. A request that could never fit (over a per-request limit, or over
the whole budget alone) is INVALID_ARGUMENT: retrying cannot help.

The estimates are upper bounds measured on TF 2.21's CPU decoders
(docs/RELIABILITY.md, "Memory"):

- an image: `DECODE_BYTES_PER_PIXEL` per pixel the decoder allocates (all
  frames; decoded uint8, the float32 copy and the resize), plus twice its
  encoded size (the request's copy and the tensor's), plus
  `BYTES_PER_IMAGE` of per-image overhead (strings, `map_fn` slots, outputs);
- a numeric input: twice its array size;
- a REST body: `JSON_BYTES_PER_BODY_BYTE` per byte while it is parsed and
  converted (measured: a body of `[],` or `{},` becomes 26 times its size
  in Python objects, floats 11 times).

After a request whose reservation was large, free heap pages go back to
the system (`malloc_trim` on glibc), so a burst does not leave the process
at its peak.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
from contextlib import contextmanager
from typing import Iterator, Optional

import grpc

from serving.errors import ServingError, invalid_argument

log = logging.getLogger(__name__)

DECODE_BYTES_PER_PIXEL = 20
BYTES_PER_IMAGE = 32 * 1024
JSON_BYTES_PER_BODY_BYTE = 32
# Reservations at least this large give memory back when released.
TRIM_AFTER_BYTES = 64 << 20


def resource_exhausted(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


def image_cost(pixels: int, encoded_bytes: int) -> int:
    """Estimated peak bytes of decoding one image of `pixels` (all frames)."""
    return pixels * DECODE_BYTES_PER_PIXEL + 2 * encoded_bytes + BYTES_PER_IMAGE


class DecodeBudget:
    """A server-wide budget of bytes that requests in progress may hold together.

    Args:
      budget_bytes: the budget; 0 or less: no budget (reservations always
        succeed, and only the trimming happens).
    """

    def __init__(self, budget_bytes: int):
        self.budget = budget_bytes if budget_bytes > 0 else 0
        self._held = 0
        self._peak = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """Bytes reserved by requests in progress."""
        with self._lock:
            return self._held

    @property
    def peak(self) -> int:
        """The most bytes ever reserved at once."""
        with self._lock:
            return self._peak

    @contextmanager
    def reserve(self, cost: int, what: str = "request") -> Iterator[None]:
        """Holds `cost` bytes of the budget for the `with` block.

        Raises:
          ServingError: INVALID_ARGUMENT when `cost` alone exceeds the budget,
            RESOURCE_EXHAUSTED when it does not fit next to the requests in
            progress.
        """
        cost = max(int(cost), 0)
        if self.budget and cost > self.budget:
            raise invalid_argument(
                f"{what} would need about {_mb(cost)} of memory to decode, more than the "
                f"server's whole decode-memory budget of {_mb(self.budget)} "
                f"(--decode-memory-budget-mb); send fewer or smaller images")
        with self._lock:
            if self.budget and self._held + cost > self.budget:
                held = self._held
                raise resource_exhausted(
                    f"server busy: {what} needs about {_mb(cost)} of decode memory and "
                    f"requests in progress hold {_mb(held)} of the {_mb(self.budget)} budget "
                    f"(--decode-memory-budget-mb); retry later")
            self._held += cost
            self._peak = max(self._peak, self._held)
        try:
            yield
        finally:
            with self._lock:
                self._held -= cost
            if cost >= TRIM_AFTER_BYTES:
                release_free_memory()


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


_libc: Optional[ctypes.CDLL] = None
_libc_checked = False


def release_free_memory() -> bool:
    """Returns free heap pages to the system (glibc `malloc_trim(0)`).

    Returns:
      True when the allocator supports it (glibc), False elsewhere.
    """
    global _libc, _libc_checked
    if not _libc_checked:
        _libc_checked = True
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            libc.malloc_trim.argtypes = [ctypes.c_size_t]
            libc.malloc_trim.restype = ctypes.c_int
            _libc = libc
        except (OSError, AttributeError):  # not glibc (musl, macOS)
            _libc = None
    if _libc is None:
        return False
    _libc.malloc_trim(0)
    return True
