"""Grounding on COCO-format data: `instances_*.json` boxes, read and scored.

A small fixture in COCO's formats (captions_*.json, instances_*.json and an
image folder) is written from the synthetic shapes, with each shape's box as
an instance of the category named by its shape word; the captions are the
shapes' own, so they name those categories.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from components.contract import schema
from components.contract.artifacts import Artifact
from components.contract.object_words import (
    COCO_CATEGORIES,
    mentions,
    name_table,
)
from components.evaluator.metrics.grounding import grounding_counts, grounding_metrics
from components.example_gen.sources import has_boxes
from components.example_gen.sources.instances import read_instances
from components.synthetic.shapes import generate
from pipeline import config as config_lib
from tests.components.test_bootstrap import _maps  # (T, 4, 4) maps peaking at given cells
from tests.test_e2e import _captioner

# ----------------------------------------------------------------------------- names


def test_mentions_take_the_longest_name_plurals_and_synonyms():
    words = "two men and a teddy bear near a dining table with hot dogs and a bear".split()
    found = [(c, words[s:e]) for c, s, e in mentions(words, name_table())]
    assert found == [("person", ["men"]), ("teddy bear", ["teddy", "bear"]),
                     ("dining table", ["dining", "table"]), ("hot dog", ["hot", "dogs"]),
                     ("bear", ["bear"])]
    assert [c for c, _, _ in mentions("a table with knives and a phone".split(),
                                      name_table())] == ["dining table", "knife", "cell phone"]
    assert [c for c, _, _ in mentions("a baseball player swings a bat at the ball".split(),
                                      name_table())] == ["person", "baseball bat", "sports ball"]
    assert len(COCO_CATEGORIES) == 80
    # a dataset's own categories are matched by name and plural
    assert mentions("three red circles".split(), name_table(("circle",))) == [("circle", 2, 3)]
    assert mentions("three red circles".split(), name_table()) == []


# ----------------------------------------------------------------------------- the metric


def _reference(words, attention, objects, widen=1.0):
    """Grounding by brute force: every mention, every step, every box (no shared code)."""
    h, w = attention.shape[1:]
    boxes = {}
    for o in objects:
        boxes.setdefault(o["category"], []).append(o["bbox"])

    def inside(t, box):
        row, col = divmod(int(np.argmax(attention[t])), w)
        cy, cx = (row + 0.5) / h, (col + 0.5) / w
        return (box[0] - widen / h <= cy <= box[2] + widen / h
                and box[1] - widen / w <= cx <= box[3] + widen / w)
    matched = grounded = noun = total = 0
    for category, start, end in mentions(words, name_table(tuple(sorted(boxes)))):
        total += 1
        if category in boxes:
            matched += 1
            grounded += any(inside(t, b) for t in range(start, end) for b in boxes[category])
            noun += any(inside(end - 1, b) for b in boxes[category])
    return total, matched, grounded, noun


def test_category_grounding_counts_matched_mentions_and_matches_a_reference():
    dog = {"bbox": (0.0, 0.0, 0.25, 0.25), "category": "dog"}
    table = {"bbox": (0.5, 0.5, 1.0, 1.0), "category": "dining table"}
    # "dog" looked at (0, 0): inside; "dining" at (3, 3) inside the table,
    # "table" at (0, 3): outside it; "cat": not in the image (unmatched)
    words = "a dog and a cat by a dining table".split()
    attention = _maps([(0, 0), (0, 0), (2, 2), (2, 2), (2, 2), (2, 2), (2, 2), (3, 3),
                        (0, 3)])
    m = grounding_metrics([words], [attention], [[dog, table]], widen_cells=0.0)
    assert (m["num_phrases"], m["num_matched_phrases"], m["num_grounded"],
            m["num_grounded_noun"]) == (3, 2, 2, 1)
    assert m["grounding"] == 1.0 and m["grounding_noun"] == 0.5
    # COCO annotations name no colour, size or relation: those stay unavailable
    assert m["attribute_accuracy"] is None and m["size_accuracy"] is None
    assert m["relation_accuracy"] is None
    # against the brute-force reference, on random maps
    rng = np.random.default_rng(0)
    captions, maps, objects = [], [], []
    vocabulary = "a dog two dogs man people table dining cup of tea sofa the couch".split()
    categories = ["dog", "person", "dining table", "cup", "couch"]
    for _ in range(40):
        words = list(rng.choice(vocabulary, size=int(rng.integers(3, 10))))
        captions.append(words)
        maps.append(rng.random((len(words) + 1, 5, 5)).astype(np.float32))
        objects.append([{"bbox": _box(rng),
                         "category": str(rng.choice(categories))}
                        for _ in range(int(rng.integers(1, 4)))])
    rows = grounding_counts(captions, maps, objects)
    from components.evaluator.metrics.grounding import COUNT_KEYS
    got = rows[:, [COUNT_KEYS.index(k) for k in ("num_phrases", "num_matched_phrases",
                                                 "num_grounded", "num_grounded_noun")]]
    expected = np.array([_reference(c, a, o) for c, a, o in zip(captions, maps, objects,
                                                                  strict=True)])
    np.testing.assert_array_equal(got, expected)
    assert expected[:, 1].sum() > 10 and 0 < expected[:, 2].sum() < expected[:, 1].sum()


def _box(rng):
    y = sorted(rng.random(2))
    x = sorted(rng.random(2))
    return (float(y[0]), float(x[0]), float(y[1]), float(x[1]))


# ----------------------------------------------------------------------------- the reader


def test_instances_are_normalized_clipped_and_bad_boxes_counted(tmp_path):
    path = tmp_path / "instances_tiny.json"
    path.write_text(json.dumps({
        "images": [{"id": 7, "width": 200, "height": 100, "file_name": "a.jpg"}],
        "annotations": [
            {"id": 1, "image_id": 7, "category_id": 18, "bbox": [20, 10, 100, 50], "iscrowd": 0},
            {"id": 2, "image_id": 7, "category_id": 1, "bbox": [150, 50, 100, 80], "iscrowd": 1},
            {"id": 3, "image_id": 7, "category_id": 1, "bbox": [10, 10, 0, 5]},
            {"id": 4, "image_id": 7, "category_id": 99, "bbox": [0, 0, 5, 5]},
            {"id": 5, "image_id": 8, "category_id": 1, "bbox": [0, 0, 5, 5]},
            {"id": 6, "image_id": 7, "category_id": 1, "bbox": ["x", 0, 5, 5]}],
        "categories": [{"id": 1, "name": "person"}, {"id": 18, "name": "dog"}]}))
    inst = read_instances(str(path))
    assert inst.of("7") == ({"bbox": (0.1, 0.1, 0.6, 0.6), "category": "dog"},
                           {"bbox": (0.5, 0.75, 1.0, 1.0), "category": "person"})
    assert inst.of("8") == ()
    assert inst.skipped == {"box of no area": 2, "image or category not in the file": 2}
    captions = tmp_path / "captions_tiny.json"
    captions.write_text(json.dumps({"images": [], "annotations": []}))
    with pytest.raises(ValueError, match="no categories"):
        read_instances(str(captions))
    with pytest.raises(FileNotFoundError, match="data.instances_json"):
        read_instances(str(tmp_path / "missing.json"))


def test_instances_json_is_checked_against_the_source():
    assert has_boxes("coco", "instances.json") and has_boxes("karpathy", "i.json")
    assert not has_boxes("coco") and not has_boxes("tfds", "i.json")
    with pytest.raises(config_lib.ConfigError, match="data.instances_json is read for"):
        config_lib.load_config("tiny", ["data.instances_json=/x.json"])
    # grounding may be a threshold on COCO data with instances; attribute accuracy may not
    config_lib.load_config("tiny", ["data.source=coco", "data.instances_json=/x.json",
                                       'eval.thresholds={"grounding": 0.3}'])
    with pytest.raises(config_lib.ConfigError, match="attribute_accuracy is computed only"):
        config_lib.load_config("tiny", ["data.source=coco", "data.instances_json=/x.json",
                                           'eval.thresholds={"attribute_accuracy": 0.3}'])
    with pytest.raises(config_lib.ConfigError, match="with data.instances_json"):
        config_lib.load_config("tiny", ["data.source=coco",
                                           'eval.thresholds={"grounding": 0.3}'])


# ----------------------------------------------------------------------------- end to end


def write_coco_with_instances(folder: str, num_images: int, seed: int = 3) -> dict:
    """The shapes as COCO's captions_*.json, instances_*.json and an image folder."""
    images_dir = os.path.join(folder, "images")
    os.makedirs(images_dir)
    shapes = sorted({"circle", "square", "triangle", "cross", "diamond", "star", "heart",
                     "ring", "pentagon", "hexagon"})
    categories = [{"id": i + 1, "name": s} for i, s in enumerate(shapes)]
    images, captions, instances = [], [], []
    for i, raw in enumerate(generate(num_images, image_size=32, seed=seed)):
        image_id, size = 900 + i, 32
        name = f"{image_id}.png"
        with open(os.path.join(images_dir, name), "wb") as f:
            f.write(raw.image_bytes)
        images.append({"id": image_id, "file_name": name, "width": size, "height": size})
        captions += [{"id": len(captions), "image_id": image_id, "caption": c}
                     for c in raw.captions]
        for o in raw.objects:
            ymin, xmin, ymax, xmax = o["bbox"]
            category = next(c["id"] for c in categories if c["name"] == o["shape"])
            instances.append({"id": len(instances), "image_id": image_id,
                              "category_id": category, "iscrowd": 0,
                              "bbox": [xmin * size, ymin * size, (xmax - xmin) * size,
                                       (ymax - ymin) * size]})
    paths = {"captions_json": os.path.join(folder, "captions_tiny.json"),
             "instances_json": os.path.join(folder, "instances_tiny.json"),
             "images_dir": images_dir}
    with open(paths["captions_json"], "w") as f:
        json.dump({"images": images, "annotations": captions}, f)
    with open(paths["instances_json"], "w") as f:
        json.dump({"images": images, "annotations": instances, "categories": categories}, f)
    return paths


