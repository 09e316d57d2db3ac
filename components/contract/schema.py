"""The record and artifact schema that stages share: keys, file names and codecs.

Stages meet only through artifacts; this module is the one place that says
what is in them (as the TFX taxi template's `features.py` does for its
features). It owns:

- the feature keys of `Examples` and `Annotations` records and what each holds
  (`EXAMPLE_FEATURES`, `ANNOTATION_FEATURES`; docs/ARTIFACTS.md is generated
  from them by `make docs`);
- the codecs: `encode_example`, `encode_annotations`, the TensorFlow parser
  `parse_annotations` (tf.data) and the NumPy decoder `decode_annotations`;
- the Vocabulary file rule (`read_vocabulary`), the Model file rule
  (`model_file`), where an artifact's split shards are (`split_files`), and
  the dead-letter record (`dead_letter`).

TensorFlow is imported inside the functions that need it, so that reading
the keys and file names costs nothing.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Mapping, Sequence

import numpy as np

SPLITS = ("train", "val", "test")

# ----------------------------------------------------------------------------- file names

EXAMPLES_PREFIX = "examples"          # <examples>/<split>/examples-SSSSS-of-NNNNN.tfrecord
ANNOTATIONS_PREFIX = "annotations"    # <annotations>/<split>/annotations-SSSSS-of-NNNNN.tfrecord
DEAD_LETTERS_FILE = "dead_letters.jsonl"
ENCODER_FILE = "encoder.keras"
VOCAB_FILE = "vocab.txt"
COUNTS_FILE = "counts.json"
MODEL_FILE = "model.keras"
BEST_MODEL_FILE = "best.keras"
MODEL_CONFIG_FILE = "model_config.json"
HISTORY_FILE = "history.jsonl"
CHECKPOINTS_DIR = "checkpoints"
LOGS_DIR = "logs"
SAVED_MODEL_DIR = "saved_model"      # <serving_model>/saved_model/: the SavedModel evaluated and pushed
EXPORT_RECORD = os.path.join("assets.extra", "captioner_export.json")  # inside the SavedModel

# ----------------------------------------------------------------------------- record keys

IMAGE_ID = "image/id"
IMAGE_ENCODED = "image/encoded"
IMAGE_FORMAT = "image/format"
IMAGE_HEIGHT = "image/height"
IMAGE_WIDTH = "image/width"
CAPTIONS = "captions"
OBJECT_BBOX = "objects/bbox"
OBJECT_COLOR = "objects/color"
OBJECT_SHAPE = "objects/shape"
OBJECT_SIZE = "objects/size"
OBJECT_CATEGORY = "objects/category"
OBJECT_ATTRIBUTES = (OBJECT_COLOR, OBJECT_SHAPE, OBJECT_SIZE, OBJECT_CATEGORY)
OBJECTS_PREFIX = "objects/"
GRID = "annotations"
GRID_SHAPE = "grid_shape"
CAPTION_TOKENS = "captions/tokens"
CAPTION_LENGTHS = "captions/lengths"
CAPTION_TEXT = "captions/text"


@dataclasses.dataclass(frozen=True)
class Feature:
    """Features of a record sharing one row of the docs: keys, list type and meaning."""
    keys: tuple
    type: str
    meaning: str


_OBJECT_FEATURES = (
    Feature((OBJECT_BBOX,), "float list", "4 per object: `ymin, xmin, ymax, xmax`, normalized "
            "to [0, 1] (sources with boxes only)"),
    Feature((OBJECT_COLOR, OBJECT_SHAPE, OBJECT_SIZE), "bytes lists",
            "one per object (synthetic and scenes)"),
    Feature((OBJECT_CATEGORY,), "bytes list",
            "one per object: the COCO category name (coco and karpathy with "
            "`data.instances_json`)"),
)

EXAMPLE_FEATURES = (
    Feature((IMAGE_ID,), "bytes", "stable image id"),
    Feature((IMAGE_ENCODED,), "bytes", "the original JPEG/PNG/BMP/GIF bytes"),
    Feature((IMAGE_FORMAT,), "bytes", "`jpeg`, `png`, `bmp` or `gif`"),
    Feature((IMAGE_HEIGHT, IMAGE_WIDTH), "int64", "decoded size"),
    Feature((CAPTIONS,), "bytes list", "every reference caption (raw text)"),
) + _OBJECT_FEATURES

ANNOTATION_FEATURES = (
    Feature((IMAGE_ID,), "bytes", "as in Examples"),
    Feature((GRID,), "bytes", "`L x D` float16, row-major (`L = H*W`, cell `i = y*W + x`)"),
    Feature((GRID_SHAPE,), "int64 list", "`[H, W, D]`"),
    Feature((CAPTION_TOKENS,), "int64 list", "all tokenized captions concatenated, each "
            "`<start> w1 .. wn <end>`"),
    Feature((CAPTION_LENGTHS,), "int64 list", "the length of each tokenized caption (with "
            "`<start>`/`<end>`)"),
    Feature((CAPTION_TEXT,), "bytes list", "the reference texts"),
) + _OBJECT_FEATURES

# ----------------------------------------------------------------------------- shards


def shard_path(folder: str, prefix: str, index: int, num_shards: int) -> str:
    """`<folder>/<prefix>-SSSSS-of-NNNNN.tfrecord`."""
    return os.path.join(folder, f"{prefix}-{index:05d}-of-{num_shards:05d}.tfrecord")


def split_files(uri: str, split: str) -> list[str]:
    """The TFRecord shards of one split of an Examples or Annotations artifact, sorted.

    Args:
      uri: the artifact folder; `gs://` and `s3://` go through `tf.io.gfile`.
      split: `train`, `val` or `test`.
    Returns:
      `<uri>/<split>/*.tfrecord` (empty when the split has none).
    """
    if "://" not in uri:
        return sorted(glob.glob(os.path.join(glob.escape(uri), split, "*.tfrecord")))
    import tensorflow as tf
    return sorted(tf.io.gfile.glob(f"{uri.rstrip('/')}/{split}/*.tfrecord"))


# ----------------------------------------------------------------------------- features


def bytes_feature(values: Sequence[bytes]):
    """A `tf.train.Feature` holding a bytes list."""
    import tensorflow as tf
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(values)))


def int_feature(values: Sequence[int]):
    """A `tf.train.Feature` holding an int64 list."""
    import tensorflow as tf
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))


def float_feature(values: Sequence[float]):
    """A `tf.train.Feature` holding a float list."""
    import tensorflow as tf
    return tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in values]))


def object_features(objects: Sequence[Mapping]) -> dict:
    """`objects/*` features (boxes and attributes) for sources that have them.

    Args:
      objects: dicts with `bbox` (4 floats) and `color`, `shape`, `size`
        (synthetic data) or `category` (COCO instances).
    Returns:
      key -> `tf.train.Feature` (empty without objects); an attribute no
      object has is left out.
    """
    if not objects:
        return {}
    bbox = []
    for o in objects:
        bbox += list(o["bbox"])
    features = {OBJECT_BBOX: float_feature(bbox)}
    for key in OBJECT_ATTRIBUTES:
        name = key[len(OBJECTS_PREFIX):]
        if any(name in o for o in objects):
            features[key] = bytes_feature([str(o.get(name, "")).encode() for o in objects])
    return features


def parse_objects(feature_map) -> list[dict]:
    """The objects of a parsed `tf.train.Example` feature map (`[]` when it has none)."""
    if OBJECT_BBOX not in feature_map:
        return []
    bbox = list(feature_map[OBJECT_BBOX].float_list.value)
    values = {key[len(OBJECTS_PREFIX):]: [v.decode() for v in feature_map[key].bytes_list.value]
              for key in OBJECT_ATTRIBUTES if key in feature_map}
    return [{"bbox": tuple(bbox[4 * i:4 * i + 4]),
             **{name: column[i] for name, column in values.items()}}
            for i in range(len(bbox) // 4)]


def _first_bytes(feature_map, key: str) -> bytes:
    values = feature_map[key].bytes_list.value if key in feature_map else []
    return values[0] if values else b""


# ----------------------------------------------------------------------------- Examples


def encode_example(image_id: str, data: bytes, fmt: str, height: int, width: int,
                   captions: Sequence[str], objects: Sequence[Mapping] = ()):
    """The `tf.train.Example` of one accepted image in an Examples artifact.

    Args:
      image_id: stable image id.
      data: the encoded image bytes.
      fmt: `jpeg`, `png`, `bmp` or `gif`.
      height, width: the decoded size.
      captions: the raw reference captions.
      objects: boxes and attributes (see `object_features`).
    Returns:
      A `tf.train.Example`.
    """
    import tensorflow as tf
    feature = {
        IMAGE_ID: bytes_feature([image_id.encode()]),
        IMAGE_ENCODED: bytes_feature([data]),
        IMAGE_FORMAT: bytes_feature([fmt.encode()]),
        IMAGE_HEIGHT: int_feature([height]),
        IMAGE_WIDTH: int_feature([width]),
        CAPTIONS: bytes_feature([c.encode() for c in captions]),
    }
    feature.update(object_features(objects))
    return tf.train.Example(features=tf.train.Features(feature=feature))


def example_image(feature_map) -> tuple[str, bytes]:
    """`(image id, encoded image bytes)` of a parsed Examples record (empty when absent)."""
    return (_first_bytes(feature_map, IMAGE_ID).decode("utf-8", errors="replace"),
            _first_bytes(feature_map, IMAGE_ENCODED))


def example_captions(feature_map) -> list[str]:
    """The raw captions of a parsed Examples record."""
    return [c.decode("utf-8", errors="replace")
            for c in feature_map[CAPTIONS].bytes_list.value] if CAPTIONS in feature_map else []


def example_image_spec() -> dict:
    """`tf.io.parse_single_example` spec of an Examples record's image and captions."""
    import tensorflow as tf
    return {IMAGE_ENCODED: tf.io.FixedLenFeature([], tf.string),
            CAPTIONS: tf.io.VarLenFeature(tf.string)}


