"""Encoders: layer contracts, each family's normalization, the paper configs' `keras_app` path.

Keras applications' ImageNet weights download at run time, so these tests use
`weights="none"` or a weights file written here, as offline users do.
"""
import importlib

import keras
import numpy as np
import pytest

from models.encoder import (
    CoordinateChannels,
    ImageNormalization,
    build_encoder,
    keras_app_backbone,
    normalization_mode,
)
from tests.models.keras_app_weights import write_notop_weights
from tests.models.layer_contract import run_layer_test

APPLICATIONS = sorted(n for n in dir(keras.applications) if n[0].isupper())
MODES = ("scale", "tf", "caffe", "torch", "none")


def _images(size=8, batch=2, seed=0):
    """(batch, size, size, 3) float32 RGB values in [0, 255]."""
    return np.random.default_rng(seed).uniform(0, 255, (batch, size, size, 3)).astype("float32")


def _grid(h=3, w=3, d=4, batch=2, seed=0):
    return np.random.default_rng(seed).normal(size=(batch, h, w, d)).astype("float32")


# ImageNormalization -------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_image_normalization_layer_contract(mode):
    run_layer_test(ImageNormalization, {"mode": mode}, _images(4), (None, 4, 4, 3),
                   expected_weights={})


def test_unknown_normalization_mode_is_rejected():
    with pytest.raises(ValueError, match="normalization mode"):
        ImageNormalization("imagenet")


@pytest.mark.parametrize("application", APPLICATIONS)
def test_normalization_equals_the_familys_preprocess_input(application):
    # Every keras.applications model: the mode keras_app_backbone picks must do
    # what the family's own preprocess_input does to [0, 255] RGB images.
    family = importlib.import_module(getattr(keras.applications, application).__module__)
    images = _images()
    want = family.preprocess_input(images.copy())
    got = ImageNormalization(normalization_mode(application))(images)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-4)


def test_every_mode_is_used_by_some_family():
    assert {normalization_mode(a) for a in APPLICATIONS} == set(MODES) - {"scale"}


def test_uint8_images_are_normalized_like_float_images():
    images = np.round(_images())
    for mode in MODES:
        layer = ImageNormalization(mode)
        np.testing.assert_array_equal(layer(images.astype("uint8")), layer(images))


# CoordinateChannels -------------------------------------------------------------------------

@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_coordinate_channels_layer_contract(scale):
    run_layer_test(CoordinateChannels, {"scale": scale}, _grid(), (None, 3, 3, 6),
                   expected_weights={})


def test_coordinates_are_each_cells_x_and_y_in_minus_one_to_one():
    grid = _grid(h=2, w=3, d=4)
    out = np.asarray(CoordinateChannels(scale=2.0)(grid))
    assert out.shape == (2, 2, 3, 6)
    np.testing.assert_array_equal(out[..., :4], grid)       # the features are untouched
    xs = np.array([-1.0, 0.0, 1.0])                          # across the columns
    ys = np.array([-1.0, 1.0])                               # down the rows
    for b in range(2):
        np.testing.assert_allclose(out[b, :, :, 4], 2.0 * np.tile(xs, (2, 1)), atol=1e-7)
        np.testing.assert_allclose(out[b, :, :, 5], 2.0 * np.tile(ys[:, None], (1, 3)), atol=1e-7)


def test_coordinate_channels_with_an_unknown_grid_size():
    inputs = keras.Input((None, None, 4))
    model = keras.Model(inputs, CoordinateChannels()(inputs))
    assert tuple(model.output.shape) == (None, None, None, 6)
    assert np.asarray(model(_grid(h=4, w=5))).shape == (2, 4, 5, 6)


# The keras_app encoder ----------------------------------------------------------------------

@pytest.mark.parametrize("application,layer,size,grid", [
    ("VGG19", "block5_conv4", 48, (3, 3, 512)),      # the paper's layer: 1/16 of the input
    ("ResNet50", "conv4_block6_out", 32, (2, 2, 1024)),
])
def test_keras_app_encoder_gives_the_layers_grid(application, layer, size, grid):
    encoder = build_encoder("keras_app", application=application, layer=layer, weights="none",
                            image_size=size, coord_channels=False)
    assert tuple(encoder.output_shape) == (None, *grid)
    backbone = encoder.get_layer(f"{application.lower()}_{layer}")
    assert backbone.get_layer("normalize").mode == normalization_mode(application)
    out = np.asarray(encoder(_images(size)))
    assert out.shape == (2, *grid) and np.isfinite(out).all()
    with_coords = build_encoder("keras_app", application=application, layer=layer,
                                weights="none", image_size=size, coord_channels=True)
    assert tuple(with_coords.output_shape) == (None, *grid[:2], grid[2] + 2)


