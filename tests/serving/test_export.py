"""SavedModel export: the serving contract, parity with the Keras model, clear errors."""
import io
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from models.decoding import beam_search
from models.image_ops import decode_batch
from serving.signature.export import SIGNATURES, WARMUP_FILE, Decoding, export_saved_model
from tests.models.tiny import make_model

IMAGE_SIZE = 16
VOCAB = ["<pad>", "<start>", "<end>", "<unk>"] + [f"w{i}" for i in range(16)]


def _png(seed, size=20):
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    encoder = _tiny_encoder()
    decoder = make_model()
    path = str(tmp_path_factory.mktemp("export") / "1")
    export_saved_model(path, encoder, decoder, VOCAB, Decoding(beam_size=2, max_length=7),
                       num_warmup_requests=2)
    return path, encoder, decoder


def _tiny_encoder():
    """A 3x3 grid of 14 features + 2 coordinates: the tiny decoder's D = 16."""
    import keras
    keras.utils.set_random_seed(1)
    inputs = keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3))
    x = keras.layers.Rescaling(1 / 255.0)(inputs)
    x = keras.layers.Conv2D(14, 3, strides=5, padding="valid")(x)  # 16 -> 3x3
    from models.encoder import CoordinateChannels
    return keras.Model(inputs, CoordinateChannels()(x))


def test_signatures_and_outputs(exported):
    path, _, _ = exported
    loaded = tf.saved_model.load(path)
    assert set(SIGNATURES) <= set(loaded.signatures)
    out = loaded.signatures["serving_default"](image_bytes=tf.constant([_png(1), _png(2)]))
    assert set(out) == {"caption", "tokens", "lengths", "score", "attention"}
    assert out["caption"].dtype == tf.string and out["caption"].shape == (2,)
    assert out["tokens"].dtype == tf.int32 and out["tokens"].shape[0] == 2
    assert out["lengths"].dtype == tf.int32 and out["score"].dtype == tf.float32
    assert out["attention"].shape[0] == 2 and out["attention"].shape[2:] == (3, 3)
    for caption, tokens, length in zip(out["caption"].numpy(), out["tokens"].numpy(),
                                       out["lengths"].numpy(), strict=True):
        words = [VOCAB[t] for t in tokens[:length] if t > 2]  # <unk> (3) is shown
        assert caption.decode() == " ".join(words)
    ann = loaded.signatures["caption_annotations"](
        annotations=tf.zeros([1, 9, 16], tf.float32))
    assert ann["attention"].shape[0] == 1


def test_export_matches_the_keras_model(exported):
    path, encoder, decoder = exported
    images = tf.constant([_png(3), _png(4, size=33)])
    grid = encoder(decode_batch(images, IMAGE_SIZE), training=False)
    keras_out = beam_search(decoder, tf.reshape(grid, [2, 9, 16]), 2, 7)
    served = tf.saved_model.load(path).signatures["serving_default"](image_bytes=images)
    np.testing.assert_array_equal(served["tokens"].numpy(), keras_out["tokens"].numpy())
    np.testing.assert_allclose(served["score"].numpy(), keras_out["scores"].numpy(), rtol=1e-5)


def test_corrupt_image_in_a_batch_is_a_clear_invalid_argument(exported):
    path, _, _ = exported
    fn = tf.saved_model.load(path).signatures["serving_default"]
    with pytest.raises(tf.errors.InvalidArgumentError, match="(?i)image"):
        fn(image_bytes=tf.constant([_png(5), b"definitely not an image"]))


def test_warmup_file_and_saved_model_cli(exported):
    path, _, _ = exported
    from tensorflow_serving.apis import prediction_log_pb2
    records = list(tf.data.TFRecordDataset(f"{path}/{WARMUP_FILE}").as_numpy_iterator())
    assert len(records) == 2
    log = prediction_log_pb2.PredictionLog.FromString(records[0])
    assert "image_bytes" in log.predict_log.request.inputs
    cli = [sys.executable, "-c", "from tensorflow.python.tools.saved_model_cli import main; main()",
           "show", "--dir", path, "--all"]
    out = subprocess.run(cli, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "signature_def['serving_default']" in out.stdout
    assert "signature_def['caption_annotations']" in out.stdout
