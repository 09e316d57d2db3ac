"""Location-wise soft attention: a spatial transformer's window (Jaderberg et al. 2015)."""
from __future__ import annotations

from typing import Sequence

import keras
import numpy as np
from keras import ops

from models import grid_sampling
from models.decoder_options import TRANSFORMS as FORMS
from models.location_network import AnnotationsAndStateBuild, LocationNetwork

# Multiplies the localization network's output layer: the transform's step
# size under Adam, a tenth of the decoder's (Jaderberg et al. train the
# localization network at a lower learning rate).
OUTPUT_SCALE = 0.1
_TINY = 1e-6
# Smallest half-width of the window's tent, in cells: with 1, a window centred on a
# cell would weigh that cell alone and pass no gradient to its centre.
MIN_HALF_WIDTH = 1.25


@keras.saving.register_keras_serializable(package="captioner")
class SpatialTransformerAttention(AnnotationsAndStateBuild, keras.layers.Layer):
    """A differentiable window on the annotation grid, placed by a localization network.

    At step t the localization network (`LocationNetwork` on `h_{t-1}` and a
    coarse map of the grid) predicts the transform from the output window to
    the grid, in grid coordinates (`models.grid_sampling`): the attention
    form `[[s, 0, t_x], [0, s, t_y]]` (`form="attention"`: a square window of
    half-width `s` centred at `t`), or the full `[[a, b, t_x], [c, d, t_y]]`
    (`form="affine"`). Its output kernel starts at zero and its bias at a
    centred window of half-width `scale` (the identity-like start). The
    sampler reads the window: with the attention form, through a separable
    bilinear filter of the window's size (`grid_sampling.tent_weights`: 1 at
    the centre, 0 at the window's edges; with a window two cells wide, plain
    bilinear interpolation); with the affine form, the mean bilinear weights
    of `(max(H, W) + 1)^2` samples of the window, spaced under a cell apart
    while the window is no larger than the grid. The weights are the
    attention map `alpha_t` (batch, L), sum to 1, peak where the window is
    centred, and are differentiable in the transform; the
    context is `z_t = sum_i alpha_ti a_i`, so the decoder treats it as soft
    attention (gate, context products).

    The guard: the scale (`s`, or `sqrt|det|` of the affine part) is clamped
    to `[scale_min, scale_max]` and the centre to the grid, and a window is
    never narrower than `2 MIN_HALF_WIDTH` cells, so it can neither shrink to nothing nor
    leave the grid (an empty window reads zeros and passes no gradient).
    `guard` is 1 where a clamp changed the predicted transform and
    `guard_penalty` its squared excess, which the objective adds to the
    loss so that the clamped values return (the clamp itself passes no
    gradient).

    Args:
      units: width of the localization network.
      grid_shape: `(H, W)` of the annotation grid (None: square).
      form: `"attention"` or `"affine"`.
      scale: half-width of the initial window in grid coordinates (1 = the grid).
      scale_min, scale_max: the guard's range of the scale.
      channels: per-cell numbers of the localization network's map (0: `h` only).

    Call args:
      annotations: (batch, L, D).
      hidden: (batch, n) `h_{t-1}`.
      projected: optional `project(annotations)`.
      mask: optional (batch, L) bool, True = keep; masked cells get 0 weight.
      training: unused (deterministic).

    Returns:
      `(context, alpha, location)`: (batch, D) in the compute dtype, (batch, L)
      and (batch, 3) `(t_x, t_y, scale)` float32.
    """

    def __init__(self, units: int, grid_shape: Sequence[int] | None = None,
                 form: str = "attention", scale: float = 0.5, scale_min: float = 0.1,
                 scale_max: float = 1.0, channels: int = 4, **kwargs):
        super().__init__(**kwargs)
        if form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {form!r}")
        if not 0 < scale_min <= scale <= scale_max:
            raise ValueError(f"need 0 < scale_min <= scale <= scale_max, got {scale_min}, "
                             f"{scale}, {scale_max}")
        self.units = int(units)
        self.grid_shape = None if not grid_shape else [int(v) for v in grid_shape]
        self.form = form
        self.scale = float(scale)
        self.scale_min = float(scale_min)
        self.scale_max = float(scale_max)
        self.channels = int(channels)

    def build(self, annotations_shape, hidden_shape):
        regions = int(annotations_shape[-2])
        self._grid = grid_sampling.grid_shape_for(self.grid_shape, regions)
        s = self.scale
        initial = [s, 0.0, 0.0] if self.form == "attention" else [s, 0.0, 0.0, 0.0, s, 0.0]
        self.location_network = LocationNetwork(
            self.units, len(initial), channels=self.channels, output_scale=OUTPUT_SCALE,
            initial_output=initial, dtype=self.dtype_policy, name="location_network")
        self.location_network.build(annotations_shape, hidden_shape)
        if self.form == "affine":
            k = max(self._grid) + 1
            u = (np.arange(k, dtype="float32") + 0.5) * (2.0 / k) - 1.0  # k sub-window centres
            self._points = np.stack(np.meshgrid(u, u), -1).reshape(-1, 2)   # (k*k, 2) (u, v)
        self._shapes = ([None, regions, int(annotations_shape[-1])], [None, int(hidden_shape[-1])])
        self.built = True

    def project(self, annotations):
        """The localization network's map of the grid (batch, units), once per sequence."""
        return self.location_network.project(annotations)

    def _clamp(self, value, low, high):
        """`(clamped value, squared excess)` of a float32 tensor."""
        clamped = ops.clip(value, low, high)
        return clamped, ops.square(value - clamped)

    def transform(self, projected, hidden):
        """The guarded transform of one step.

        Returns:
          dict: `linear` (batch, 2, 2) (attention form: `s I`), `centre`
          (batch, 2), `scale` (batch,), `guard` (batch,) 1.0 where a clamp
          acted, `guard_penalty` (batch,) the clamps' squared excess.
        """
        theta = self.location_network.locate(projected, hidden)           # (batch, 3 or 6)
        if self.form == "attention":
            raw_scale, raw_centre = theta[:, 0], theta[:, 1:3]
            scale, scale_excess = self._clamp(raw_scale, self.scale_min, self.scale_max)
            eye = ops.eye(2, dtype="float32")
            linear = scale[:, None, None] * eye
        else:
            raw_linear = ops.reshape(ops.stack([theta[:, 0], theta[:, 1], theta[:, 3],
                                                theta[:, 4]], -1), (-1, 2, 2))
            raw_centre = ops.stack([theta[:, 2], theta[:, 5]], -1)
            det = (raw_linear[:, 0, 0] * raw_linear[:, 1, 1]
                   - raw_linear[:, 0, 1] * raw_linear[:, 1, 0])
            raw_scale = ops.sqrt(ops.abs(det) + _TINY)
            scale, scale_excess = self._clamp(raw_scale, self.scale_min, self.scale_max)
            linear = raw_linear * (scale / raw_scale)[:, None, None]
        centre, centre_excess = self._clamp(raw_centre, -1.0, 1.0)
        penalty = scale_excess + ops.sum(centre_excess, axis=-1)
        return {"linear": linear, "centre": centre, "scale": scale,
                "guard": ops.cast(penalty > 0, "float32"), "guard_penalty": penalty}

    def window_weights(self, transform, mask=None):
        """(batch, L) float32 cell weights of the window (sum to 1)."""
        height, width = self._grid
        centre, linear = transform["centre"], transform["linear"]
        if self.form == "attention":
            scale = transform["scale"]
            wx = grid_sampling.tent_weights(
                grid_sampling.to_cells(centre[:, 0], width),
                ops.maximum(scale * (width / 2.0), MIN_HALF_WIDTH), width)
            wy = grid_sampling.tent_weights(
                grid_sampling.to_cells(centre[:, 1], height),
                ops.maximum(scale * (height / 2.0), MIN_HALF_WIDTH), height)
            weights = grid_sampling.outer_weights(wy, wx)
        else:
            points = ops.einsum("bij,pj->bpi", linear, self._points) + centre[:, None, :]
            wx = grid_sampling.box_weights(grid_sampling.to_cells(points[..., 0], width), 0.5,
                                           width)
            wy = grid_sampling.box_weights(grid_sampling.to_cells(points[..., 1], height), 0.5,
                                           height)
            weights = ops.mean(grid_sampling.outer_weights(wy, wx), axis=1)
        return grid_sampling.masked_rows(weights, mask)

    def attend(self, projected, hidden, mask=None):
        """One step: dict of `alpha` (batch, L), `location` (batch, 3), `guard`, `guard_penalty`."""
        transform = self.transform(projected, hidden)
        return {"alpha": self.window_weights(transform, mask),
                "location": grid_sampling.location_triple(transform["centre"],
                                                          transform["scale"]),
                "guard": transform["guard"], "guard_penalty": transform["guard_penalty"]}

    def weighted_context(self, weights, annotations):
        """`sum_i weights_i a_i`: (batch, L) x (batch, L, D) -> (batch, D)."""
        annotations = ops.cast(annotations, self.compute_dtype)
        return ops.einsum("bl,bld->bd", ops.cast(weights, self.compute_dtype), annotations)

    def call(self, annotations, hidden, projected=None, mask=None, training=None):
        if projected is None:
            projected = self.project(annotations)
        out = self.attend(projected, hidden, mask)
        return self.weighted_context(out["alpha"], annotations), out["alpha"], out["location"]

    def get_config(self):
        config = super().get_config()
        config.update({"units": self.units, "grid_shape": self.grid_shape, "form": self.form,
                       "scale": self.scale, "scale_min": self.scale_min,
                       "scale_max": self.scale_max, "channels": self.channels})
        return config
