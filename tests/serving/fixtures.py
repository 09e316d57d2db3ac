"""A small SavedModel with the captioner's serving contract, for serving tests.

`build_fixture_model` writes a SavedModel whose signatures match the real
export (docs/ARCHITECTURE.md, "Serving contract"):

- `serving_default`: `image_bytes` (tf.string `[batch]`) ->
  `caption` (string `[batch]`), `tokens` (int32 `[batch, T]`), `lengths`
  (int32 `[batch]`), `score` (float32 `[batch]`), `attention` (float32
  `[batch, T, H, W]`);
- `caption_annotations`: `annotations` (float32 `[batch, L, 3]`) -> the same.

The caption is derived from the image's mean colour, so it is deterministic
and easy to predict: "a bright red image", "a dark blue image", ... The
`noun` argument changes the last word, which tells versions apart. With
`decoder_units > 0` the model also runs `decoder_steps` LSTM-sized matmuls
per request (weights `[units, 4 * units]`), which stands in for the real
decoder's cost in benchmarks: like the real one, it is much cheaper per
image in a batch than one image at a time.

Images decode with core TF ops only (`tf.io.decode_image` inside
`tf.map_fn`), like the real export. A variable `calls` counts the images
the model has seen (warmup replay tests read it).
"""
from __future__ import annotations

import base64
import io
import json
import os
import shutil
import urllib.error
import urllib.request
from typing import Iterable, Sequence

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

VOCAB = ("<pad>", "<start>", "<end>", "<unk>", "a", "dark", "bright",
         "red", "green", "blue", "image", "square", "circle")
COLORS = ("red", "green", "blue")
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")


class FixtureCaptioner(tf.Module):
    """Deterministic stand-in for the exported captioner (see module doc)."""

    def __init__(self, noun: str = "image", grid: int = 3, image_size: int = 12,
                 max_length: int = 6, decoder_units: int = 0, decoder_steps: int = 0,
                 seed: int = 0):
        super().__init__(name="fixture_captioner")
        if noun not in VOCAB:
            raise ValueError(f"noun must be one of {VOCAB}")
        self.grid = grid
        self.image_size = image_size
        self.max_length = max_length
        self.decoder_units = decoder_units
        self.decoder_steps = decoder_steps
        self.vocab = tf.constant(VOCAB)
        self.noun_id = VOCAB.index(noun)
        self.calls = tf.Variable(0, dtype=tf.int64, trainable=False, name="calls")
        if decoder_units:
            rng = np.random.RandomState(seed)
            w = rng.normal(0, 1.0 / np.sqrt(decoder_units),
                           (decoder_units, 4 * decoder_units)).astype(np.float32)
            self.decoder_kernel = tf.Variable(w, trainable=False, name="decoder_kernel")

    def _decoder_work(self, mean: tf.Tensor) -> tf.Tensor:
        """Runs the LSTM-sized matmuls; returns a (batch,) term folded into the score."""
        units = self.decoder_units
        reps = units // 3 + 1
        h = tf.tanh(tf.tile(mean / 255.0, [1, reps])[:, :units])  # (batch, units)

        def body(i, h):
            z = tf.matmul(h, self.decoder_kernel)  # (batch, 4 * units)
            return i + 1, tf.tanh(z[:, :units]) * tf.sigmoid(z[:, units:2 * units])

        _, h = tf.while_loop(lambda i, h: i < self.decoder_steps, body,
                             (tf.constant(0), h))
        return 1e-6 * tf.reduce_mean(h, axis=-1)

    def _caption(self, annotations: tf.Tensor) -> dict[str, tf.Tensor]:
        annotations = tf.convert_to_tensor(annotations, tf.float32)  # (batch, L, 3)
        batch = tf.shape(annotations)[0]
        self.calls.assign_add(tf.cast(batch, tf.int64))
        mean = tf.reduce_mean(annotations, axis=1)  # (batch, 3)
        color = tf.argmax(mean, axis=-1, output_type=tf.int32)  # (batch,)
        bright = tf.reduce_mean(mean, axis=-1) > 127.5
        ones = tf.ones_like(color)
        words = tf.stack([
            ones * VOCAB.index("a"),
            tf.where(bright, ones * VOCAB.index("bright"), ones * VOCAB.index("dark")),
            color + VOCAB.index("red"),
            ones * self.noun_id,
        ], axis=1)  # (batch, 4)
        n_words = 4
        pad = self.max_length - n_words - 1
        tokens = tf.concat([words, ones[:, None] * VOCAB.index("<end>"),
                            tf.zeros([batch, pad], tf.int32)], axis=1)  # (batch, T)
        lengths = ones * (n_words + 1)
        caption = tf.strings.reduce_join(tf.gather(self.vocab, words), axis=1, separator=" ")
        score = -tf.reduce_sum(tf.abs(mean - 127.5), axis=-1) / 1000.0
        if self.decoder_units:
            score += self._decoder_work(mean)
        # Step t attends to the cells that are strongest in the caption's colour,
        # sharper at later steps: (batch, T, L), each row sums to 1.
        picked = tf.gather(annotations, color, axis=2, batch_dims=1)  # (batch, L)
        steps = tf.range(1, self.max_length + 1, dtype=tf.float32)
        logits = picked[:, None, :] / 64.0 * steps[None, :, None]
        attention = tf.nn.softmax(logits, axis=-1)
        attention = tf.reshape(attention, [batch, self.max_length, self.grid, self.grid])
        return {"caption": caption, "tokens": tokens, "lengths": lengths,
                "score": score, "attention": attention}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
    def serve_images(self, image_bytes):
        size = self.image_size

        def decode(data):
            image = tf.io.decode_image(data, channels=3, expand_animations=False)
            return tf.image.resize(tf.cast(image, tf.float32), [size, size])

        images = tf.map_fn(decode, image_bytes,
                           fn_output_signature=tf.TensorSpec([size, size, 3], tf.float32))
        grid = tf.image.resize(images, [self.grid, self.grid], method="area")
        annotations = tf.reshape(grid, [-1, self.grid * self.grid, 3])
        return self._caption(annotations)

    @tf.function(input_signature=[tf.TensorSpec([None, None, 3], tf.float32,
                                                name="annotations")])
    def serve_annotations(self, annotations):
        return self._caption(annotations)