# ----------------------------------------------------------------------------- Annotations


def encode_annotations(image_id: str, grid: np.ndarray, tokens: Sequence[int],
                       lengths: Sequence[int], texts: Sequence[str], objects: bytes = b""):
    """The `tf.train.Example` of one image in an Annotations artifact.

    Args:
      image_id: as in Examples.
      grid: `(H, W, D)` annotation grid (stored as float16, row-major).
      tokens: every tokenized caption concatenated.
      lengths: the length of each tokenized caption.
      texts: the reference texts.
      objects: a serialized `tf.train.Features` holding the `objects/*` features
        of the Examples record (empty: none).
    Returns:
      A `tf.train.Example`.
    """
    import tensorflow as tf
    h, w, d = (int(v) for v in grid.shape)
    feature = {
        IMAGE_ID: bytes_feature([image_id.encode("utf-8")]),
        GRID: bytes_feature([np.ascontiguousarray(grid, dtype=np.float16)
                             .reshape(h * w, d).tobytes()]),
        GRID_SHAPE: int_feature([h, w, d]),
        CAPTION_TOKENS: int_feature(tokens),
        CAPTION_LENGTHS: int_feature(lengths),
        CAPTION_TEXT: bytes_feature([t.encode("utf-8") for t in texts]),
    }
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    if objects:
        example.features.MergeFromString(objects)
    return example


