"""COCO instance annotations (`instances_*.json`): object boxes by category, per image.

COCO's instances files give each object a box `[x, y, width, height]` in
pixels of the image the file's `images[]` entry describes, and a
`category_id` that `categories[]` names. ExampleGen joins them to the
captions by image id (`data.instances_json`, for `data.source` coco and
karpathy, whose COCO entries carry the `cocoid`), so that the Evaluator can
measure attention grounding on the test split
(`components/evaluator/metrics/category_grounding.py`).
"""
from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field

from components.example_gen.sources import json_stream


@dataclass
class Instances:
    """The boxes of an instances file, and what was left out of it.

    Attributes:
      objects: image id (as a string) -> tuple of objects, each a dict with
        `bbox` (ymin, xmin, ymax, xmax normalized to [0, 1]) and `category`.
      skipped: reason -> count of annotations not kept (a box of no area or
        not four numbers, an image or category the file does not describe).
    """
    objects: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)

    def of(self, image_id: str) -> tuple:
        """The objects of one image (empty when it has none)."""
        return self.objects.get(str(image_id), ())


def read_instances(path: str) -> Instances:
    """Reads the boxes of a COCO `instances_*.json`, streamed (three passes over the file).

    Args:
      path: the instances file.
    Returns:
      `Instances`. Boxes are clipped to the image; one that has no area
      after clipping, or whose image or category the file does not
      describe, is skipped and counted by reason.
    Raises:
      FileNotFoundError: the file does not exist.
      ValueError: the file has no `categories` (not an instances file).
    """
    if not path or not os.path.exists(path):
        raise FileNotFoundError(f"data.instances_json not found: {path!r} (COCO's "
                                "instances_*.json; set --set data.instances_json=PATH, or "
                                "leave it empty for no grounding metrics)")
    names = {c["id"]: str(c["name"]) for c in json_stream.iter_items(path, "categories.item")}
    if not names:
        raise ValueError(f"{path} has no categories[]: is it an instances_*.json file "
                         "(not captions_*.json)?")
    sizes = {img["id"]: (float(img["width"]), float(img["height"]))
             for img in json_stream.iter_items(path, "images.item")}
    boxes = defaultdict(list)
    skipped: dict = defaultdict(int)
    for ann in json_stream.iter_items(path, "annotations.item"):
        size, name = sizes.get(ann.get("image_id")), names.get(ann.get("category_id"))
        if size is None or name is None:
            skipped["image or category not in the file"] += 1
            continue
        box = _normalized(ann.get("bbox"), *size)
        if box is None:
            skipped["box of no area"] += 1
            continue
        boxes[str(ann["image_id"])].append((name, box))
    objects = {image_id: tuple({"bbox": box, "category": name} for name, box in found)
               for image_id, found in boxes.items()}
    return Instances(objects=objects, skipped=dict(skipped))


def _normalized(bbox, width: float, height: float):
    """COCO's pixel `[x, y, w, h]` as (ymin, xmin, ymax, xmax) in [0, 1]; None if empty."""
    if not isinstance(bbox, (list, tuple)) or len(bbox) != 4 or not (width > 0 and height > 0):
        return None
    try:
        x, y, w, h = (float(v) for v in bbox)
    except (TypeError, ValueError):
        return None
    xmin, ymin = min(max(x / width, 0.0), 1.0), min(max(y / height, 0.0), 1.0)
    xmax, ymax = min(max((x + w) / width, 0.0), 1.0), min(max((y + h) / height, 0.0), 1.0)
    if not (xmax > xmin and ymax > ymin):
        return None
    return (ymin, xmin, ymax, xmax)
