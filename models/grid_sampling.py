"""Reading the annotation grid at continuous locations: box-filtered sampling and footprints.

The location-wise attentions (`GlimpseAttention`, `SpatialTransformerAttention`)
place windows on the `H x W` grid of annotation vectors (`L = H * W`, cell
`i = y * W + x`). Locations are in grid coordinates: x and y run from -1 (the
left or top edge of the grid, i.e. of the image) to 1 (the right or bottom
edge), so cell `j` spans `[-1 + 2j / W, -1 + 2(j + 1) / W]`.

A sample reads the grid through a box of half-width `r >= 1/2` cells around
its centre: each cell gets the length of its overlap with the box, divided by
the box's overlap with the grid. With `r = 1/2` that is bilinear
interpolation; with `r` half the spacing of the samples, it is the area
average a resize to fewer samples takes (no cell is skipped). A sample
centre is clipped to the centres of the outer cells, so a box never leaves
the grid and its weights always sum to 1; the weights are piecewise linear
in the centre and the width, so the sampling is differentiable in both.
A window read whole (`tent_weights`) weighs the cells with a tent, 1 at its
centre and 0 at its edges, evaluated at the cell centres: with a half-width
of one cell that is bilinear interpolation, and a wider window is a
bilinear filter of its own size, so its weights peak at its centre (the
attention map's argmax is where it looks). Two-dimensional weights are
products of the x and y weights.
"""
from __future__ import annotations

from keras import ops

# Smallest in-grid overlap a box's weights are divided by (cells).
_TINY = 1e-6


def to_cells(coordinate, size: int):
    """Grid coordinate in [-1, 1] -> continuous cell index (cell `j`'s centre is `j`)."""
    return (ops.cast(coordinate, "float32") + 1.0) * (size / 2.0) - 0.5


def box_weights(centres, half_width, size: int):
    """The weight of every cell of one grid axis for boxes around `centres`.

    Args:
      centres: (...) float32 box centres in cell units (cell `j`'s centre is `j`).
      half_width: float or tensor broadcastable to `centres`, in cells, at least 1/2.
      size: cells along the axis.
    Returns:
      (..., size) float32 weights, each row summing to 1.
    """
    centres = ops.clip(ops.cast(centres, "float32"), 0.0, float(size - 1))[..., None]
    half_width = ops.cast(half_width, "float32")
    if len(getattr(half_width, "shape", ())) > 0:
        half_width = half_width[..., None]
    cells = ops.arange(size, dtype="float32")
    low = ops.maximum(centres - half_width, cells - 0.5)
    high = ops.minimum(centres + half_width, cells + 0.5)
    overlap = ops.maximum(high - low, 0.0)                             # (..., size)
    return overlap / ops.maximum(ops.sum(overlap, axis=-1, keepdims=True), _TINY)


def tent_weights(centres, half_width, size: int):
    """The weight of every cell of one grid axis for tents around `centres`.

    Args:
      centres: (...) float32 centres in cell units, within `[-1/2, size - 1/2]`
        (the grid); not clipped, so the gradient reaches the grid's edge.
      half_width: tensor broadcastable to `centres`, in cells, at least 1.
      size: cells along the axis.
    Returns:
      (..., size) float32 weights `max(0, 1 - |j - c| / r)`, normalised to sum to 1.
    """
    centres = ops.cast(centres, "float32")[..., None]
    half_width = ops.cast(half_width, "float32")[..., None]
    cells = ops.arange(size, dtype="float32")
    weights = ops.relu(1.0 - ops.abs(cells - centres) / half_width)     # (..., size)
    return weights / ops.maximum(ops.sum(weights, axis=-1, keepdims=True), _TINY)


def outer_weights(y_weights, x_weights):
    """(..., H) and (..., W) axis weights -> (..., H * W) cell weights (`i = y * W + x`)."""
    grid = y_weights[..., :, None] * x_weights[..., None, :]           # (..., H, W)
    shape = ops.shape(grid)
    return ops.reshape(grid, (*shape[:-2], shape[-2] * shape[-1]))


def masked_rows(weights, mask):
    """`weights` (..., L), masked cells (`mask` (batch, L), True = keep) zeroed, renormalised."""
    if mask is None:
        return weights
    keep = ops.cast(mask, "float32")
    keep = ops.reshape(keep, (ops.shape(keep)[0],) + (1,) * (len(weights.shape) - 2)
                       + (ops.shape(keep)[-1],))
    weights = weights * keep
    return weights / ops.maximum(ops.sum(weights, axis=-1, keepdims=True), _TINY)


def grid_shape_for(grid_shape, regions: int) -> tuple[int, int]:
    """`(H, W)`: the given grid, or the square one of `regions` cells.

    Args:
      grid_shape: `(H, W)`, or None/empty/zeros for a square grid.
      regions: L, the cells of the annotations the layer is built on.
    Raises:
      ValueError: the grid does not have `regions` cells, or no square does.
    """
    if grid_shape and all(int(v) > 0 for v in grid_shape):
        height, width = (int(v) for v in grid_shape)
    else:
        side = int(round(regions ** 0.5))
        if side * side != regions:
            raise ValueError(f"{regions} regions are not a square grid: give grid_shape=(H, W)")
        height = width = side
    if height * width != regions:
        raise ValueError(f"grid_shape {height}x{width} does not have the annotations' "
                         f"{regions} regions")
    return height, width


def location_triple(centre, scale):
    """(batch, 2) centres and a (batch,) or scalar scale -> (batch, 3) `(x, y, scale)` float32."""
    centre = ops.cast(centre, "float32")
    scale = ops.cast(scale, "float32") * ops.ones_like(centre[:, :1])[:, 0]
    return ops.concatenate([centre, scale[:, None]], axis=-1)
