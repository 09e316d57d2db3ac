"""Compares two Preprocess executions record by record (tests and the Dask benchmark)."""
from __future__ import annotations

import glob
import json
import os

import numpy as np
import tensorflow as tf

from components.contract import schema


def records(annotations_uri: str) -> dict:
    """split -> image id -> AnnotationRecord."""
    out: dict = {}
    for split in schema.SPLITS:
        for path in sorted(glob.glob(os.path.join(annotations_uri, split, "*.tfrecord"))):
            for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
                record = schema.decode_annotations(raw)
                assert record.image_id not in out.setdefault(split, {}), record.image_id
                out[split][record.image_id] = record
    return out


def dead_letters(annotations_uri: str) -> list:
    """The dead-letter lines as sorted JSON strings."""
    path = os.path.join(annotations_uri, schema.DEAD_LETTERS_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return sorted(json.dumps(json.loads(line), sort_keys=True) for line in f if line.strip())


def leftovers(folder: str) -> list:
    """Temporary files or folders a sink left under `folder`."""
    return [os.path.relpath(os.path.join(d, n), folder)
            for d, dirs, files in os.walk(folder) for n in dirs + files
            if "beam-temp" in n or ".tmp" in n or n.startswith("tmp")]


def assert_same(a_uri: str, b_uri: str, vocab_a: str, vocab_b: str, atol: float = 0.0) -> int:
    """Asserts the same records, vocabulary and dead letters; returns the number of records.

    Args:
      a_uri, b_uri: the two Annotations folders.
      vocab_a, vocab_b: the two Vocabulary folders.
      atol: grid tolerance (0: bit for bit).
    """
    ra, rb = records(a_uri), records(b_uri)
    assert sorted(ra) == sorted(rb)
    n = 0
    for split in ra:
        assert sorted(ra[split]) == sorted(rb[split]), split
        for image_id, x in ra[split].items():
            y = rb[split][image_id]
            assert x.grid_shape == y.grid_shape
            if atol:
                np.testing.assert_allclose(x.grid.astype(np.float32), y.grid.astype(np.float32),
                                           atol=atol, err_msg=image_id)
            else:
                assert x.grid.tobytes() == y.grid.tobytes(), image_id
            assert [c.tolist() for c in x.captions] == [c.tolist() for c in y.captions]
            assert x.texts == y.texts and x.objects == y.objects
            n += 1
    for name in (schema.VOCAB_FILE, schema.COUNTS_FILE):
        with open(os.path.join(vocab_a, name)) as fa, open(os.path.join(vocab_b, name)) as fb:
            assert fa.read() == fb.read(), name
    assert dead_letters(a_uri) == dead_letters(b_uri)
    assert leftovers(a_uri) == [], leftovers(a_uri)
    assert leftovers(b_uri) == [], leftovers(b_uri)
    return n