@pytest.mark.parametrize("application,layer,weights_format,file_name", [
    ("VGG19", "block5_conv4", "keras", "vgg19_notop.weights.h5"),
    ("VGG19", "block5_conv4", "legacy", "vgg19_weights_tf_dim_ordering_tf_kernels_notop.h5"),
    pytest.param("ResNet50", "conv4_block6_out", "legacy", "resnet50_notop.h5",
                 marks=pytest.mark.slow),   # ~15 s: batch-norm statistics travel too
])
def test_a_local_weights_file_gives_the_applications_outputs(tmp_path, application, layer,
                                                             weights_format, file_name):
    path = str(tmp_path / file_name)
    # The file is written by a model of any input size: conv weights do not depend on it.
    reference = write_notop_weights(application, layer, path, weights_format)
    encoder = build_encoder("keras_app", application=application, layer=layer, weights=path,
                            image_size=32, coord_channels=False)
    images = _images(32)
    np.testing.assert_allclose(np.asarray(encoder(images)), reference(images),
                               rtol=1e-5, atol=1e-4)
    # The saved encoder (the Encoder artifact) reloads to the same outputs.
    encoder.save(tmp_path / "encoder.keras")
    revived = keras.saving.load_model(tmp_path / "encoder.keras")
    np.testing.assert_array_equal(np.asarray(revived(images)), np.asarray(encoder(images)))


def test_keras_app_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="weights file not found"):
        keras_app_backbone("VGG19", "block5_conv4", str(tmp_path / "missing.h5"), 32)
    with pytest.raises(ValueError, match="keras.applications has no 'VGG20'"):
        keras_app_backbone("VGG20", "block5_conv4", "none", 32)
    with pytest.raises(ValueError, match="block5_conv4"):   # lists the last conv layers
        keras_app_backbone("VGG19", "block6_conv1", "none", 32)
    with pytest.raises(ValueError, match="unknown encoder kind"):
        build_encoder("resnet")


def test_failed_imagenet_download_says_how_to_work_offline(monkeypatch):
    from keras.src.utils import file_utils

    def offline(*args, **kwargs):
        raise Exception("URL fetch failure on the weights origin: no network")

    monkeypatch.setattr(file_utils, "get_file", offline)
    with pytest.raises(RuntimeError, match="set encoder.weights to its path"):
        keras_app_backbone("VGG19", "block5_conv4", "imagenet", 32)


@pytest.mark.parametrize("weights", ["none", "None", " NONE ", ""])
def test_weights_keywords_ignore_case(weights):
    encoder = keras_app_backbone("VGG19", "block1_conv2", weights, 32)
    assert tuple(encoder.output_shape) == (None, 32, 32, 64)


# encoder_flops --------------------------------------------------------------------------------

def test_encoder_flops_counts_two_per_multiply_add():
    from models.encoder import encoder_flops
    inputs = keras.Input((16, 16, 3))
    conv = keras.layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False)(inputs)
    dense = keras.layers.Dense(5, use_bias=False)(keras.layers.Flatten()(conv))
    model = keras.Model(inputs, dense)
    macs = 8 * 8 * 3 * 3 * 3 * 8 + 8 * 8 * 8 * 5  # the conv's 8x8 outputs, then the matmul
    assert encoder_flops(model) == 2 * macs


def test_encoder_flops_orders_the_encoders_the_server_tells_apart():
    from models.encoder import encoder_flops
    demo = encoder_flops(build_encoder("small_cnn", image_size=64, width=16, grid_size=8))
    assert 0.05e9 < demo < 0.08e9  # about 30 M multiply-adds, as its docstring says
    mobilenet = encoder_flops(build_encoder("keras_app", application="MobileNetV2",
                                            layer="out_relu", weights="none", image_size=224))
    assert 0.5e9 < mobilenet < 0.7e9  # MobileNetV2's published 300 M multiply-adds
