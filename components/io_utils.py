"""Record-level helpers shared by stages: TFRecord features, shard paths, dead letters."""
from __future__ import annotations

import glob
import io
import json
import os
import re
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np

SPLITS = ("train", "val", "test")
IMAGE_FORMATS = {"JPEG": "jpeg", "PNG": "png", "BMP": "bmp", "GIF": "gif"}


def bytes_feature(values: Sequence[bytes]):
    import tensorflow as tf
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(values)))


def int_feature(values: Sequence[int]):
    import tensorflow as tf
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))


def float_feature(values: Sequence[float]):
    import tensorflow as tf
    return tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in values]))


def object_features(objects: Sequence[Mapping]) -> dict:
    """`objects/*` features (boxes and attributes) for sources that have them."""
    if not objects:
        return {}
    bbox = []
    for o in objects:
        bbox += list(o["bbox"])
    return {
        "objects/bbox": float_feature(bbox),
        "objects/color": bytes_feature([str(o.get("color", "")).encode() for o in objects]),
        "objects/shape": bytes_feature([str(o.get("shape", "")).encode() for o in objects]),
        "objects/size": bytes_feature([str(o.get("size", "")).encode() for o in objects]),
    }


def parse_objects(feature_map) -> list[dict]:
    """Reads `objects/*` back from a parsed `tf.train.Example` feature map."""
    if "objects/bbox" not in feature_map:
        return []
    bbox = list(feature_map["objects/bbox"].float_list.value)
    colors = [v.decode() for v in feature_map["objects/color"].bytes_list.value]
    shapes = [v.decode() for v in feature_map["objects/shape"].bytes_list.value]
    sizes = [v.decode() for v in feature_map["objects/size"].bytes_list.value]
    return [{"bbox": tuple(bbox[4 * i:4 * i + 4]), "color": colors[i], "shape": shapes[i],
             "size": sizes[i]} for i in range(len(colors))]


def shard_path(folder: str, prefix: str, index: int, num_shards: int) -> str:
    return os.path.join(folder, f"{prefix}-{index:05d}-of-{num_shards:05d}.tfrecord")


def split_files(uri: str, split: str) -> list[str]:
    """The TFRecord shards of one split of an Examples/Annotations artifact."""
    return sorted(glob.glob(os.path.join(glob.escape(uri), split, "*.tfrecord")))


def read_records(files: Iterable[str]) -> Iterator[bytes]:
    import tensorflow as tf
    for path in files:
        for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
            yield record


def inspect_image(data: bytes, max_pixels: int = 0) -> tuple[str, int, int]:
    """Checks that bytes are a JPEG/PNG/BMP/GIF image that TensorFlow decodes.

    Args:
      data: the encoded image.
      max_pixels: reject images with more pixels (0 = no limit).
    Returns:
      (format, height, width).
    Raises:
      ValueError: with the reason (empty, unknown format, truncated, zero size, too large).
    """
    from PIL import Image
    if not data:
        raise ValueError("empty image file")
    try:
        with Image.open(io.BytesIO(data)) as img:
            fmt = IMAGE_FORMATS.get(img.format or "")
            if fmt is None:
                raise ValueError(f"unsupported image format {img.format!r} "
                                 "(JPEG, PNG, BMP or GIF expected)")
            width, height = img.size
            if width == 0 or height == 0:
                raise ValueError("zero-size image")
            if max_pixels and width * height > max_pixels:
                raise ValueError(f"image has {width * height} pixels, over the limit {max_pixels}")
            # PIL's full decode too: its reasons are clearer ("image file is
            # truncated" where TensorFlow says "Invalid PNG data").
            img.load()
    except ValueError:
        raise
    except Exception as e:  # PIL raises many types for corrupt data
        # PIL names the stream object ("<_io.BytesIO object at 0x7f..>"): drop the
        # address so that the same bad file gives the same reason in every run.
        message = re.sub(r" at 0x[0-9a-fA-F]+>", ">", str(e))
        raise ValueError(f"undecodable image: {type(e).__name__}: {message}") from None
    _check_tf_decodable(data)
    return fmt, height, width


# TF's op context in error messages: "{{function_node ..}}", "[Op:..]", "name: ".
_OP_CONTEXT = re.compile(r"\{\{.*?\}\}|\[\[.*?\]\]|\[Op:.*?\]|\bname:\s*$", re.S)


def _check_tf_decodable(data: bytes) -> None:
    """The full decode, with TensorFlow's `decode_image` (catches truncated data).

    EncoderTrainer, Preprocess and the serving graph decode with it
    (`models.image_ops`), so it is the decoder that decides: PIL reads some
    images it cannot (1-bit BMPs, say), and one such image would stop a
    later stage. It runs after PIL has checked the header against the pixel
    limit.
    """
    import tensorflow as tf
    try:
        tf.io.decode_image(data, channels=3, expand_animations=False)
    except (tf.errors.OpError, ValueError) as e:
        message = " ".join(_OP_CONTEXT.sub("", getattr(e, "message", None) or str(e)).split())
        raise ValueError(f"undecodable image: TensorFlow: {message[:200]}") from None


class DeadLetters:
    """Append-only JSON-lines file of rejected inputs with their reasons."""

    def __init__(self, path: str):
        self.path = path
        self.count = 0
        self.reasons: dict[str, int] = {}
        self._f = open(path, "a", encoding="utf-8")

    def add(self, item_id: str, reason: str, **extra) -> None:
        self.count += 1
        kind = reason.split(":")[0]
        self.reasons[kind] = self.reasons.get(kind, 0) + 1
        self._f.write(json.dumps({"id": item_id, "reason": reason, **extra},
                                 ensure_ascii=False) + "\n")

    def close(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()


def decode_float16_grid(data: bytes, grid_shape: Sequence[int]) -> np.ndarray:
    """The `L x D` float32 annotation array from its float16 bytes."""
    h, w, d = (int(v) for v in grid_shape)
    return np.frombuffer(data, dtype=np.float16).reshape(h * w, d).astype(np.float32)
