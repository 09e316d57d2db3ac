"""Karpathy split JSON (`dataset_coco.json`, `dataset_flickr8k.json`, ...) + image folder."""
from __future__ import annotations

import os

from components.contract.raw_example import RawExample
from components.example_gen.sources import json_stream


def read_karpathy(split_json: str, images_dir: str):
    """Reads a Karpathy split file, keeping its splits (`restval` joins train).

    Args:
      split_json: path to `dataset_*.json` (`images[].filename/filepath/split/sentences[].raw`).
      images_dir: the image root; `filepath` (COCO) is joined in when present.
    Returns:
      (iterator of RawExample with `split` set, number of images).
    """
    if not split_json or not os.path.exists(split_json):
        raise FileNotFoundError(f"data.captions_json not found: {split_json!r} "
                                "(the Karpathy dataset_*.json; set --set data.captions_json=PATH)")
    total = json_stream.count_items(split_json, "images.item")

    def gen():
        # One image entry at a time: json.load of dataset_coco.json takes ~0.9 GiB.
        for img in json_stream.iter_items(split_json, "images.item"):
            rel = os.path.join(img.get("filepath", ""), img["filename"])
            split = img.get("split", "train")
            split = {"restval": "train", "validation": "val"}.get(split, split)
            image_id = str(img.get("cocoid", img.get("imgid", img["filename"])))
            yield RawExample(image_id=image_id, image_path=os.path.join(images_dir, rel),
                             captions=tuple(s.get("raw", " ".join(s.get("tokens", [])))
                                            for s in img.get("sentences", [])),
                             split=split)
    return gen(), total
