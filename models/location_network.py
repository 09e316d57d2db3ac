"""The "where" network of the location-wise attentions: decoder state and image -> location."""
from __future__ import annotations

from typing import Sequence

import keras
from keras import ops


class AnnotationsAndStateBuild:
    """Keras build-config round trip for a layer built from (annotations, state) shapes.

    The layer's `build(annotations_shape, hidden_shape)` sets `self._shapes`
    to the two shapes; saving and loading rebuild it from them.
    """

    def get_build_config(self):
        if not self.built:
            return None
        return {"annotations_shape": self._shapes[0], "hidden_shape": self._shapes[1]}

    def build_from_config(self, config):
        if config:
            self.build(tuple(config["annotations_shape"]), tuple(config["hidden_shape"]))


@keras.saving.register_keras_serializable(package="captioner")
class LocationNetwork(AnnotationsAndStateBuild, keras.layers.Layer):
    """`out = m (W_o relu(W_h h + U vec(a C) + b) + b_o)`, in float32.

    The location network of a glimpse (Mnih et al. 2014) and the
    localization network of a spatial transformer (Jaderberg et al. 2015)
    for a captioner: it reads the previous LSTM state `h_{t-1}` and, unless
    `channels` is 0, a coarse map of the whole annotation grid: each cell
    reduced to `channels` numbers by `C` (D -> c), the map flattened and read
    by `U` ((L c) -> units). The map is the "context network" of Ba et al.
    2015 (Multiple Object Recognition with Visual Attention): the decoder sees
    the image only through its mean annotation and its past glimpses, and a
    fresh location policy that cannot see where the objects are looks at
    the same place for every image. `U vec(a C)` does not depend on the
    step: `project()` computes it once per sequence. `m` (`output_scale`)
    scales the output layer, and so, under Adam, the step size of what it
    predicts (a spatial transformer's transform wants a smaller one than the
    decoder's, Jaderberg et al. 2015).

    Args:
      units: width of the hidden layer.
      outputs: number of outputs.
      channels: numbers per cell of the image map (0: read `h` only, as RAM).
      output_scale: `m`.
      initial_output: the output at initialization for every input: the
        output kernel starts at zero and `b_o` at `initial_output / m`
        (a spatial transformer's identity-like start). None: a small
        random kernel (0.1 x Glorot) and a zero bias, so the output starts
        near 0 but depends on the input.

    Call args:
      annotations: (batch, L, D).
      hidden: (batch, n) `h_{t-1}`.
      projected: optional `project(annotations)`.

    Returns:
      (batch, outputs) float32.
    """

    def __init__(self, units: int, outputs: int, channels: int = 4, output_scale: float = 1.0,
                 initial_output: Sequence[float] | None = None, **kwargs):
        super().__init__(**kwargs)
        self.units = int(units)
        self.outputs = int(outputs)
        self.channels = int(channels)
        self.output_scale = float(output_scale)
        self.initial_output = None if initial_output is None else [float(v) for v in
                                                                    initial_output]
        if self.initial_output is not None and len(self.initial_output) != self.outputs:
            raise ValueError(f"initial_output has {len(self.initial_output)} values, "
                             f"not outputs={self.outputs}")
        if self.output_scale <= 0:
            raise ValueError(f"output_scale must be positive, got {output_scale}")

    def build(self, annotations_shape, hidden_shape):
        regions, dim = int(annotations_shape[-2]), int(annotations_shape[-1])
        policy = self.dtype_policy
        self.hidden_layer = keras.layers.Dense(self.units, dtype=policy, name="hidden_layer")
        self.hidden_layer.build(hidden_shape)
        if self.channels > 0:
            self.cell_projection = keras.layers.Dense(       # C
                self.channels, use_bias=False, dtype=policy, name="cell_projection")
            self.cell_projection.build(annotations_shape)
            self.map_projection = keras.layers.Dense(        # U
                self.units, use_bias=False, dtype=policy, name="map_projection")
            self.map_projection.build((None, regions * self.channels))
        if self.initial_output is None:
            kernel = keras.initializers.VarianceScaling(0.01, "fan_avg", "uniform")  # 0.1 x Glorot
            bias = "zeros"
        else:
            kernel = "zeros"
            bias = keras.initializers.Constant(
                [v / self.output_scale for v in self.initial_output])
        # float32 weights read in float32 (autocast=False): locations are coordinates.
        self.output_kernel = self.add_weight(shape=(self.units, self.outputs), initializer=kernel,
                                             autocast=False, name="output_kernel")
        self.output_bias = self.add_weight(shape=(self.outputs,), initializer=bias,
                                           autocast=False, name="output_bias")
        self._shapes = ([None, regions, dim], [None, int(hidden_shape[-1])])
        self.built = True

    def project(self, annotations):
        """`U vec(a C)`: (batch, L, D) -> (batch, units), compute dtype; zeros without a map."""
        annotations = ops.cast(annotations, self.compute_dtype)
        if self.channels == 0:
            return ops.zeros((ops.shape(annotations)[0], self.units), self.compute_dtype)
        cells = self.cell_projection(annotations)                           # (batch, L, c)
        flat = ops.reshape(cells, (ops.shape(cells)[0], -1))
        return self.map_projection(flat)

    def locate(self, projected, hidden):
        """The outputs from `project()`'s map and `h_{t-1}`: (batch, outputs) float32."""
        pre = self.hidden_layer(ops.cast(hidden, self.compute_dtype)) + ops.cast(
            projected, self.compute_dtype)
        features = ops.cast(ops.relu(pre), "float32")
        out = ops.matmul(features, self.output_kernel) + self.output_bias
        return self.output_scale * out

    def call(self, annotations, hidden, projected=None):
        if projected is None:
            projected = self.project(annotations)
        return self.locate(projected, hidden)

    def get_config(self):
        config = super().get_config()
        config.update({"units": self.units, "outputs": self.outputs, "channels": self.channels,
                       "output_scale": self.output_scale, "initial_output": self.initial_output})
        return config
