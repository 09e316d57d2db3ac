"""Image decoding and resizing: one implementation for Beam, tf.data and the serving graph."""
from __future__ import annotations

import tensorflow as tf


def decode_and_resize(image_bytes: tf.Tensor, image_size: int) -> tf.Tensor:
    """Decodes one JPEG/PNG/BMP/GIF image and resizes it for the encoder.

    Core TensorFlow ops only (the serving graph uses it too). GIFs keep their
    first frame; grayscale and RGBA become RGB.

    Args:
      image_bytes: scalar `tf.string`.
      image_size: output side S.
    Returns:
      `(S, S, 3)` float32 with values in [0, 255].
    """
    image = tf.io.decode_image(image_bytes, channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    image = tf.image.resize(tf.cast(image, tf.float32), [image_size, image_size],
                            method="bilinear", antialias=True)
    return tf.clip_by_value(image, 0.0, 255.0)


def decode_batch(image_bytes: tf.Tensor, image_size: int) -> tf.Tensor:
    """`decode_and_resize` over a `[batch]` string tensor -> `(batch, S, S, 3)` float32."""
    return tf.map_fn(lambda b: decode_and_resize(b, image_size), image_bytes,
                     fn_output_signature=tf.TensorSpec([image_size, image_size, 3], tf.float32))
