"""Streaming reads of large caption JSON files (COCO, Karpathy): one item at a time.

`json.load` of COCO's Karpathy file (`dataset_coco.json`, 140 MB) holds every
image, sentence and token as Python objects: about 0.9 GiB, growing with the
dataset. These helpers parse incrementally with `ijson` (its C backend), so
a reader holds one item at a time.
"""
from __future__ import annotations

from typing import Any, Iterator


def iter_items(path: str, prefix: str) -> Iterator[Any]:
    """Yields the elements of the JSON array at `prefix` (e.g. `images.item`), one at a time.

    Args:
      path: the JSON file.
      prefix: an ijson prefix: `images.item` is every element of the top-level
        `images` array.
    Yields:
      Each element as plain Python values (numbers as int or float).
    """
    import ijson
    with open(path, "rb") as f:
        for item in ijson.items(f, prefix, use_float=True):
            yield item


def count_items(path: str, prefix: str) -> int:
    """The number of elements of the JSON array at `prefix` (one streaming pass)."""
    return sum(1 for _ in iter_items(path, prefix))
