"""COCO captions JSON (`images[].id/file_name`, `annotations[].image_id/caption`) + image folder."""
from __future__ import annotations

import os
from collections import defaultdict

from components.contract.raw_example import RawExample
from components.example_gen.sources import json_stream


def read_coco(captions_json: str, images_dir: str):
    """Reads a COCO-style captions file.

    Args:
      captions_json: path to e.g. `captions_train2014.json`.
      images_dir: the folder the `file_name`s are relative to.
    Returns:
      (iterator of RawExample without a split, number of images).
    """
    if not captions_json or not os.path.exists(captions_json):
        raise FileNotFoundError(f"data.captions_json not found: {captions_json!r} "
                                "(set --set data.captions_json=PATH)")
    # Streamed: only the captions are held (by image id); the image entries
    # are read one at a time after them.
    captions = defaultdict(list)
    for ann in json_stream.iter_items(captions_json, "annotations.item"):
        captions[ann["image_id"]].append(str(ann.get("caption", "")))
    total = json_stream.count_items(captions_json, "images.item")

    def gen():
        for img in json_stream.iter_items(captions_json, "images.item"):
            yield RawExample(image_id=str(img["id"]),
                             image_path=os.path.join(images_dir, img["file_name"]),
                             captions=tuple(captions.get(img["id"], ())))
    return gen(), total
