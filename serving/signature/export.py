"""SavedModel export for TensorFlow Serving (the serving contract of docs/ARCHITECTURE.md).

`serving_default`: `image_bytes` (tf.string `[batch]`, JPEG/PNG/BMP/GIF) ->
`caption` (string), `tokens` (int32 `[batch, T]`), `lengths` (int32),
`score` (float32 log-probability), `attention` (float32 `[batch, T, H, W]`);
a decoder with a location-wise attention (glimpse, spatial transformer) also
`locations` (float32 `[batch, T, 3]`: each word's window centre x, y and
scale, in grid coordinates where -1 and 1 are the image's edges).
`caption_annotations`: the same outputs from `annotations` (`[batch, L, D]`).
Decoding, resizing, the encoder, beam search and the id-to-word lookup all
run in the graph with core TensorFlow ops, so stock TF Serving loads it.
"""
from __future__ import annotations

import io
import os
from typing import Optional, Sequence

import numpy as np

from serving.signature.decoding import Decoding

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
# What the pipeline's Exporter records beside the SavedModel: the inputs'
# fingerprints, the decoding, the infra check, the encoder's GFLOPs per image.
EXPORT_RECORD = os.path.join("assets.extra", "captioner_export.json")
SIGNATURES = ("serving_default", "caption_annotations")


def _captions_from_tokens(tf, vocab, tokens, lengths):
    """Joins the words of each row, leaving out reserved tokens and padding."""
    from models.text import END_ID
    positions = tf.range(tf.shape(tokens)[1])[tf.newaxis, :]
    valid = tf.logical_and(tokens > END_ID, positions < lengths[:, tf.newaxis])
    words = tf.where(valid, tf.gather(vocab, tokens), tf.constant("", tf.string))
    joined = tf.strings.reduce_join(words, axis=1, separator=" ")
    return tf.strings.strip(tf.strings.regex_replace(joined, " +", " "))


class CaptionerModule:
    """The serving functions over an encoder, a decoder and a vocabulary.

    Args:
      encoder: Keras model `(batch, S, S, 3)` [0, 255] -> `(batch, H, W, D)`.
      decoder: a `models.show_attend_tell.ShowAttendTell`.
      vocabulary: the id -> word list.
      decoding: beam size, maximum length and length normalization (`Decoding`).
    """

    def __init__(self, encoder, decoder, vocabulary: Sequence[str], decoding: "Decoding"):
        import tensorflow as tf
        self.encoder = encoder
        self.decoder = decoder
        self.vocab = tf.constant(list(vocabulary), dtype=tf.string)
        self.beam_size = int(decoding.beam_size)
        self.max_length = int(decoding.max_length)
        self.length_normalization = float(decoding.length_normalization)
        self.image_size = int(encoder.input_shape[1])
        h, w, d = (int(v) for v in encoder.output_shape[1:])
        self.grid = (h, w, d)

    def caption_annotations(self, annotations):
        """Decodes `(batch, L, D)` annotations into the serving outputs."""
        import tensorflow as tf

        from models.decoding import attention_to_grid, beam_search, greedy_decode
        annotations = tf.cast(annotations, tf.float32)
        if self.beam_size <= 1:
            out = greedy_decode(self.decoder, annotations, self.max_length)
        else:
            out = beam_search(self.decoder, annotations, self.beam_size, self.max_length,
                              length_normalization=self.length_normalization)
        tokens = tf.cast(out["tokens"], tf.int32)
        lengths = tf.cast(out["lengths"], tf.int32)
        h, w, _ = self.grid
        outputs = {"caption": _captions_from_tokens(tf, self.vocab, tokens, lengths),
                   "tokens": tokens, "lengths": lengths,
                   "score": tf.cast(out["scores"], tf.float32),
                   "attention": tf.cast(attention_to_grid(out["attention"], h, w), tf.float32)}
        if "locations" in out:
            outputs["locations"] = tf.cast(out["locations"], tf.float32)
        return outputs

    def caption_images(self, image_bytes):
        """Decodes and resizes the images, encodes them and captions them."""
        import tensorflow as tf

        from models.image_ops import decode_batch
        images = decode_batch(image_bytes, self.image_size)
        grid = self.encoder(images, training=False)
        h, w, d = self.grid
        annotations = tf.reshape(tf.cast(grid, tf.float32), [-1, h * w, d])
        return self.caption_annotations(annotations)


def export_saved_model(path: str, encoder, decoder, vocabulary: Sequence[str],
                       decoding: Optional[Decoding] = None, *, model_name: str = "captioner",
                       num_warmup_requests: int = 2) -> str:
    """Writes a TF-Serving-ready SavedModel with both signatures and a warmup file.

    Args:
      path: the (not yet existing) version folder to write.
      encoder, decoder, vocabulary: see `CaptionerModule`.
      decoding: how the graph decodes (default `Decoding()`: beam 3, 30 words).
      model_name: the model name written into the warmup requests.
      num_warmup_requests: `PredictionLog` records in
        `assets.extra/tf_serving_warmup_requests` (0 = none).
    Returns:
      `path`.
    """
    import keras
    import tensorflow as tf
    decoding = decoding or Decoding()
    module = CaptionerModule(encoder, decoder, vocabulary, decoding)
    _, _, d = module.grid
    h, w, _ = module.grid
    archive = keras.export.ExportArchive()
    archive.track(encoder)
    archive.track(decoder)
    archive.add_endpoint(
        "serving_default", module.caption_images,
        input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
    archive.add_endpoint(
        "caption_annotations", module.caption_annotations,
        input_signature=[tf.TensorSpec([None, h * w, d], tf.float32, name="annotations")])
    archive.write_out(path, verbose=False)
    if num_warmup_requests > 0:
        write_warmup_requests(path, model_name, module.image_size, num_warmup_requests)
    return path


def _warmup_image(size: int, seed: int) -> bytes:
    from PIL import Image
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def write_warmup_requests(path: str, model_name: str, image_size: int, count: int) -> str:
    """`assets.extra/tf_serving_warmup_requests`: TFRecord of PredictionLog, as TF Serving reads it."""
    import tensorflow as tf
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2
    out = os.path.join(path, WARMUP_FILE)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with tf.io.TFRecordWriter(out) as writer:
        for i in range(count):
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name="serving_default"))
            request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto(
                [_warmup_image(image_size, i)], dtype=tf.string))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return out

