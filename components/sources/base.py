"""The record every data source yields, before validation and splitting."""
from __future__ import annotations

from dataclasses import dataclass, field
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


def check_generator_args(min_objects: int, max_objects: int, most: int, image_size: int,
                         smallest: int, captions_per_image: int) -> None:
    """Raises ValueError for arguments a built-in synthetic generator cannot honour.

    Args:
      min_objects, max_objects: the requested objects per image.
      most: the generator's largest object count.
      image_size, smallest: the requested and the smallest image side.
      captions_per_image: the requested references per image.
    """
    if not 1 <= min_objects <= max_objects <= most:
        raise ValueError(f"need 1 <= min_objects <= max_objects <= {most}, got "
                         f"{min_objects}, {max_objects}")
    if image_size < smallest:
        raise ValueError(f"image_size must be >= {smallest}, got {image_size}")
    if captions_per_image < 1:
        raise ValueError("captions_per_image must be >= 1")
