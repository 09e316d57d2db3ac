"""grid_sampling: box and tent weights, coordinates, grid shapes."""
import numpy as np
import pytest
import tensorflow as tf

from models import grid_sampling


def _np(x):
    return np.asarray(tf.convert_to_tensor(x))


def test_coordinates_put_the_grid_edges_at_minus_one_and_one():
    np.testing.assert_allclose(_np(grid_sampling.to_cells([-1.0, 0.0, 1.0], 8)),
                               [-0.5, 3.5, 7.5])
    # cell j's centre is at -1 + (2j + 1) / W
    np.testing.assert_allclose(_np(grid_sampling.to_cells(-1 + 1 / 8, 8)), 0.0, atol=1e-6)


def test_box_of_half_a_cell_is_bilinear_interpolation():
    centres = np.array([0.0, 2.25, 3.5, 6.9], "float32")
    weights = _np(grid_sampling.box_weights(centres, 0.5, 8))
    want = np.maximum(0.0, 1.0 - np.abs(np.arange(8)[None] - centres[:, None]))
    np.testing.assert_allclose(weights, want, atol=1e-6)


def test_a_wide_box_averages_the_cells_under_it_and_never_leaves_the_grid():
    weights = _np(grid_sampling.box_weights(np.array([3.5, 0.0, 9.0, -4.0], "float32"), 2.0, 8))
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(weights[0], [0, 0, .25, .25, .25, .25, 0, 0], atol=1e-6)
    # At the edge (and beyond it: clipped to the outer cell) the in-grid part is averaged.
    np.testing.assert_allclose(weights[1], [1 / 2.5, 1 / 2.5, .5 / 2.5, 0, 0, 0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(weights[2], weights[1][::-1], atol=1e-6)
    np.testing.assert_allclose(weights[3], weights[1], atol=1e-6)


def test_tent_peaks_at_its_centre_and_is_differentiable_in_centre_and_width():
    centre, width = tf.constant([3.5, 1.0]), tf.constant([2.0, 1.25])
    with tf.GradientTape() as tape:
        tape.watch([centre, width])
        weights = grid_sampling.tent_weights(centre, width, 8)
        loss = tf.reduce_sum(weights * tf.range(8, dtype=tf.float32) ** 2)
    np.testing.assert_allclose(_np(weights).sum(-1), 1.0, rtol=1e-6)
    assert _np(weights)[1].argmax() == 1
    np.testing.assert_allclose(_np(weights)[0][[3, 4]], [0.375, 0.375])
    for g in tape.gradient(loss, [centre, width]):
        assert np.isfinite(_np(g)).all() and (np.abs(_np(g)) > 0).all()


def test_outer_weights_and_masks():
    y = tf.constant([[0.0, 1.0, 0.0]])
    x = tf.constant([[0.5, 0.5, 0.0]])
    cells = _np(grid_sampling.outer_weights(y, x))
    np.testing.assert_allclose(cells, [[0, 0, 0, .5, .5, 0, 0, 0, 0]])
    mask = np.ones((1, 9), bool)
    mask[0, 3] = False
    np.testing.assert_allclose(_np(grid_sampling.masked_rows(cells, mask)),
                               [[0, 0, 0, 0, 1, 0, 0, 0, 0]])


def test_grid_shapes():
    assert grid_sampling.grid_shape_for(None, 64) == (8, 8)
    assert grid_sampling.grid_shape_for((0, 0), 196) == (14, 14)
    assert grid_sampling.grid_shape_for((2, 3), 6) == (2, 3)
    with pytest.raises(ValueError, match="square"):
        grid_sampling.grid_shape_for(None, 6)
    with pytest.raises(ValueError, match="regions"):
        grid_sampling.grid_shape_for((2, 2), 6)
