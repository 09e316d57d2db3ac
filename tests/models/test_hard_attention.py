"""HardAttention: the shared layer contract and the multinoulli sampling."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from models.hard_attention import HardAttention
from tests.models.layer_contract import run_layer_test
from tests.models.tiny import (
    DIM,
    HIDDEN,
    REGIONS,
    SCORER_WEIGHTS,
    UNITS,
    annotations,
    hidden,
    policy,
)

# chi-square with L - 1 = 8 degrees of freedom, p = 0.001
CHI2_8_999 = 26.12


def _built(**kwargs):
    keras.utils.set_random_seed(0)
    layer = HardAttention(UNITS, seed=3, **kwargs)
    layer.build((None, REGIONS, DIM), (None, HIDDEN))
    return layer


def _chi_square(samples, alpha):
    counts = np.asarray(samples).sum(0)
    expected = len(samples) * alpha
    return ((counts - expected) ** 2 / expected).sum()


@pytest.mark.parametrize("inference", ["expected", "argmax"])
def test_layer_contract(inference):
    # The training step samples (training=True), so REINFORCE's log-prob path
    # and the Gumbel noise are traced in a tf.function too.
    run_layer_test(HardAttention, {"units": UNITS, "inference": inference, "seed": 7},
                   (annotations(), hidden()),
                   ((None, DIM), (None, REGIONS), (None, REGIONS), (None,)),
                   expected_weights=SCORER_WEIGHTS,
                   expected_num_non_trainable_variables=1,   # the sampler's seed state
                   float32_outputs=(1, 2, 3))


def test_unknown_inference_mode_is_rejected():
    with pytest.raises(ValueError, match="inference"):
        HardAttention(UNITS, inference="mode")


def test_samples_follow_alpha():
    layer = _built()
    a, h = annotations(batch=1), 3.0 * hidden(batch=1)
    _, alpha, _, _ = layer(a, h)
    alpha = np.asarray(alpha)[0]
    assert alpha.min() > 0.01 and alpha.max() > 2 * alpha.min()  # not uniform
    n = 4000
    # The layer's own noise (SeedGenerator) through the whole call ...
    context, _, sample, log_prob = layer(np.repeat(a, n, 0), np.repeat(h, n, 0), training=True)
    sample = np.asarray(sample)
    assert (sample.sum(-1) == 1).all()
    assert _chi_square(sample, alpha) < CHI2_8_999
    # ... the returned context is the sampled annotation and log_prob its log alpha.
    index = sample.argmax(-1)
    np.testing.assert_allclose(context, a[0][index], rtol=1e-6)
    np.testing.assert_allclose(log_prob, np.log(alpha[index]), rtol=1e-5)
    # ... and noise drawn once for many steps, as the decoder does.
    alphas = np.repeat(alpha[None], n, 0)
    _, sample, _ = layer.select(alphas, np.log(alphas), training=True,
                                noise=layer.sample_noise((n, REGIONS)))
    assert _chi_square(sample, alpha) < CHI2_8_999


def test_masked_regions_are_never_sampled():
    layer = _built()
    mask = np.ones((2, REGIONS), bool)
    mask[:, :6] = False
    a, h = np.repeat(annotations(), 200, 0), np.repeat(hidden(), 200, 0)
    _, alpha, sample, _ = layer(a, h, mask=np.repeat(mask, 200, 0), training=True)
    assert (np.asarray(alpha)[:, :6] == 0).all()
    assert (np.asarray(sample)[:, :6] == 0).all()


def test_inference_modes_and_forced_expected_alpha():
    a, h = annotations(), hidden()
    expected = _built(inference="expected")
    context, alpha, _, _ = expected(a, h)
    mean = np.einsum("bl,bld->bd", np.asarray(alpha), a)
    np.testing.assert_allclose(context, mean, rtol=1e-5, atol=1e-6)
    for use_expected in (True, tf.constant(True)):
        forced, _, _, _ = expected(a, h, training=True, use_expected=use_expected)
        np.testing.assert_allclose(forced, mean, rtol=1e-5, atol=1e-6)
    sampled, _, sample, _ = expected(a, h, training=True, use_expected=tf.constant(False))
    np.testing.assert_allclose(sampled, a[np.arange(2), np.asarray(sample).argmax(-1)], rtol=1e-6)
    argmax = _built(inference="argmax")
    context, alpha, _, _ = argmax(a, h)
    np.testing.assert_allclose(context, a[np.arange(2), np.asarray(alpha).argmax(-1)], rtol=1e-6)


def test_one_reinforce_step_moves_alpha_towards_rewarded_samples():
    layer = _built()
    a, h = np.repeat(annotations(batch=1), 64, 0), np.repeat(hidden(batch=1), 64, 0)
    _, alpha0, _, _ = layer(a, h)
    optimizer = keras.optimizers.SGD(0.5)
    with tf.GradientTape() as tape:
        _, _, sample, log_prob = layer(a, h, training=True)
        reward = tf.cast(tf.argmax(sample, -1) == 0, tf.float32)   # region 0 pays
        loss = -tf.reduce_mean(tf.stop_gradient(reward - 0.5) * log_prob)
    grads = tape.gradient(loss, layer.trainable_weights)
    assert all(g is not None for g in grads[1:])    # b (the bias) gets a gradient too
    optimizer.apply_gradients(zip(grads, layer.trainable_weights, strict=True))
    _, alpha1, _, _ = layer(a, h)
    assert float(alpha1[0, 0]) > float(alpha0[0, 0])


@pytest.mark.parametrize("name,compute", [("mixed_float16", "float16"),
                                          ("mixed_bfloat16", "bfloat16")])
def test_sampling_under_mixed_precision(name, compute):
    # The contract calls in inference mode; sampling (training=True) has its own dtypes.
    with policy(name):
        layer = _built()
        context, alpha, sample, log_prob = layer(annotations(), hidden(), training=True)
    assert context.dtype == compute
    assert alpha.dtype == sample.dtype == log_prob.dtype == "float32"
    sample = np.asarray(sample)
    assert (sample.sum(-1) == 1).all()
    np.testing.assert_allclose(log_prob, np.log((sample * np.asarray(alpha)).sum(-1)), rtol=1e-5)