def parse_annotations(serialized, grid_shape: Sequence[int]) -> dict:
    """TensorFlow parser (tf.data) of one Annotations record's training fields.

    Args:
      serialized: a scalar string tensor.
      grid_shape: `[H, W, D]`.
    Returns:
      `annotations` (L, D) float16, `tokens` (every caption concatenated,
      each `<start> .. <end>`) and `lengths` (of each caption), int32.
    """
    import tensorflow as tf
    h, w, d = (int(v) for v in grid_shape)
    ex = tf.io.parse_single_example(serialized, {
        GRID: tf.io.FixedLenFeature([], tf.string),
        CAPTION_TOKENS: tf.io.VarLenFeature(tf.int64),
        CAPTION_LENGTHS: tf.io.VarLenFeature(tf.int64)})
    grid = tf.reshape(tf.io.decode_raw(ex[GRID], tf.float16), [h * w, d])
    return {"annotations": grid,
            "tokens": tf.cast(tf.sparse.to_dense(ex[CAPTION_TOKENS]), tf.int32),
            "lengths": tf.cast(tf.sparse.to_dense(ex[CAPTION_LENGTHS]), tf.int32)}


def parse_object_features(serialized) -> dict:
    """TensorFlow parser of one record's `objects/*` features (either artifact).

    Returns:
      `bbox` (M, 4) float32 (M = 0 without boxes) and, per attribute name
      (`color`, `shape`, `size`, `category`), a string vector: one value per
      object, or empty where the record has no such attribute.
    """
    import tensorflow as tf
    spec = {key: tf.io.VarLenFeature(tf.string) for key in OBJECT_ATTRIBUTES}
    spec[OBJECT_BBOX] = tf.io.VarLenFeature(tf.float32)
    ex = tf.io.parse_single_example(serialized, spec)
    out = {key[len(OBJECTS_PREFIX):]: tf.sparse.to_dense(ex[key], default_value="")
           for key in OBJECT_ATTRIBUTES}
    out["bbox"] = tf.reshape(tf.sparse.to_dense(ex[OBJECT_BBOX]), [-1, 4])
    return out