@pytest.mark.e2e
@pytest.mark.slow
def test_a_coco_run_with_instances_reports_grounding(tmp_path):
    # 240 images (36 test images): with 160, one host's model named only 9 objects.
    data = write_coco_with_instances(str(tmp_path / "coco"), num_images=240)
    root = str(tmp_path / "root")
    _captioner("run", "--config", "tiny", "--root", root, "--stages",
               "ExampleGen,EncoderTrainer,Preprocess,Trainer,Exporter,Evaluator",
               "--set", "data.source=coco", "--set", f"data.captions_json={data['captions_json']}",
               "--set", f"data.images_dir={data['images_dir']}",
               "--set", f"data.instances_json={data['instances_json']}",
               "--set", "train.epochs=60", "--set", "train.learning_rate=0.01")
    with open(os.path.join(root, "run_summary.json")) as f:
        stages = json.load(f)["stages"]
    examples = Artifact.load(stages["ExampleGen"]["outputs"]["examples"])
    assert examples.properties["has_boxes"] is True
    import tensorflow as tf
    categories = {}
    for record in tf.data.TFRecordDataset(schema.split_files(examples.uri, "test")):
        feature = tf.train.Example.FromString(record.numpy()).features.feature
        objects = schema.parse_objects(feature)
        assert objects and all(set(o) == {"bbox", "category"} for o in objects)
        categories[feature[schema.IMAGE_ID].bytes_list.value[0].decode()] = {
            o["category"] for o in objects}
    evaluation = Artifact.load(stages["Evaluator"]["outputs"]["evaluation"])
    metrics = evaluation.properties["metrics"]
    # the mentions the Evaluator counted are those of the captions it wrote
    with open(os.path.join(evaluation.uri, "captions.jsonl")) as f:
        captioned = [json.loads(line) for line in f]
    found = [(c, categories[row["image_id"]]) for row in captioned
             for c, _, _ in mentions(row["caption"].split(),
                                     name_table(tuple(sorted(categories[row["image_id"]]))))]
    assert metrics["num_phrases"] == len(found)
    assert metrics["num_matched_phrases"] == sum(c in named for c, named in found) > 10
    assert 0.0 <= metrics["grounding"] <= 1.0 and 0.0 <= metrics["grounding_noun"] <= 1.0
    assert metrics.get("attribute_accuracy") is None and metrics.get("size_accuracy") is None
