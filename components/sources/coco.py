"""COCO captions JSON (`images[].id/file_name`, `annotations[].image_id/caption`) + image folder."""
from __future__ import annotations

import json
import os
from collections import defaultdict

from components.sources.base import RawExample


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
    with open(captions_json, encoding="utf-8") as f:
        data = json.load(f)
    captions = defaultdict(list)
    for ann in data.get("annotations", []):
        captions[ann["image_id"]].append(str(ann.get("caption", "")))
    images = data.get("images", [])

    def gen():
        for img in images:
            yield RawExample(image_id=str(img["id"]),
                             image_path=os.path.join(images_dir, img["file_name"]),
                             captions=tuple(captions.get(img["id"], ())))
    return gen(), len(images)