def parse_caption_tokens(serialized) -> dict:
    """TensorFlow parser of one Annotations record's captions only (no grid is read).

    Returns:
      `tokens` (every caption concatenated, each `<start> .. <end>`) and
      `lengths` (of each caption), int32.
    """
    import tensorflow as tf
    ex = tf.io.parse_single_example(serialized, {
        CAPTION_TOKENS: tf.io.VarLenFeature(tf.int64),
        CAPTION_LENGTHS: tf.io.VarLenFeature(tf.int64)})
    return {"tokens": tf.cast(tf.sparse.to_dense(ex[CAPTION_TOKENS]), tf.int32),
            "lengths": tf.cast(tf.sparse.to_dense(ex[CAPTION_LENGTHS]), tf.int32)}


@dataclasses.dataclass
class AnnotationRecord:
    """One Annotations record decoded to NumPy (`decode_annotations`).

    Attributes:
      image_id: the image id.
      grid: (L, D) float32.
      grid_shape: `[H, W, D]`.
      captions: each caption's token ids, int32 (`<start> .. <end>`).
      texts: the reference texts.
      objects: boxes and attributes (see `parse_objects`).
    """
    image_id: str
    grid: np.ndarray
    grid_shape: list
    captions: list
    texts: list
    objects: list


def decode_float16_grid(data: bytes, grid_shape: Sequence[int]) -> np.ndarray:
    """The `L x D` float32 annotation array from its float16 bytes."""
    h, w, d = (int(v) for v in grid_shape)
    return np.frombuffer(data, dtype=np.float16).reshape(h * w, d).astype(np.float32)