def build_fixture_model(export_dir: str, noun: str = "image",
                        warmup_images: Sequence[bytes] = (), **kwargs) -> str:
    """Writes a fixture SavedModel (one version folder) and returns its path.

    Args:
      export_dir: the version folder to create, e.g. `<base>/1`.
      noun: last caption word ("image", "square", "circle").
      warmup_images: when given, one warmup record per image is written to
        `assets.extra/tf_serving_warmup_requests`.
      **kwargs: `FixtureCaptioner` arguments.
    """
    module = FixtureCaptioner(noun=noun, **kwargs)
    signatures = {
        "serving_default": module.serve_images.get_concrete_function(),
        "caption_annotations": module.serve_annotations.get_concrete_function(),
    }
    tf.saved_model.save(module, export_dir, signatures=signatures)
    if warmup_images:
        write_warmup_requests(export_dir, [[image] for image in warmup_images])
    return export_dir


def write_warmup_requests(export_dir: str, batches: Iterable[Sequence[bytes]],
                          model_name: str = "captioner") -> str:
    """Writes TF Serving warmup records (PredictionLog) with image batches."""
    path = os.path.join(export_dir, WARMUP_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for images in batches:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name,
                                               signature_name="serving_default"))
            request.inputs["image_bytes"].CopyFrom(
                tf.make_tensor_proto(list(images), dtype=tf.string))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return path


def publish_version(source_dir: str, base_path: str, version: int) -> str:
    """Copies a version folder into `base_path/<version>` with an atomic rename."""
    tmp = os.path.join(base_path, f".tmp-{version}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source_dir, tmp)
    final = os.path.join(base_path, str(version))
    os.rename(tmp, final)
    return final


def solid_image(rgb: tuple[int, int, int], size: int = 8, fmt: str = "PNG") -> bytes:
    """Encoded bytes of a solid-colour image (PNG, JPEG, GIF, BMP or WEBP)."""
    from PIL import Image
    image = Image.new("RGB", (size, size), rgb)
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def expected_caption(rgb: tuple[int, int, int], noun: str = "image") -> str:
    """The caption the fixture gives a solid-colour image."""
    color = COLORS[int(np.argmax(rgb))]
    bright = "bright" if np.mean(rgb) > 127.5 else "dark"
    return f"a {bright} {color} {noun}"


def rest_call(url: str, path: str, body=None, raw: bytes | None = None, method=None):
    """(HTTP status, JSON body) of a REST call to `url + path`.

    `body` is sent as JSON (bytes are sent as they are); `raw` overrides it.
    """
    data = raw if raw is not None else (
        body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None
        else None)
    request = urllib.request.Request(url + path, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def b64(data: bytes) -> dict:
    """The REST API's JSON form of binary data."""
    return {"b64": base64.b64encode(data).decode()}


def recv_until_closed(sock) -> bytes:
    """Every byte the peer sends on `sock` until it closes (or resets) the connection."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def stop_process(process) -> None:
    """Kills `process` (a `subprocess.Popen`) if it is still running, and reaps it."""
    if process.poll() is None:
        process.kill()
        process.wait()
