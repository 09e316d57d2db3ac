"""The record schema: codecs round-trip, one vocabulary rule, the model-file and dead-letter rules."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from components.contract import io_utils, schema
from models import text

GRID = (2, 3, 4)
OBJECTS = [{"bbox": (0.0, 0.25, 0.5, 0.75), "color": "red", "shape": "square", "size": "big"},
           {"bbox": (0.5, 0.5, 1.0, 1.0), "color": "blue", "shape": "circle", "size": "small"}]


def _annotations_record(objects=()):
    grid = np.arange(np.prod(GRID), dtype=np.float32).reshape(GRID) / 8.0
    captions = [[1, 5, 6, 2], [1, 7, 2]]
    extra = tf.train.Features(feature=schema.object_features(objects)).SerializeToString()
    example = schema.encode_annotations(
        "img-1", grid, [t for c in captions for t in c], [len(c) for c in captions],
        ["A red square.", "a square"], extra if objects else b"")
    return grid, captions, example.SerializeToString()


def test_annotations_tf_parser_and_numpy_decoder_agree_with_the_encoder():
    grid, captions, serialized = _annotations_record(OBJECTS)
    parsed = schema.parse_annotations(tf.constant(serialized), GRID)
    decoded = schema.decode_annotations(serialized)
    h, w, d = GRID
    np.testing.assert_array_equal(parsed["annotations"].numpy().astype(np.float32),
                                  grid.reshape(h * w, d))
    assert parsed["annotations"].dtype == tf.float16
    assert parsed["tokens"].numpy().tolist() == [t for c in captions for t in c]
    assert parsed["lengths"].numpy().tolist() == [4, 3]
    assert decoded.image_id == "img-1" and decoded.grid_shape == list(GRID)
    np.testing.assert_array_equal(decoded.grid, grid.reshape(h * w, d))
    assert [c.tolist() for c in decoded.captions] == captions
    assert decoded.texts == ["A red square.", "a square"]
    assert decoded.objects == OBJECTS


def test_annotations_without_objects_decode_to_no_objects():
    _, _, serialized = _annotations_record()
    assert schema.decode_annotations(serialized).objects == []


def test_example_codec():
    example = schema.encode_example("a/1", b"\x89PNG", "png", 16, 8, ["one", "two"], OBJECTS)
    f = tf.train.Example.FromString(example.SerializeToString()).features.feature
    assert schema.example_image(f) == ("a/1", b"\x89PNG")
    assert schema.example_captions(f) == ["one", "two"]
    assert schema.parse_objects(f) == OBJECTS
    assert f[schema.IMAGE_HEIGHT].int64_list.value == [16]
    empty = tf.train.Example().features.feature
    assert schema.example_image(empty) == ("", b"") and schema.example_captions(empty) == []


def test_grid_shape_from_properties_or_the_first_record(tmp_path):
    _, _, serialized = _annotations_record()
    os.makedirs(tmp_path / "train")
    path = schema.shard_path(str(tmp_path / "train"), schema.ANNOTATIONS_PREFIX, 0, 1)
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(serialized)
    assert schema.split_files(str(tmp_path), "train") == [path]
    assert schema.split_files(str(tmp_path), "val") == []
    assert schema.annotations_grid_shape(str(tmp_path)) == list(GRID)
    assert schema.annotations_grid_shape(str(tmp_path), {"grid_shape": [7, 7, 9]}) == [7, 7, 9]
    with pytest.raises(RuntimeError, match="no train records"):
        schema.annotations_grid_shape(str(tmp_path / "missing"))


def test_vocabulary_ids_are_line_numbers_and_blank_lines_are_rejected(tmp_path):
    tokens = list(text.RESERVED) + ["red", "square"]
    (tmp_path / schema.VOCAB_FILE).write_text(schema.vocabulary_text(tokens))
    assert schema.read_vocabulary(str(tmp_path)) == tokens
    assert schema.vocabulary_size(str(tmp_path)) == 6
    assert schema.vocabulary_size(str(tmp_path), {"size": 9}) == 9
    # A blank line would shift every later id: an error, never skipped.
    (tmp_path / schema.VOCAB_FILE).write_text("<pad>\n\nred\n")
    with pytest.raises(ValueError, match="line 2 is blank"):
        schema.read_vocabulary(str(tmp_path))


def test_token_ids_decode_to_words():
    vocab = list(text.RESERVED) + ["red", "square"]
    assert text.decode_words([1, 4, 0, 5, 9, 2, 4], vocab) == ["red", "square", "<unk>"]
    assert text.decode([1, 4, 5, 2], vocab) == "red square"


def test_model_file_prefers_the_best_model(tmp_path):
    assert schema.model_file(str(tmp_path)) == str(tmp_path / schema.MODEL_FILE)
    (tmp_path / schema.BEST_MODEL_FILE).write_bytes(b"")
    assert schema.model_file(str(tmp_path)) == str(tmp_path / schema.BEST_MODEL_FILE)


def test_dead_letters_have_one_shape(tmp_path):
    path = str(tmp_path / schema.DEAD_LETTERS_FILE)
    letters = io_utils.DeadLetters(path)
    letters.add("x", "empty image file", path="/data/x.png")
    letters.add("y", "undecodable image: bad", split="val")
    letters.close()
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    fields = [name for name, _ in schema.DEAD_LETTER_FIELDS]
    assert [list(r) for r in rows] == [fields, fields]
    assert rows[0] == {"id": "x", "reason": "empty image file", "split": "", "path": "/data/x.png"}
    assert json.loads(schema.dead_letter_line(schema.dead_letter("y", "r", "val"))) == {
        "id": "y", "reason": "r", "split": "val", "path": ""}
    assert letters.reasons == {"empty image file": 1, "undecodable image": 1}
