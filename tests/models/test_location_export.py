"""A glimpse and a spatial transformer, trained a few steps, exported and served: `locations`."""
import io

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from models.decoding import beam_search
from models.encoder import CoordinateChannels
from models.image_ops import decode_batch
from serving.signature.export import Decoding, export_saved_model
from tests.models.tiny import CAPTIONS, make_model

IMAGE_SIZE = 16
VOCAB = ["<pad>", "<start>", "<end>", "<unk>"] + [f"w{i}" for i in range(16)]


def _png(seed, size=20):
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _tiny_encoder():
    """A 3x3 grid of 14 features + 2 coordinates: the tiny decoder's D = 16."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3))
    x = keras.layers.Rescaling(1 / 255.0)(inputs)
    x = keras.layers.Conv2D(14, 3, strides=5, padding="valid")(x)  # 16 -> 3x3
    return keras.Model(inputs, CoordinateChannels()(x))


@pytest.mark.parametrize("attention", ["glimpse", "spatial_transformer"])
def test_trained_then_exported_model_serves_each_words_location(tmp_path, attention):
    encoder, decoder = _tiny_encoder(), make_model(attention, dropout=0.0)
    images = tf.constant([_png(1), _png(2, size=33)])
    annotations = tf.reshape(encoder(decode_batch(images, IMAGE_SIZE)), [2, 9, 16])
    optimizer = keras.optimizers.Adam(1e-2)
    losses = []
    for _ in range(4):
        with tf.GradientTape() as tape:
            loss = decoder.compute_loss_terms(annotations, CAPTIONS)["loss"]
        grads = tape.gradient(loss, decoder.trainable_variables)
        optimizer.apply_gradients(zip(grads, decoder.trainable_variables, strict=True))
        losses.append(float(loss))
    assert all(np.isfinite(losses))
    path = export_saved_model(str(tmp_path / "1"), encoder, decoder, VOCAB,
                              Decoding(beam_size=2, max_length=6), num_warmup_requests=0)
    loaded = tf.saved_model.load(path)
    served = loaded.signatures["serving_default"](image_bytes=images)
    assert set(served) == {"caption", "tokens", "lengths", "score", "attention", "locations"}
    locations = served["locations"]
    assert locations.dtype == tf.float32 and locations.shape == (2, 6, 3)
    want = beam_search(decoder, annotations, 2, 6)
    np.testing.assert_array_equal(served["tokens"], want["tokens"])
    np.testing.assert_allclose(locations, want["locations"], rtol=1e-5, atol=1e-6)
    lengths = served["lengths"].numpy()
    for row, length in zip(locations.numpy(), lengths, strict=True):
        assert (np.abs(row[:length, :2]) <= 1).all() and (row[:length, 2] > 0).all()
        assert (row[length:] == 0).all()
    np.testing.assert_allclose(served["attention"].numpy()[:, 0].sum((1, 2)), 1.0, rtol=1e-5)
    by_annotations = loaded.signatures["caption_annotations"](annotations=annotations)
    np.testing.assert_allclose(by_annotations["locations"], locations, rtol=1e-5, atol=1e-6)
