"""Reading one split of an artifact a batch at a time: Annotations grids, Examples images.

The Evaluator streams the test split's image bytes (`iter_example_batches`);
analyses and benchmarks read the grids (`iter_annotation_batches`,
`read_annotations`).
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from components.contract import io_utils, schema


def iter_annotation_batches(uri: str, split: str, batch_size: int,
                            max_examples: int = 0) -> Iterator[dict]:
    """The records of one Annotations split, a batch at a time, in file order.

    Only one batch of grids is in memory at a time (as float32 for the decoder).

    Args:
      uri: the Annotations artifact folder.
      split: `train`, `val` or `test`.
      batch_size: records per batch (the last batch may be smaller).
      max_examples: stop after this many records (0 = all).
    Yields:
      Dicts with `ids`, `annotations` (float32 `(batch, L, D)`), `references`
      (per image, the reference texts), `objects` and `grid_shape` (`[H, W, D]`).
    """
    batch = {"ids": [], "annotations": [], "references": [], "objects": []}
    grid_shape, seen = None, 0

    def flush():
        out = {**batch, "annotations": np.stack(batch["annotations"]).astype(np.float32),
               "grid_shape": grid_shape}
        for key in batch:
            batch[key] = []
        return out

    for serialized in io_utils.read_records(schema.split_files(uri, split)):
        record = schema.decode_annotations(serialized)
        grid_shape = grid_shape or record.grid_shape
        batch["ids"].append(record.image_id)
        batch["annotations"].append(record.grid)
        batch["references"].append(record.texts)
        batch["objects"].append(record.objects)
        seen += 1
        if len(batch["ids"]) >= batch_size:
            yield flush()
        if max_examples and seen >= max_examples:
            break
    if batch["ids"]:
        yield flush()


def read_annotations(uri: str, split: str, max_examples: int = 0) -> dict:
    """Every record of one Annotations split, stacked and ordered by image id (for analyses).

    The Evaluator streams with `iter_annotation_batches` instead; this holds
    the whole split in memory.
    """
    parts = list(iter_annotation_batches(uri, split, 1024, max_examples))
    ids = [i for p in parts for i in p["ids"]]
    order = np.argsort(ids, kind="stable")  # shards interleave: make the order stable
    pick = lambda key: [x for p in parts for x in p[key]]  # noqa: E731
    grids = np.concatenate([p["annotations"] for p in parts]) if parts else None
    return {"ids": [ids[i] for i in order],
            "annotations": grids[order] if parts else None,
            "references": [pick("references")[i] for i in order],
            "objects": [pick("objects")[i] for i in order],
            "grid_shape": parts[0]["grid_shape"] if parts else None}


def read_images(examples_uri: str, split: str, wanted: set) -> dict:
    """Encoded image bytes for the wanted ids of one Examples split."""
    import tensorflow as tf
    found = {}
    for record in io_utils.read_records(schema.split_files(examples_uri, split)):
        image_id, image = schema.example_image(tf.train.Example.FromString(record).features.feature)
        if image_id in wanted:
            found[image_id] = image
            if len(found) == len(wanted):
                break
    return found


def iter_example_batches(uri: str, split: str, batch_size: int,
                         max_examples: int = 0) -> Iterator[dict]:
    """The records of one Examples split, a batch at a time, in file order.

    Args:
      uri: the Examples artifact folder.
      split: `train`, `val` or `test`.
      batch_size: records per batch (the last batch may be smaller).
      max_examples: stop after this many records (0 = all).
    Yields:
      Dicts with `ids`, `images` (encoded bytes), `references` (per image,
      the raw captions) and `objects` (per image, boxes and attributes).
    """
    import tensorflow as tf
    batch: dict = {"ids": [], "images": [], "references": [], "objects": []}
    seen = 0
    for serialized in io_utils.read_records(schema.split_files(uri, split)):
        feature = tf.train.Example.FromString(serialized).features.feature
        image_id, image = schema.example_image(feature)
        batch["ids"].append(image_id)
        batch["images"].append(image)
        batch["references"].append(schema.example_captions(feature))
        batch["objects"].append(schema.parse_objects(feature))
        seen += 1
        if len(batch["ids"]) >= batch_size:
            yield batch
            batch = {k: [] for k in batch}
        if max_examples and seen >= max_examples:
            break
    if batch["ids"]:
        yield batch