def decode_annotations(serialized: bytes) -> AnnotationRecord:
    """NumPy decoder of one serialized Annotations record (every field)."""
    import tensorflow as tf
    f = tf.train.Example.FromString(serialized).features.feature
    shape = [int(v) for v in f[GRID_SHAPE].int64_list.value]
    tokens = np.asarray(f[CAPTION_TOKENS].int64_list.value, np.int32)
    lengths = np.asarray(f[CAPTION_LENGTHS].int64_list.value, np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return AnnotationRecord(
        image_id=_first_bytes(f, IMAGE_ID).decode("utf-8"),
        grid=decode_float16_grid(_first_bytes(f, GRID), shape), grid_shape=shape,
        captions=[tokens[s:s + n] for s, n in zip(starts, lengths, strict=True)],
        texts=[t.decode("utf-8") for t in f[CAPTION_TEXT].bytes_list.value],
        objects=parse_objects(f))


def annotations_grid_shape(annotations_uri: str, properties: Mapping | None = None) -> list[int]:
    """`[H, W, D]` of an Annotations artifact: its `grid_shape` property, else the first record.

    Raises:
      RuntimeError: the artifact has neither the property nor a train record.
    """
    if properties and properties.get(GRID_SHAPE):
        return [int(v) for v in properties[GRID_SHAPE]]
    import tensorflow as tf
    for record in tf.data.TFRecordDataset(split_files(annotations_uri, "train")[:1]).take(1):
        ex = tf.io.parse_single_example(
            record, {GRID_SHAPE: tf.io.FixedLenFeature([3], tf.int64)})
        return [int(v) for v in ex[GRID_SHAPE].numpy()]
    raise RuntimeError(f"{annotations_uri} has no train records")


# ----------------------------------------------------------------------------- Vocabulary


def read_vocabulary(vocabulary_uri: str) -> list[str]:
    """The tokens of `<vocabulary>/vocab.txt`: one per line, a token's id is its line number.

    Through `tf.io.gfile`, so remote artifacts work too.

    Raises:
      ValueError: a blank line (it would shift every later id).
    """
    import tensorflow as tf
    path = os.path.join(vocabulary_uri, VOCAB_FILE)
    with tf.io.gfile.GFile(path) as f:
        tokens = [line.rstrip("\r\n") for line in f]
    blank = [i for i, t in enumerate(tokens) if not t.strip()]
    if blank:
        raise ValueError(f"{path}: line {blank[0] + 1} is blank; one token per line expected")
    return tokens


def read_word_counts(vocabulary_uri: str) -> dict:
    """word -> count over the train captions, from `<vocabulary>/counts.json`."""
    import json

    import tensorflow as tf
    with tf.io.gfile.GFile(os.path.join(vocabulary_uri, COUNTS_FILE)) as f:
        return json.load(f)


def vocabulary_size(vocabulary_uri: str, properties: Mapping | None = None) -> int:
    """`properties["size"]` of the Vocabulary artifact, else the tokens of `vocab.txt`."""
    if properties and properties.get("size"):
        return int(properties["size"])
    return len(read_vocabulary(vocabulary_uri))


def vocabulary_text(tokens: Sequence[str]) -> str:
    """The contents of `vocab.txt` for `tokens` (the inverse of `read_vocabulary`)."""
    return "".join(t + "\n" for t in tokens)


# ----------------------------------------------------------------------------- Model


def model_file(model_uri: str) -> str:
    """The Model artifact's file to serve and evaluate: `best.keras`, else `model.keras`."""
    best = os.path.join(model_uri, BEST_MODEL_FILE)
    return best if os.path.exists(best) else os.path.join(model_uri, MODEL_FILE)


# ----------------------------------------------------------------------------- dead letters

DEAD_LETTER_FIELDS = (
    ("id", "the rejected input's id (empty when it could not be read)"),
    ("reason", "why it was rejected; the text before the first `:` is its kind"),
    ("split", "the split it came from (empty in ExampleGen, which rejects before splitting)"),
    ("path", "the file it came from, when known (else empty)"),
)


def dead_letter(item_id: str, reason: str, split: str = "", path: str = "") -> dict:
    """The dead-letter record of one rejected input (`DEAD_LETTER_FIELDS`)."""
    return {"id": item_id, "reason": reason, "split": split, "path": path}


def dead_letter_line(record: Mapping) -> str:
    """One line of `dead_letters.jsonl` for a `dead_letter` record."""
    return json.dumps({key: record.get(key, "") for key, _ in DEAD_LETTER_FIELDS},
                      ensure_ascii=False)
