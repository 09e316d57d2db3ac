"""ExampleGen: reads a data source, validates every input, splits by image, writes TFRecords."""
from __future__ import annotations

import hashlib
import os
import sys
from typing import Iterator

from tqdm import tqdm

from components.contract import io_utils, schema
from components.contract.raw_example import RawExample
from components.example_gen.sources import get_source, has_boxes


def assign_split(image_id: str, seed: int, val_fraction: float, test_fraction: float) -> str:
    """Deterministic split by image id (never by caption)."""
    digest = hashlib.sha256(f"{seed}:{image_id}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2.0 ** 64
    if u < test_fraction:
        return "test"
    if u < test_fraction + val_fraction:
        return "val"
    return "train"


def _load_bytes(raw: RawExample) -> bytes:
    if raw.image_bytes is not None:
        return raw.image_bytes
    if not raw.image_path:
        raise ValueError("no image bytes and no image path")
    if not os.path.exists(raw.image_path):
        raise ValueError(f"missing file: {raw.image_path}")
    with open(raw.image_path, "rb") as f:
        return f.read()


def validate(raw: RawExample) -> tuple[bytes, str, int, int, list[str]]:
    """Returns (image bytes, format, height, width, captions) or raises ValueError(reason)."""
    if not raw.captions:
        raise ValueError("image without captions")
    captions = [c.strip() for c in raw.captions]
    if any(not c for c in captions):
        raise ValueError("empty caption")
    data = _load_bytes(raw)
    fmt, height, width = io_utils.inspect_image(data)
    return data, fmt, height, width, captions


def to_example(raw: RawExample, data: bytes, fmt: str, height: int, width: int,
               captions: list[str]):
    """The `tf.train.Example` of one accepted image (`schema.encode_example`)."""
    return schema.encode_example(raw.image_id, data, fmt, height, width, captions,
                                 raw.objects)


def write_examples(records: Iterator[RawExample], output_uri: str, data_config,
                   total: int | None = None) -> dict:
    """Validates, splits and writes examples; returns counts.

    Bad inputs go to `dead_letters.jsonl` with the reason, so that
    accepted + rejected = seen. An image id seen twice is rejected the second
    time (a duplicate would otherwise leak across splits).
    """
    import tensorflow as tf
    num_shards = max(1, data_config.num_shards)
    writers = {}
    for split in schema.SPLITS:
        os.makedirs(os.path.join(output_uri, split), exist_ok=True)
        writers[split] = [tf.io.TFRecordWriter(schema.shard_path(
            os.path.join(output_uri, split), schema.EXAMPLES_PREFIX, i, num_shards))
            for i in range(num_shards)]
    dead = io_utils.DeadLetters(os.path.join(output_uri, schema.DEAD_LETTERS_FILE))
    counts = {"seen": 0, "accepted": 0, "rejected": 0, **{s: 0 for s in schema.SPLITS}}
    seen_ids: set[str] = set()
    try:
        for raw in tqdm(records, total=total, desc="ExampleGen", unit="img",
                        file=sys.stderr, mininterval=1.0):
            if data_config.max_images and counts["accepted"] >= data_config.max_images:
                break
            counts["seen"] += 1
            try:
                if raw.image_id in seen_ids:
                    raise ValueError("duplicate image id")
                data, fmt, height, width, captions = validate(raw)
            except ValueError as e:
                counts["rejected"] += 1
                dead.add(raw.image_id, str(e), path=raw.image_path or "")
                continue
            seen_ids.add(raw.image_id)
            split = raw.split or assign_split(raw.image_id, data_config.seed,
                                              data_config.val_fraction, data_config.test_fraction)
            split = "train" if split == "restval" else split
            shard = counts[split] % num_shards
            writers[split][shard].write(
                to_example(raw, data, fmt, height, width, captions).SerializeToString())
            counts[split] += 1
            counts["accepted"] += 1
    finally:
        for ws in writers.values():
            for w in ws:
                w.close()
        dead.close()
    counts["dead_letter_reasons"] = dict(dead.reasons)
    return counts


def run(ctx) -> dict:
    """Reads `config.data.source`, writes the `Examples` artifact.

    Returns:
      `{"examples": {"counts": ..., "properties": ...}}`.
    """
    data_config = ctx.config.data
    source = get_source(data_config.source)
    records, total = source(data_config)
    counts = write_examples(records, ctx.outputs["examples"], data_config, total=total)
    print(f"[ExampleGen] seen {counts['seen']}, accepted {counts['accepted']}, "
          f"rejected {counts['rejected']} {counts['dead_letter_reasons'] or ''}; "
          f"train/val/test = {counts['train']}/{counts['val']}/{counts['test']}",
          file=sys.stderr)
    if counts["accepted"] == 0:
        raise RuntimeError("ExampleGen accepted no image: see "
                           f"{os.path.join(ctx.outputs['examples'], schema.DEAD_LETTERS_FILE)}")
    return {"examples": {"counts": counts,
                         "properties": {"source": data_config.source,
                                        "has_boxes": has_boxes(data_config.source,
                                                               data_config.instances_json),
                                        "splits": list(schema.SPLITS)}}}
