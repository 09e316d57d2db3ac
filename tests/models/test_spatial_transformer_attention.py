"""SpatialTransformerAttention: the layer contract, the identity start, gradients, the guard."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from models.spatial_transformer_attention import SpatialTransformerAttention
from tests.models.layer_contract import run_layer_test
from tests.models.tiny import DIM, HIDDEN, REGIONS, UNITS, annotations, hidden

SIDE = 8           # the demo's grid


def _grid(seed=0, batch=2, side=SIDE):
    return np.random.default_rng(seed).normal(size=(batch, side * side, DIM)).astype("float32")


def _built(side=SIDE, **kwargs):
    keras.utils.set_random_seed(0)
    layer = SpatialTransformerAttention(UNITS, **kwargs)
    layer.build((None, side * side, DIM), (None, HIDDEN))
    return layer


def _np(x):
    return np.asarray(tf.convert_to_tensor(x))


def _weights(outputs):
    return {"location_network/hidden_layer/kernel": (HIDDEN, UNITS),
            "location_network/hidden_layer/bias": (UNITS,),
            "location_network/cell_projection/kernel": (DIM, 4),
            "location_network/map_projection/kernel": (REGIONS * 4, UNITS),
            "location_network/output_kernel": (UNITS, outputs),
            "location_network/output_bias": (outputs,)}


@pytest.mark.parametrize("form,outputs", [("attention", 3), ("affine", 6)])
def test_layer_contract(form, outputs):
    mask = np.ones((2, REGIONS), bool)
    mask[0, :2] = False
    weights = _weights(outputs)
    # Zero output kernel at the start: the layers before it get their first gradient later.
    before = [k for k in weights if "/output_" not in k]
    run_layer_test(SpatialTransformerAttention, {"units": UNITS, "form": form, "scale": 0.6},
                   (annotations(), hidden()), ((None, DIM), (None, REGIONS), (None, 3)),
                   expected_weights=weights, call_kwargs={"mask": mask},
                   float32_outputs=(1, 2), zero_gradient_weights=before)


@pytest.mark.parametrize("form", ["attention", "affine"])
def test_it_starts_at_a_centred_window_of_the_configured_scale_for_every_input(form):
    layer = _built(form=form, scale=0.5)
    a, b = _grid(0), _grid(1, batch=2)
    for grid, h in ((a, hidden(1)), (b, hidden(7))):
        context, alpha, location = layer(grid, h)
        np.testing.assert_allclose(_np(location), [[0.0, 0.0, 0.5]] * 2, atol=1e-5)
        alpha = _np(alpha).reshape(-1, SIDE, SIDE)
        np.testing.assert_allclose(alpha.sum((1, 2)), 1.0, rtol=1e-5)
        # the window: the centre 4x4 cells (half-width 0.5 of the grid; the affine
        # form's bilinear samples near its edge also touch the next cells), symmetric
        np.testing.assert_allclose(alpha[:, :1].sum((1, 2)), 0.0, atol=1e-6)
        assert (alpha[:, 2:6, 2:6].sum((1, 2)) > 0.85).all()
        np.testing.assert_allclose(alpha, alpha[:, ::-1, ::-1], atol=1e-6)
        np.testing.assert_allclose(_np(context), np.einsum("bl,bld->bd", alpha.reshape(2, -1),
                                                           grid), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("form", ["attention", "affine"])
def test_finite_nonzero_gradient_into_the_transform_at_identity(form):
    layer, a, h = _built(form=form), _grid(), hidden()
    target = tf.constant(_grid(5)[:, :1, :].sum(1))
    with tf.GradientTape() as tape:
        context, _, _ = layer(a, h)
        loss = tf.reduce_sum(tf.square(context - target))
    bias, kernel = (layer.location_network.output_bias, layer.location_network.output_kernel)
    grad_bias, grad_kernel = (_np(g) for g in tape.gradient(loss, [bias, kernel]))
    assert np.isfinite(grad_bias).all() and np.isfinite(grad_kernel).all()
    # scale and both centre coordinates (attention form: s, t_x, t_y) get a gradient
    moving = [0, 1, 2] if form == "attention" else [0, 2, 4, 5]
    assert (np.abs(grad_bias[moving]) > 0).all(), grad_bias
    assert np.abs(grad_kernel).max() > 0


def test_the_window_follows_the_transform():
    layer = _built()
    # cell j's centre is at -1 + (2j + 1) / 8; cells are (y, x)
    for (x, y, s), cell in (((-0.625, 0.875, 0.15), (7, 1)), ((0.4, -0.1, 0.3), (3, 5))):
        layer.location_network.output_bias.assign(np.array([s, x, y], "float32") / 0.1)
        _, alpha, location = layer(_grid(), hidden())
        np.testing.assert_allclose(_np(location)[0], [x, y, s], rtol=1e-5)
        alpha = _np(alpha)[0].reshape(SIDE, SIDE)
        assert np.unravel_index(alpha.argmax(), alpha.shape) == cell


def test_the_guard_keeps_the_window_on_the_grid_and_counts():
    layer = _built(scale_min=0.2, scale_max=0.9)
    bias = layer.location_network.output_bias
    for raw, clamped, fired in (([0.05, 0.0, 0.0], [0.0, 0.0, 0.2], 1.0),     # shrinking
                                ([2.0, 0.0, 0.0], [0.0, 0.0, 0.9], 1.0),      # growing
                                ([0.5, 1.6, -3.0], [1.0, -1.0, 0.5], 1.0),    # leaving
                                ([0.5, 0.2, 0.3], [0.2, 0.3, 0.5], 0.0)):     # inside
        bias.assign(np.array(raw, "float32") / 0.1)
        with tf.GradientTape() as tape:
            transform = layer.transform(layer.project(_grid()), hidden())
            penalty = tf.reduce_sum(transform["guard_penalty"])
        np.testing.assert_allclose(_np(transform["guard"]), [fired] * 2)
        out = layer.attend(layer.project(_grid()), hidden())
        np.testing.assert_allclose(_np(out["location"])[0], clamped, rtol=1e-5)
        alpha = _np(out["alpha"])
        np.testing.assert_allclose(alpha.sum(-1), 1.0, rtol=1e-5)
        assert (alpha.max(-1) < 0.99).all()            # never a single cell: the gradient lives
        if fired:   # a gradient step on the penalty moves the raw transform back
            bias.assign_sub(0.1 * tape.gradient(penalty, bias))
            after = layer.transform(layer.project(_grid()), hidden())["guard_penalty"]
            assert float(tf.reduce_sum(after)) < float(penalty)


def test_masked_cells_get_no_weight():
    layer = _built()
    mask = np.ones((2, SIDE * SIDE), bool)
    mask[0, 27] = mask[0, 28] = False
    _, alpha, _ = layer(_grid(), hidden(), mask=mask)
    alpha = _np(alpha)
    assert (alpha[~mask] == 0).all()
    np.testing.assert_allclose(alpha.sum(-1), 1.0, rtol=1e-5)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="form"):
        SpatialTransformerAttention(UNITS, form="projective")
    with pytest.raises(ValueError, match="scale"):
        SpatialTransformerAttention(UNITS, scale=0.05, scale_min=0.1)
