"""Trainer test helpers: tiny Annotations/Vocabulary artifacts and a pipeline process.

`python tests/components/trainer_worker.py --root R --config-json C --source S`
runs the real `pipeline.runner.Runner` over two stages: a stand-in
Preprocess that copies the prebuilt artifacts from `S` (no TensorFlow, so the
Trainer finds TensorFlow not yet started, as after cached upstream stages)
and the real Trainer. It prints the run summary as one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from components.contract.artifacts import Artifact, write_artifact_json  # noqa: E402
from pipeline.dag import StageSpec  # noqa: E402

GRID = (3, 3, 8)
COLORS = ("red", "green", "blue", "yellow")
SHAPES = ("square", "circle", "triangle")
SIZES = ("small", "big")
WORDS = ("a", "red", "green", "blue", "yellow", "square", "circle", "triangle", "there", "is",
         "one", "small", "big", "the")
SOURCE_ENV = "TRAINER_TEST_SOURCE"


def _captions(i: int) -> list[str]:
    color, shape, size = COLORS[i % 4], SHAPES[(i // 4) % 3], SIZES[i % 2]
    return [f"a {size} {color} {shape}", f"there is one {color} {shape}",
            f"the {shape} is {color}"]


def _grid(i: int, rng) -> np.ndarray:
    """(9, 8) features: noise, and the object's colour/shape/size at one region."""
    grid = rng.normal(0.0, 0.3, size=(GRID[0] * GRID[1], GRID[2]))
    region = i % 9
    grid[region, i % 4] += 2.0
    grid[region, 4 + (i // 4) % 3] += 2.0
    grid[region, 7] += 2.0 * (i % 2)
    return grid.astype(np.float16)


def _object(i: int) -> dict:
    """Image i's one object: its box covers grid cell `i % 9` (inset), its attributes the captions'."""
    row, col = divmod(i % 9, GRID[1])
    h, w = 1.0 / GRID[0], 1.0 / GRID[1]
    size = "large" if SIZES[i % 2] == "big" else "small"
    return {"bbox": (row * h + 0.05, col * w + 0.05, (row + 1) * h - 0.05, (col + 1) * w - 0.05),
            "color": COLORS[i % 4], "shape": SHAPES[(i // 4) % 3], "size": size}


def write_tiny_artifacts(root: str, num_train: int = 32, num_val: int = 8,
                         seed: int = 0, objects: bool = False) -> tuple[str, str]:
    """Published Annotations (train in 2 shards, val in 1) and Vocabulary artifacts.

    With `objects`, each record also carries its object's box and attributes
    (`_object`), as Preprocess copies them from synthetic Examples.

    Returns:
      `(annotations_uri, vocabulary_uri)`.
    """
    import tensorflow as tf

    from components.contract import schema
    from models import text
    vocab = list(text.RESERVED) + list(WORDS)
    word_to_id = {w: i for i, w in enumerate(vocab)}
    annotations = os.path.join(root, "annotations")
    vocabulary = os.path.join(root, "vocabulary")
    rng = np.random.default_rng(seed)
    counts = {}
    for split, n, shards, offset in (("train", num_train, 2, 0), ("val", num_val, 1, 1000)):
        os.makedirs(os.path.join(annotations, split), exist_ok=True)
        writers = [tf.io.TFRecordWriter(schema.shard_path(
            os.path.join(annotations, split), "annotations", k, shards)) for k in range(shards)]
        for j in range(n):
            i = offset + j
            caps = _captions(i)
            ids = [text.encode(text.normalize(c), word_to_id) for c in caps]
            boxes = (tf.train.Features(feature=schema.object_features([_object(i)]))
                     .SerializeToString() if objects else b"")
            ex = schema.encode_annotations(
                f"img-{i}", _grid(i, rng).reshape(GRID), [t for c in ids for t in c],
                [len(c) for c in ids], caps, boxes)
            writers[j % shards].write(ex.SerializeToString())
        for w in writers:
            w.close()
        counts[split] = n
    write_artifact_json(Artifact(type="Annotations", uri=annotations, producer="Preprocess",
                                 execution_id=1, fingerprint="tiny-annotations", inputs={},
                                 counts=counts,
                                 properties={"grid_shape": list(GRID), "num_records": counts}),
                        config={})
    os.makedirs(vocabulary, exist_ok=True)
    with open(os.path.join(vocabulary, schema.VOCAB_FILE), "w") as f:
        f.write(schema.vocabulary_text(vocab))
    write_artifact_json(Artifact(type="Vocabulary", uri=vocabulary, producer="Preprocess",
                                 execution_id=1, fingerprint="tiny-vocabulary", inputs={},
                                 counts={"vocab_size": len(vocab)},
                                 properties={"size": len(vocab)}), config={})
    return annotations, vocabulary


def run(ctx) -> dict:
    """Stand-in Preprocess stage: copies the artifacts from `$TRAINER_TEST_SOURCE`."""
    source = os.environ[SOURCE_ENV]
    results = {}
    for name in ("annotations", "vocabulary"):
        art = Artifact.load(os.path.join(source, name))
        shutil.copytree(art.uri, ctx.outputs[name], dirs_exist_ok=True)
        os.remove(os.path.join(ctx.outputs[name], "artifact.json"))
        results[name] = {"counts": dict(art.counts), "properties": dict(art.properties)}
    return results


FAKE_PREPROCESS = StageSpec("Preprocess", "tests.components.trainer_worker",
                            outputs={"annotations": "Annotations", "vocabulary": "Vocabulary"},
                            config_sections=("data",))


def main(argv=None) -> int:
    from pipeline import config as config_lib
    from pipeline import dag
    from pipeline.runner import Runner
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--config-json", required=True)
    p.add_argument("--source", required=True)
    args = p.parse_args(argv)
    os.environ[SOURCE_ENV] = args.source
    with open(args.config_json) as f:
        config = config_lib.from_dict(json.load(f))
    summary = Runner(config, args.root, stages=[FAKE_PREPROCESS, dag.stage("Trainer")]).run()
    print(json.dumps(summary, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
