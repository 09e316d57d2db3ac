"""GlimpseAttention: the layer contract, the sensor, the policy's gradient and its failure modes."""
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from models.glimpse_attention import GUARD_BOUND, MIN_STD, GlimpseAttention
from models.location_network import LocationNetwork
from tests.models.layer_contract import run_layer_test
from tests.models.tiny import DIM, HIDDEN, REGIONS, UNITS, annotations, hidden

SIDE = 4           # a 4x4 grid: the sensor's patches fit inside it


def _grid(seed=0, batch=2, side=SIDE, dim=DIM):
    return np.random.default_rng(seed).normal(size=(batch, side * side, dim)).astype("float32")


def _built(**kwargs):
    keras.utils.set_random_seed(0)
    layer = GlimpseAttention(UNITS, **kwargs)
    layer.build((None, SIDE * SIDE, DIM), (None, HIDDEN))
    return layer


def _np(x):
    return np.asarray(tf.convert_to_tensor(x))


def test_layer_contract():
    samples = 2 * 3 * 3
    weights = {
        "location_network/hidden_layer/kernel": (HIDDEN, UNITS),
        "location_network/hidden_layer/bias": (UNITS,),
        "location_network/cell_projection/kernel": (DIM, 4),
        "location_network/map_projection/kernel": (REGIONS * 4, UNITS),
        "location_network/output_kernel": (UNITS, 2),
        "location_network/output_bias": (2,),
        "retina_projection/kernel": (DIM, UNITS),                   # W_v
        "retina_layer/kernel": (samples * UNITS, UNITS), "retina_layer/bias": (UNITS,),
        "where_layer/kernel": (2, UNITS), "where_layer/bias": (UNITS,),
        "glimpse_layer/kernel": (2 * UNITS, DIM), "glimpse_layer/bias": (DIM,),
        "baseline_kernel": (HIDDEN, 1), "baseline_bias": (1,),
    }
    run_layer_test(GlimpseAttention, {"units": UNITS, "std": 0.2, "seed": 3},
                   (annotations(), hidden()),
                   ((None, DIM), (None, REGIONS), (None, 3), (None,), (None,)),
                   expected_weights=weights, expected_num_non_trainable_variables=1,
                   float32_outputs=(1, 2, 3, 4))


def test_location_network_layer_contract():
    weights = {"hidden_layer/kernel": (HIDDEN, UNITS), "hidden_layer/bias": (UNITS,),
               "cell_projection/kernel": (DIM, 2),
               "map_projection/kernel": (REGIONS * 2, UNITS),
               "output_kernel": (UNITS, 3), "output_bias": (3,)}
    run_layer_test(LocationNetwork, {"units": UNITS, "outputs": 3, "channels": 2},
                   (annotations(), hidden()), (None, 3), expected_weights=weights,
                   float32_outputs=(0,))
    # A zero output kernel (the spatial transformer's start): only the output layer learns first.
    run_layer_test(LocationNetwork, {"units": UNITS, "outputs": 3, "channels": 2,
                                     "output_scale": 0.1, "initial_output": [0.5, 0.0, 0.0]},
                   (annotations(), hidden()), (None, 3), expected_weights=weights,
                   float32_outputs=(0,),
                   zero_gradient_weights=[k for k in weights if not k.startswith("output")])


def test_the_sensor_reads_the_cells_around_the_location_at_each_resolution():
    layer = _built(retina=(2, 3, 2.0))
    # the centre of cell (x=1, y=2) of the 4x4 grid: -1 + (2j + 1) / 4
    location = tf.constant([[-0.25, 0.25]])
    weights = _np(layer.sampling_weights(location)).reshape(2, 3, 3, SIDE, SIDE)
    np.testing.assert_allclose(weights.sum((-1, -2)), 1.0, rtol=1e-6)
    # First patch: single cells (y, x) = (2 + dy, 1 + dx).
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            want = np.zeros((SIDE, SIDE))
            want[2 + dy, 1 + dx] = 1.0
            np.testing.assert_allclose(weights[0, dy + 1, dx + 1], want, atol=1e-6)
    # Second patch: 2x2-cell averages centred 2 cells apart, clipped to the grid.
    np.testing.assert_allclose(weights[1, 1, 1][1:4, 0:3],
                               [[.0625, .125, .0625], [.125, .25, .125], [.0625, .125, .0625]],
                               atol=1e-6)
    retina_source = tf.constant(np.arange(SIDE * SIDE, dtype="float32").reshape(1, -1, 1))
    context, alpha = layer.glimpse(tf.tile(retina_source, [1, 1, UNITS]), location)
    assert context.shape == (1, DIM)
    alpha = _np(alpha).reshape(SIDE, SIDE)
    np.testing.assert_allclose(alpha.sum(), 1.0, rtol=1e-6)
    assert np.unravel_index(alpha.argmax(), alpha.shape) == (2, 1)   # the footprint peaks there


