"""Annotation encoders: a CNN from an image to its conv grid `(H, W, D)` (paper section 3.1.1).

Two kinds:
  * any `keras.applications` model cut at a named conv layer (the paper:
    VGG19 `block5_conv4`, 14x14x512 at 224x224), with ImageNet weights, a
    local weights file, or none;
  * the project's small CNN, trained by the EncoderTrainer stage on caption
    words when no pretrained weights are available (offline).
Both take float images in [0, 255] (`models.image_ops.decode_and_resize`) and
normalize inside the model, so export and preprocessing share one graph.
"""
from __future__ import annotations

import dataclasses
import math
import os

import keras
from keras import layers, ops

# keras.applications name (lower case) -> the normalization its preprocess_input
# applies. Families not listed (EfficientNet, EfficientNetV2, ConvNeXt, MobileNetV3)
# normalize inside the model, so their preprocess_input is the identity.
_NORMALIZATION = {
    "vgg16": "caffe", "vgg19": "caffe", "resnet50": "caffe", "resnet101": "caffe",
    "resnet152": "caffe", "inceptionv3": "tf", "inceptionresnetv2": "tf", "xception": "tf",
    "mobilenet": "tf", "mobilenetv2": "tf", "resnet50v2": "tf", "resnet101v2": "tf",
    "resnet152v2": "tf", "nasnetlarge": "tf", "nasnetmobile": "tf", "densenet121": "torch",
    "densenet169": "torch", "densenet201": "torch",
}


def normalization_mode(application: str) -> str:
    """The `ImageNormalization` mode equal to `keras.applications`' preprocessing for a model.

    Args:
      application: the class name in `keras.applications`, e.g. `VGG19`.
    Returns:
      `caffe`, `tf`, `torch`, or `none` for models that normalize inside.
    """
    return _NORMALIZATION.get(application.lower(), "none")


@keras.saving.register_keras_serializable(package="captioner")
class ImageNormalization(layers.Layer):
    """Maps [0, 255] RGB images to a network's expected input range.

    Args:
      mode: `scale` (x/255), `tf` ([-1, 1]), `caffe` (BGR, ImageNet mean
        subtracted), `torch` (ImageNet mean/std), or `none`.
    """

    def __init__(self, mode: str = "scale", **kwargs):
        super().__init__(**kwargs)
        if mode not in ("scale", "tf", "caffe", "torch", "none"):
            raise ValueError(f"unknown normalization mode {mode!r}")
        self.mode = mode

    def call(self, images):
        x = ops.cast(images, self.compute_dtype)
        if self.mode == "scale":
            return x / 255.0
        if self.mode == "tf":
            return x / 127.5 - 1.0
        if self.mode == "caffe":
            x = x[..., ::-1]
            return x - ops.convert_to_tensor([103.939, 116.779, 123.68], dtype=x.dtype)
        if self.mode == "torch":
            mean = ops.convert_to_tensor([0.485, 0.456, 0.406], dtype=x.dtype)
            std = ops.convert_to_tensor([0.229, 0.224, 0.225], dtype=x.dtype)
            return (x / 255.0 - mean) / std
        return x

    def get_config(self):
        return {**super().get_config(), "mode": self.mode}


@keras.saving.register_keras_serializable(package="captioner")
class CoordinateChannels(layers.Layer):
    """Appends each cell's (x, y) position in [-1, 1] to its feature vector.

    The attention context `z_t` is a weighted sum of annotation vectors, so
    without this the decoder cannot tell where it is looking, and relations
    such as "left of" cannot be learned from pooled features.

    Args:
      scale: multiplies the coordinates (to match the features' magnitude).
    """

    def __init__(self, scale: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.scale = scale

    def call(self, grid):
        shape = ops.shape(grid)
        h, w = shape[1], shape[2]
        ys = ops.linspace(-1.0, 1.0, h)
        xs = ops.linspace(-1.0, 1.0, w)
        yy = ops.repeat(ops.expand_dims(ys, 1), w, axis=1)
        xx = ops.repeat(ops.expand_dims(xs, 0), h, axis=0)
        coords = ops.stack([xx, yy], axis=-1) * self.scale  # (H, W, 2)
        coords = ops.broadcast_to(ops.expand_dims(coords, 0), (shape[0], h, w, 2))
        return ops.concatenate([grid, ops.cast(coords, grid.dtype)], axis=-1)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], None if input_shape[-1] is None else input_shape[-1] + 2)

    def get_config(self):
        return {**super().get_config(), "scale": self.scale}


