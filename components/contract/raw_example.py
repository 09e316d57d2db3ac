"""The record every data source yields to ExampleGen, before validation and splitting."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class RawExample:
    """One image with its reference captions, as read from a source.

    Exactly one of `image_bytes` / `image_path` is normally set; ExampleGen
    reads the path, validates the bytes and rejects bad inputs with a reason.
    `objects` holds ground-truth boxes where the source has them (synthetic):
    dicts with `bbox` (ymin, xmin, ymax, xmax normalized), `color`, `shape`,
    `size`. `split` is the source's own split, if it has one.
    """
    image_id: str
    image_bytes: Optional[bytes] = None
    image_path: Optional[str] = None
    captions: tuple = ()
    objects: tuple = ()
    split: Optional[str] = None

