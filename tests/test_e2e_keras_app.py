"""End to end on the paper's encoder path: a `keras_app` VGG19 cut at `block5_conv4`.

The `tiny` config with the encoder the `coco_paper` and `flickr8k` configs use
(VGG19 `block5_conv4`, no coordinate channels), at 48 pixels so that the grid
is 3x3x512 (the paper's 14x14x512 at 224), with its weights read from a local
`..._notop.h5` file as offline users supply ImageNet weights.
"""
import json
import os

import numpy as np
import pytest

from tests.test_e2e import _captioner, _test_ids

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

IMAGE_SIZE, GRID = 48, [3, 3, 512]


def _properties(artifact_uri):
    """An artifact's properties, paths resolved against the root it lies in."""
    from components.contract.artifacts import Artifact
    return dict(Artifact.load(artifact_uri).properties)


@pytest.fixture(scope="module")
def paper_run(tmp_path_factory):
    from tests.models.keras_app_weights import write_notop_weights
    tmp = tmp_path_factory.mktemp("keras_app")
    weights = str(tmp / "vgg19_weights_tf_dim_ordering_tf_kernels_notop.h5")
    reference = write_notop_weights("VGG19", "block5_conv4", weights)
    root = str(tmp / "root")
    _captioner("run", "--config", "tiny", "--root", root,
               "--set", "encoder.kind=keras_app", "--set", "encoder.application=VGG19",
               "--set", "encoder.layer=block5_conv4", "--set", f"encoder.weights={weights}",
               "--set", f"encoder.image_size={IMAGE_SIZE}",
               "--set", "encoder.coord_channels=false")
    with open(os.path.join(root, "run_summary.json")) as f:
        return json.load(f), reference


def test_every_stage_ran_with_the_keras_app_encoder(paper_run):
    summary, _ = paper_run
    stages = summary["stages"]
    assert set(stages) == {"ExampleGen", "EncoderTrainer", "Preprocess", "Trainer",
                           "Exporter", "Evaluator", "Pusher"}
    assert all(st["status"] == "ran" for st in stages.values())
    assert summary["blessed"] is True
    encoder = _properties(stages["EncoderTrainer"]["outputs"]["encoder"])
    assert encoder["kind"] == "keras_app" and encoder["grid_shape"] == GRID
    assert "val_map" not in encoder                   # a keras_app encoder is not trained
    annotations = _properties(stages["Preprocess"]["outputs"]["annotations"])
    assert annotations["grid_shape"] == GRID
    counts = stages["Preprocess"]["counts"]
    assert counts["accepted"] == counts["seen"] == stages["ExampleGen"]["counts"]["accepted"]
    for key in ("Bleu_4", "METEOR", "ROUGE_L", "CIDEr"):
        assert key in summary["metrics"]


def test_the_encoder_artifact_holds_the_weights_files_vgg19(paper_run):
    import keras

    import models.encoder  # noqa: F401  (registers the encoder's layers)
    summary, reference = paper_run
    uri = summary["stages"]["EncoderTrainer"]["outputs"]["encoder"]
    encoder = keras.saving.load_model(os.path.join(uri, "encoder.keras"))
    images = np.random.default_rng(0).uniform(0, 255, (2, IMAGE_SIZE, IMAGE_SIZE, 3))
    images = images.astype("float32")
    np.testing.assert_allclose(np.asarray(encoder(images)), reference(images),
                               rtol=1e-5, atol=1e-4)


def test_the_pushed_model_captions_images_over_the_vgg19_grid(paper_run):
    import tensorflow as tf

    from components.evaluator.split_readers import read_images
    summary, _ = paper_run
    stages = summary["stages"]
    path = _properties(stages["Pusher"]["outputs"]["pushed_model"])["path"]
    with open(os.path.join(stages["Preprocess"]["outputs"]["vocabulary"], "vocab.txt")) as f:
        vocab = set(f.read().split())
    examples = stages["ExampleGen"]["outputs"]["examples"]
    images = list(read_images(examples, "test", _test_ids(examples)).values())[:2]
    out = tf.saved_model.load(path).signatures["serving_default"](image_bytes=tf.constant(images))
    attention = out["attention"].numpy()
    assert attention.shape[0] == 2 and attention.shape[2:] == tuple(GRID[:2])
    lengths = out["lengths"].numpy()
    assert lengths.max() > 0
    for caption, length, maps in zip(out["caption"].numpy(), lengths, attention, strict=True):
        assert all(w in vocab for w in caption.decode().split())
        # Each emitted word's attention is a distribution over the 3x3 grid.
        steps = maps[:length].reshape(length, GRID[0] * GRID[1])
        np.testing.assert_allclose(steps.sum(-1), 1.0, rtol=1e-4)
