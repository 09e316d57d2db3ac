"""File helpers shared by stages: reading TFRecords, checking images, the dead-letter file.

What the records hold is `components.contract.schema`.
"""
from __future__ import annotations

import io
import os
import re
from typing import Iterable, Iterator

from components.contract import schema

IMAGE_FORMATS = {"JPEG": "jpeg", "PNG": "png", "BMP": "bmp", "GIF": "gif"}


def read_records(files: Iterable[str]) -> Iterator[bytes]:
    """The serialized records of TFRecord files, file by file in the given order.

    Raises:
      tf.errors.DataLossError: a truncated or corrupted record; its
        `damaged_file` attribute names the file (TensorFlow's message does not).
    """
    import tensorflow as tf
    for path in files:
        try:
            for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
                yield record
        except tf.errors.DataLossError as e:
            e.damaged_file = path  # read by the runner's one-line report
            raise


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

    def add(self, item_id: str, reason: str, split: str = "", path: str = "") -> None:
        """Appends one `schema.dead_letter` record and counts its kind."""
        self.count += 1
        kind = reason.split(":")[0]
        self.reasons[kind] = self.reasons.get(kind, 0) + 1
        self._f.write(schema.dead_letter_line(
            schema.dead_letter(item_id, reason, split, path)) + "\n")

    def close(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()


def tree_digest(folder: str) -> str:
    """sha256 over every file under `folder`: relative paths (sorted) and bytes.

    Identifies a SavedModel folder by content, wherever it lies: the
    Evaluator records the digest of the export it scored, and the Pusher
    publishes a copy only when the copy's digest is the same.

    Returns:
      64 hex digits.
    """
    import hashlib
    h = hashlib.sha256()
    files = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        files += [os.path.join(dirpath, name) for name in filenames]
    for path in sorted(files, key=lambda p: os.path.relpath(p, folder)):
        rel = os.path.relpath(path, folder).replace(os.sep, "/")
        h.update(f"{rel}\0{os.path.getsize(path)}\0".encode())  # sizes keep the stream unambiguous
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()