def test_the_sample_carries_no_gradient_and_the_policy_learns_through_its_mean_only():
    layer, a, h = _built(std=0.2), _grid(), hidden()
    noise = tf.constant([[0.5, -1.0], [2.0, 0.3]])
    policy = layer.location_network.trainable_weights
    with tf.GradientTape(persistent=True) as tape:
        out = layer.attend(layer.project(a), h, training=True, noise=noise)
        context_loss = tf.reduce_sum(out["context"]) + tf.reduce_sum(out["alpha"])
        log_prob = tf.reduce_sum(out["sample_log_prob"])
        mean = out["mean"]
    # Nothing of what the glimpse reads reaches the location network.
    assert all(g is None for g in tape.gradient(context_loss, policy))
    assert tape.gradient(out["location"], policy)[0] is None
    # log N(l; mu, std) with l fixed: d/d mu = (l - mu) / std^2 = noise / std.
    np.testing.assert_allclose(_np(tape.gradient(log_prob, mean)), _np(noise) / 0.2, rtol=1e-5)
    assert all(g is not None for g in tape.gradient(log_prob, policy))
    sample = _np(mean) + 0.2 * _np(noise)
    np.testing.assert_allclose(_np(out["location"])[:, :2], np.clip(sample, -1, 1), rtol=1e-6)
    want = (-0.5 * _np(noise) ** 2 - math.log(0.2) - 0.5 * math.log(2 * math.pi)).sum(-1)
    np.testing.assert_allclose(_np(out["sample_log_prob"]), want, rtol=1e-5)


def test_inference_looks_at_the_mean_and_samples_differ_in_training():
    layer, a, h = _built(), _grid(), hidden()
    projected = layer.project(a)
    inference = layer.attend(projected, h)
    np.testing.assert_allclose(_np(inference["location"])[:, :2], _np(inference["mean"]))
    assert (_np(inference["sample_log_prob"]) == 0).all()
    first = layer.attend(projected, h, training=True)["location"]
    second = layer.attend(projected, h, training=True)["location"]
    assert np.abs(_np(first) - _np(second)).max() > 1e-3
    np.testing.assert_allclose(_np(inference["location"])[:, 2], 3 / SIDE)   # first patch


def test_glimpses_depend_on_the_image():
    layer, h = _built(), hidden()
    a, b = _grid(0), _grid(1)
    where = tf.constant([[0.1, -0.2], [0.1, -0.2]])
    za, _ = layer.glimpse(layer.project(a)[0], where)
    zb, _ = layer.glimpse(layer.project(b)[0], where)
    assert np.abs(_np(za) - _np(zb)).max() > 1e-3           # same place, other image
    # With the map of the image the policy's mean depends on it; without, on h alone.
    assert np.abs(_np(layer.attend(layer.project(a), h)["mean"])
                  - _np(layer.attend(layer.project(b), h)["mean"])).max() > 1e-4
    blind = _built(channels=0)
    np.testing.assert_allclose(_np(blind.attend(blind.project(a), h)["mean"]),
                               _np(blind.attend(blind.project(b), h)["mean"]))


def test_a_tiny_std_is_refused_and_the_smallest_one_gives_finite_gradients():
    with pytest.raises(ValueError, match="std"):
        GlimpseAttention(UNITS, std=1e-5)
    layer, a, h = _built(std=MIN_STD), _grid(), hidden()
    policy = layer.location_network.trainable_weights
    with tf.GradientTape() as tape:
        out = layer.attend(layer.project(a), h, training=True,
                           noise=tf.constant([[4.0, -4.0], [0.0, 3.0]]))
        loss = tf.reduce_sum(out["sample_log_prob"]) + tf.reduce_sum(out["baseline"])
    assert np.isfinite(_np(loss))
    for g in tape.gradient(loss, policy):
        assert np.isfinite(_np(g)).all()


def test_a_policy_at_the_border_is_guarded_and_pulled_back():
    layer, a, h = _built(), _grid(), hidden()
    layer.location_network.output_bias.assign([5.0, -0.5])      # x pushed past tanh's knee
    with tf.GradientTape() as tape:
        out = layer.attend(layer.project(a), h, training=True)
        penalty = tf.reduce_sum(out["guard_penalty"])
    np.testing.assert_array_equal(_np(out["guard"]), [1.0, 1.0])
    assert float(penalty) > 0
    bias_grad = _np(tape.gradient(penalty, layer.location_network.output_bias))
    assert bias_grad[0] > 0 and bias_grad[1] == 0.0             # descent moves x inward
    # Sampled beyond the border, the glimpse is clipped to it and reads the edge cells.
    assert (_np(out["location"])[:, 0] <= 1.0).all()
    np.testing.assert_allclose(_np(out["alpha"]).sum(-1), 1.0, rtol=1e-6)
    layer.location_network.output_bias.assign([0.5, -0.5])
    assert not _np(layer.attend(layer.project(a), h)["guard"]).any()
    assert GUARD_BOUND > np.arctanh(1 - 1 / SIDE)    # every cell centre is reachable unguarded


def test_reinforce_moves_the_mean_to_the_rewarded_location_not_to_the_border():
    # The policy alone: reward -|l - target|^2, target 0.6 (inside) and 0.97 (at the
    # border, where an unguarded tanh saturates). REINFORCE through the mean only.
    keras.utils.set_random_seed(1)
    layer, a = _built(std=0.15, channels=0), _grid(batch=16)
    h = tf.zeros((16, HIDDEN))
    projected = layer.project(a)
    optimizer = keras.optimizers.Adam(0.05)
    policy = layer.location_network.trainable_weights
    for target in (0.6, 0.97):
        for _ in range(150):
            with tf.GradientTape() as tape:
                out = layer.attend(projected, h, training=True)
                reward = -tf.reduce_sum(tf.square(out["location"][:, :2] - target), -1)
                advantage = tf.stop_gradient(reward - tf.reduce_mean(reward))
                loss = -tf.reduce_mean(advantage * out["sample_log_prob"]) + tf.reduce_mean(
                    out["guard_penalty"])
            optimizer.apply_gradients(zip(tape.gradient(loss, policy), policy, strict=True))
        mean = _np(layer.attend(projected, h)["mean"])
        np.testing.assert_allclose(mean, target, atol=0.08)
    assert np.abs(np.arctanh(mean)).max() < GUARD_BOUND + 0.5     # not saturated at the border