def small_cnn_backbone(image_size: int = 64, width: int = 16, grid_size: int = 8,
                       name: str = "small_cnn") -> keras.Model:
    """The project's small CNN: a stride-2 stem, then conv blocks pooling down to the grid.

    The stride-2 stem keeps the full-resolution work small: at 64x64 input and
    width 16 it costs about 30M multiply-adds per image, so the EncoderTrainer
    fits in the demo's time budget on 2 CPU cores.

    Args:
      image_size: input side S (a power-of-two multiple of `grid_size`, at least 2x).
      width: channels of the stem; each pooling doubles them (at most 8x).
      grid_size: output grid side H = W.
    Returns:
      A model from `(S, S, 3)` [0, 255] images to `(grid, grid, D)` features.
    """
    ratio = image_size / grid_size
    stages = int(round(math.log2(ratio))) if ratio >= 2 else 0
    if stages < 1 or 2 ** stages != ratio:
        raise ValueError(f"image_size {image_size} must be grid_size {grid_size} "
                         "times a power of two (at least 2)")
    inputs = keras.Input((image_size, image_size, 3), name="image")
    x = ImageNormalization("scale", name="normalize")(inputs)

    def conv_bn_relu(x, channels, name, strides=1):
        x = layers.Conv2D(channels, 3, strides=strides, padding="same", use_bias=False,
                          name=f"{name}_conv")(x)
        x = layers.BatchNormalization(name=f"{name}_bn")(x)
        return layers.ReLU(name=f"{name}_relu")(x)

    x = conv_bn_relu(x, width, "stem", strides=2)
    channels = 2 * width
    for i in range(stages - 1):
        x = conv_bn_relu(x, channels, f"block{i + 1}a")
        if i > 0:
            x = conv_bn_relu(x, channels, f"block{i + 1}b")
        x = layers.MaxPooling2D(2, name=f"block{i + 1}_pool")(x)
        channels = min(2 * channels, 8 * width)
    x = conv_bn_relu(x, channels, "top")
    # The annotation layer: a last 3x3 conv at grid resolution widens each
    # cell's receptive field so a cell sees a whole (large) object.
    x = layers.Conv2D(channels, 3, padding="same", name="annotation_conv")(x)
    x = layers.ReLU(name="annotation")(x)
    return keras.Model(inputs, x, name=name)


def keras_app_backbone(application: str = "VGG19", layer: str = "block5_conv4",
                       weights: str = "imagenet", image_size: int = 224) -> keras.Model:
    """A `keras.applications` model cut at a conv layer.

    Args:
      application: the class name in `keras.applications` (e.g. `VGG19`, `ResNet50`).
      layer: the conv layer whose output is the annotation grid.
      weights: `imagenet` (downloaded by Keras on first use), `none`, or a
        path to a weights file of the application without its top
        (`include_top=False`): the `..._notop.h5` file Keras downloads for
        `imagenet` (copied for offline use), or a `.weights.h5` saved from
        such a model. The file does not depend on the image size.
    Returns:
      A model from `(S, S, 3)` [0, 255] images to the layer's `(H, W, D)` output.
    """
    if not hasattr(keras.applications, application):
        raise ValueError(f"keras.applications has no {application!r}")
    keyword = (weights or "none").strip().lower()
    weights_arg = {"": None, "none": None, "imagenet": "imagenet"}.get(keyword, weights)
    local_file = weights_arg not in (None, "imagenet")
    if local_file and not os.path.exists(weights_arg):
        raise FileNotFoundError(f"encoder weights file not found: {weights_arg}")
    try:
        app = getattr(keras.applications, application)(
            include_top=False, weights=None if local_file else weights_arg,
            input_shape=(image_size, image_size, 3))
    except Exception as e:  # Keras raises a bare Exception when the download fails.
        if weights_arg != "imagenet":
            raise
        raise RuntimeError(
            f"could not get the ImageNet weights of {application} ({e}). Offline, copy the "
            f"application's `..._notop.h5` file (Keras keeps it in ~/.keras/models) and set "
            f"encoder.weights to its path") from e
    if local_file:
        app.load_weights(weights_arg)
    try:
        out = app.get_layer(layer).output
    except ValueError:
        conv = [l.name for l in app.layers if "conv" in l.name][-8:]
        raise ValueError(f"{application} has no layer {layer!r}; last conv layers: {conv}") from None
    cut = keras.Model(app.input, out, name=f"{application.lower()}_{layer}")
    inputs = keras.Input((image_size, image_size, 3), name="image")
    x = ImageNormalization(normalization_mode(application), name="normalize")(inputs)
    return keras.Model(inputs, cut(x), name=cut.name)


