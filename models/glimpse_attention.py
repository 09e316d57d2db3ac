"""Location-wise hard attention: glimpses of the Recurrent Attention Model (Mnih et al. 2014)."""
from __future__ import annotations

import math
from typing import Sequence

import keras
import numpy as np
from keras import ops

from models import grid_sampling
from models.decoder_options import MIN_GLIMPSE_STD as MIN_STD
from models.location_network import AnnotationsAndStateBuild, LocationNetwork

# Pre-tanh bound of the location mean (tanh(2) = 0.964): beyond it the mean
# is within 4% of the border, tanh's gradient is under 0.07 and a policy that
# drifted there would stay; the guard penalty pulls it back.
GUARD_BOUND = 2.0
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


@keras.saving.register_keras_serializable(package="captioner")
class GlimpseAttention(AnnotationsAndStateBuild, keras.layers.Layer):
    """A glimpse at a sampled location: RAM's location, sensor and glimpse networks.

    At step t the location network (`LocationNetwork` on `h_{t-1}`, whose
    gradient is stopped, and a coarse map of the grid) gives the mean
    `mu_t = tanh(.)` in [-1, 1]^2 (grid coordinates, `models.grid_sampling`).
    In training the location is sampled, `l_t ~ N(mu_t, std^2 I)`, with its
    gradient stopped and clipped to the grid, and `sample_log_prob = log N(l_t;
    mu_t, std)` carries the REINFORCE gradient to the policy through `mu_t`
    only; at inference `l_t = mu_t`. The sensor (`retina = (k, g, s)`) reads
    `k` patches of `g x g` samples around `l_t`, each `s` times wider than
    the last (the first samples single cells), each sample the area average
    of the cells under it (a resize to `g x g`). The glimpse network
    combines them, `z_t = relu(W [relu(W_r retina + b_r); relu(W_l l_t + b_l)]
    + b)`, into a context of the annotations' size D. The retina is read from
    `a W_v` (D -> units, once per sequence; sampling is linear, so that equals
    projecting the samples).

    The attention map `alpha_t` (batch, L) is the glimpse's footprint: each
    patch as a bilinear filter of its own extent around `l_t`
    (`grid_sampling.tent_weights`), weighted by its resolution (patch i by
    `s^-2i`, normalised). It sums to 1 and peaks at `l_t`, where the glimpse
    sees sharpest (the mean of the samples' weights is flat over each patch
    and piles up at the grid's edge, where clipped samples meet).

    `baseline` is a learned `f(h_{t-1}) = w_b^T h_{t-1} + c_b` (gradient of
    `h` stopped), which the decoder's objective adds to its reward baseline
    and regresses onto what that baseline misses (`models.objective`).
    `guard` is 1 where a pre-tanh mean coordinate is beyond `GUARD_BOUND`,
    and `guard_penalty` the squared excess, which the objective adds to the
    loss.

    Args:
      units: width of the location, retina and location-feature layers.
      grid_shape: `(H, W)` of the annotation grid (None: square).
      std: standard deviation of the location policy, at least `MIN_STD`.
      retina: `(k, g, s)`: `k` patches per glimpse of `g x g` samples, each
        `s` times wider than the last (`s >= 1`).
      channels: per-cell numbers of the location network's map (0: `h` only).
      seed: optional int seed of the location sampler.

    Call args:
      annotations: (batch, L, D).
      hidden: (batch, n) `h_{t-1}`.
      projected: optional `project(annotations)`.
      mask: optional (batch, L) bool, True = keep; masked cells are not read.
      training: sample the location (else the mean).
      noise: optional (batch, 2) standard normal noise (`sample_noise`).

    Returns:
      `(context, alpha, location, sample_log_prob, baseline)`: (batch, D) in the
      compute dtype; float32 (batch, L), (batch, 3) `(x, y, scale)` (scale: the
      first patch's half-width in grid coordinates), (batch,) (0 at
      inference) and (batch,).
    """

    def __init__(self, units: int, grid_shape: Sequence[int] | None = None, std: float = 0.1,
                 retina: Sequence[float] = (2, 3, 2.0), channels: int = 4,
                 seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        if not std >= MIN_STD:
            raise ValueError(f"std={std} is below {MIN_STD}: the REINFORCE gradient "
                             "(l - mu) / std^2 would overflow")
        patches, size, scale = retina
        if patches < 1 or size < 1 or scale < 1.0:
            raise ValueError(f"need retina (patches, size, scale) with patches >= 1, size >= 1 "
                             f"and scale >= 1, got {tuple(retina)}")
        self.units = int(units)
        self.grid_shape = None if not grid_shape else [int(v) for v in grid_shape]
        self.std = float(std)
        self.patches, self.size, self.scale = int(patches), int(size), float(scale)
        self.retina = [self.patches, self.size, self.scale]
        self.channels = int(channels)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed, name="location_seed")

    def build(self, annotations_shape, hidden_shape):
        regions, dim = int(annotations_shape[-2]), int(annotations_shape[-1])
        self._grid = grid_sampling.grid_shape_for(self.grid_shape, regions)
        policy, units = self.dtype_policy, self.units

        def dense(width, name, shape, **kw):
            layer = keras.layers.Dense(width, dtype=policy, name=name, **kw)
            layer.build(shape)
            return layer

        self.location_network = LocationNetwork(units, 2, channels=self.channels,
                                                dtype=policy, name="location_network")
        self.location_network.build(annotations_shape, hidden_shape)
        self.retina_projection = dense(units, "retina_projection", annotations_shape,
                                       use_bias=False)                      # W_v
        samples = self.patches * self.size * self.size
        self.retina_layer = dense(units, "retina_layer", (None, samples * units),
                                  activation="relu")                       # W_r, b_r
        self.where_layer = dense(units, "where_layer", (None, 2), activation="relu")  # W_l, b_l
        self.glimpse_layer = dense(dim, "glimpse_layer", (None, 2 * units),
                                   activation="relu")                      # W, b
        self.baseline_kernel = self.add_weight(shape=(int(hidden_shape[-1]), 1),
                                               initializer=keras.initializers.VarianceScaling(
                                                   0.01, "fan_avg", "uniform"), autocast=False,
                                               name="baseline_kernel")
        self.baseline_bias = self.add_weight(shape=(1,), initializer="zeros", autocast=False,
                                             name="baseline_bias")
        # (patches, size) sample offsets from the centre and box half-widths, in cells.
        spans = np.array([self.scale ** i for i in range(self.patches)], "float32")
        steps = np.arange(self.size, dtype="float32") - (self.size - 1) / 2.0
        self._offsets = spans[:, None] * steps[None, :]
        self._half_widths = np.repeat(spans[:, None] / 2.0, self.size, axis=1)
        # The footprint: patch i's extent (half-width, cells) and weight s^-2i (summing to 1).
        self._extents = [float(self.size * span / 2.0) for span in spans]
        resolution = spans ** -2.0
        self._resolution = [float(v) for v in resolution / resolution.sum()]
        self._shapes = ([None, regions, dim], [None, int(hidden_shape[-1])])
        self.built = True

    # ---------------------------------------------------------------- pieces

    def project(self, annotations):
        """Once per sequence: `(a W_v` (batch, L, units), the location map (batch, units))`."""
        annotations = ops.cast(annotations, self.compute_dtype)
        return (self.retina_projection(annotations),
                self.location_network.project(annotations))

    def sample_noise(self, shape):
        """Standard normal noise of `shape` (float32), one fresh draw per call."""
        return keras.random.normal(shape, dtype="float32", seed=self.seed_generator)

    def location_scale(self) -> float:
        """Half-width of the first patch in grid coordinates (`size` cells of `W`)."""
        return self.size / float(self._grid[1])

    def sampling_weights(self, location, mask=None):
        """(batch, k g g, L) float32 cell weights of the retina samples at `location` (batch, 2)."""
        height, width = self._grid
        x = grid_sampling.to_cells(location[:, 0], width)[:, None, None] + self._offsets
        y = grid_sampling.to_cells(location[:, 1], height)[:, None, None] + self._offsets
        wx = grid_sampling.box_weights(x, self._half_widths, width)       # (batch, k, g, W)
        wy = grid_sampling.box_weights(y, self._half_widths, height)      # (batch, k, g, H)
        # (batch, k, g_y, 1, H, 1) x (batch, k, 1, g_x, 1, W) -> (batch, k, g_y, g_x, H, W)
        grid = wy[:, :, :, None, :, None] * wx[:, :, None, :, None, :]
        weights = ops.reshape(grid, (ops.shape(grid)[0], -1, height * width))
        return grid_sampling.masked_rows(weights, mask)

    def footprint(self, location, mask=None):
        """(batch, L) float32 attention map of a glimpse at `location` (batch, 2) (sums to 1)."""
        height, width = self._grid
        x = grid_sampling.to_cells(location[:, 0], width)
        y = grid_sampling.to_cells(location[:, 1], height)
        total = 0.0
        for extent, weight in zip(self._extents, self._resolution, strict=True):
            half = ops.ones_like(x) * max(extent, 1.0)
            total += weight * grid_sampling.outer_weights(
                grid_sampling.tent_weights(y, half, height),
                grid_sampling.tent_weights(x, half, width))
        return grid_sampling.masked_rows(total, mask)

    def glimpse(self, retina_source, location, mask=None):
        """`(context (batch, D), footprint (batch, L))` of a glimpse at `location` (batch, 2)."""
        weights = self.sampling_weights(ops.stop_gradient(location), mask)
        retina = ops.einsum("bpl,blu->bpu", ops.cast(weights, self.compute_dtype),
                            ops.cast(retina_source, self.compute_dtype))
        retina = ops.reshape(retina, (ops.shape(retina)[0], -1))
        features = ops.concatenate(
            [self.retina_layer(retina),
             self.where_layer(ops.cast(ops.stop_gradient(location), self.compute_dtype))], -1)
        return self.glimpse_layer(features), self.footprint(ops.stop_gradient(location), mask)

    def attend(self, projected, hidden, mask=None, training=False, noise=None,
               expected=False):
        """One step: the policy, the location, the glimpse and the baseline.

        Args:
          projected: `project(annotations)`.
          hidden: (batch, n) `h_{t-1}`.
          mask: optional (batch, L) bool.
          training: sample (else the mean).
          noise: optional (batch, 2) standard normal noise.
          expected: also `expected_context`, the glimpse at the mean (no
            gradient), for the decoder's counterfactual reward baseline.
        Returns:
          dict of `context`, `alpha`, `location`, `sample_log_prob`, `baseline`
          (as `call` returns them), `mean` (batch, 2), `guard` and
          `guard_penalty` (batch,) float32, and maybe `expected_context`.
        """
        retina_source, location_map = projected
        state = ops.stop_gradient(ops.cast(hidden, "float32"))
        raw = self.location_network.locate(location_map, ops.stop_gradient(hidden))  # (batch, 2)
        mean = ops.tanh(raw)
        if training:
            if noise is None:
                noise = self.sample_noise(ops.shape(mean))
            sample = ops.stop_gradient(mean + self.std * ops.cast(noise, "float32"))
            z = (sample - mean) / self.std
            log_prob = ops.sum(-0.5 * ops.square(z) - math.log(self.std) - _LOG_SQRT_2PI, -1)
            location = ops.clip(sample, -1.0, 1.0)
        else:
            location, log_prob = mean, ops.zeros_like(mean[:, 0])
        location = ops.stop_gradient(location)
        context, alpha = self.glimpse(retina_source, location, mask)
        baseline = ops.matmul(state, self.baseline_kernel)[:, 0] + self.baseline_bias[0]
        excess = ops.relu(ops.abs(raw) - GUARD_BOUND)
        extra = {}
        if expected:
            extra["expected_context"] = ops.stop_gradient(
                self.glimpse(retina_source, ops.stop_gradient(mean), mask)[0])
        return {**extra, "context": context, "alpha": alpha, "mean": mean,
                "location": grid_sampling.location_triple(location, self.location_scale()),
                "sample_log_prob": log_prob, "baseline": baseline,
                "guard": ops.cast(ops.any(excess > 0, axis=-1), "float32"),
                "guard_penalty": ops.sum(ops.square(excess), axis=-1)}

    def call(self, annotations, hidden, projected=None, mask=None, training=None, noise=None):
        if projected is None:
            projected = self.project(annotations)
        out = self.attend(projected, hidden, mask, training=bool(training), noise=noise)
        return (out["context"], out["alpha"], out["location"], out["sample_log_prob"],
                out["baseline"])

    def get_config(self):
        config = super().get_config()
        config.update({"units": self.units, "grid_shape": self.grid_shape, "std": self.std,
                       "retina": self.retina, "channels": self.channels, "seed": self.seed})
        return config
