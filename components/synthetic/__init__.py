"""The synthetic data: generators of images with captions and ground-truth boxes.

Shared by ExampleGen (its `synthetic` and `scenes` sources) and by the
Evaluator's grounding metric, which parses captions with the same grammars.

| module | holds |
|---|---|
| `shapes_grammar` | the "shapes" caption grammar: colours, shapes, sizes, relations, parsing |
| `shapes` | the "shapes" images: 1 to 3 shapes on black, deterministic by seed |
| `scenes_grammar` | the "scenes" grammar (counts, attributes, relations) on top of the shapes one |
| `scenes` | the "scenes" images |
"""
from __future__ import annotations


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