@dataclasses.dataclass(frozen=True)
class EncoderSpec:
    """What `build_encoder` builds (the fields of the `encoder` config section it reads).

    Attributes:
      kind: `small_cnn` or `keras_app`.
      application, layer, weights: `keras_app_backbone`'s arguments.
      image_size: input side S.
      width, grid_size: `small_cnn_backbone`'s arguments.
      coord_channels: append (x, y) cell coordinates (D grows by 2).
    """
    kind: str = "small_cnn"
    application: str = "VGG19"
    layer: str = "block5_conv4"
    weights: str = "none"
    image_size: int = 64
    width: int = 16
    grid_size: int = 8
    coord_channels: bool = True


def build_encoder(spec: EncoderSpec | str = "small_cnn", backbone: keras.Model | None = None,
                  **fields) -> keras.Model:
    """The annotation encoder: image `(S, S, 3)` in [0, 255] -> grid `(H, W, D)`.

    Args:
      spec: an `EncoderSpec`, or its `kind` (`small_cnn` or `keras_app`) with
        the other fields as keyword arguments.
      backbone: an already built (e.g. trained) backbone to wrap instead.
      **fields: `EncoderSpec` fields (they override `spec`'s).
    """
    spec = EncoderSpec(kind=spec, **fields) if isinstance(spec, str) else (
        dataclasses.replace(spec, **fields) if fields else spec)
    if backbone is None:
        if spec.kind == "small_cnn":
            backbone = small_cnn_backbone(spec.image_size, spec.width, spec.grid_size)
        elif spec.kind == "keras_app":
            backbone = keras_app_backbone(spec.application, spec.layer, spec.weights,
                                          spec.image_size)
        else:
            raise ValueError(f"unknown encoder kind {spec.kind!r} (small_cnn or keras_app)")
    inputs = keras.Input((spec.image_size, spec.image_size, 3), name="image")
    grid = backbone(inputs)
    if spec.coord_channels:
        grid = CoordinateChannels(name="coordinates")(grid)
    return keras.Model(inputs, grid, name="encoder")


def word_classifier(backbone: keras.Model, num_words: int) -> keras.Model:
    """Backbone + global max pool + sigmoid word-presence head (EncoderTrainer).

    Max pooling makes each grid cell responsible for the words it sees, so
    the cells stay localized and attention over them is meaningful.
    """
    inputs = keras.Input(backbone.input_shape[1:], name="image")
    x = layers.GlobalMaxPooling2D(name="pool")(backbone(inputs))
    x = layers.Dropout(0.2, name="dropout")(x)
    # Logits in float32 under mixed precision, for a stable loss.
    outputs = layers.Dense(num_words, name="words", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="word_classifier")


def encoder_flops(encoder: keras.Model) -> int:
    """Floating-point operations of one image through `encoder` (TensorFlow's op costs).

    Counted by TensorFlow's graph profiler on a batch-1 trace: 2 per
    multiply-add of each convolution and matmul, plus the element-wise ops
    it has costs for. The demo's small CNN (64x64, width 16) is about 0.06
    GFLOPs; VGG19 to `block5_conv4` at 224x224, the paper's, about 39.
    """
    import tensorflow as tf
    from tensorflow.python.profiler import model_analyzer, option_builder
    from tensorflow.python.util import deprecation
    spec = tf.TensorSpec((1,) + tuple(encoder.input_shape[1:]), tf.float32)
    graph = tf.function(lambda images: encoder(images, training=False)) \
        .get_concrete_function(spec).graph
    options = (option_builder.ProfileOptionBuilder(
        option_builder.ProfileOptionBuilder.float_operation()).with_empty_output().build())
    with deprecation.silence():  # the profiler is TF1's API; it counts TF2 graphs too
        return int(model_analyzer.profile(graph, options=options).total_float_ops)
