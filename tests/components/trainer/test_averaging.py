"""The weight average: its momentum, the swap into the model and back, and its checkpoint."""
from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from components.trainer import averaging
from components.trainer.fused_adam import FusedAdam


def test_the_momentum_keeps_a_time_constant_of_the_given_epochs():
    assert averaging.momentum(0, 112) == 0.0
    assert averaging.momentum(3, 100) == pytest.approx(1 - 1 / 300)
    assert averaging.momentum(0.5, 112) == pytest.approx(1 - 1 / 56)
    assert averaging.momentum(0.1, 4) == 0.0    # under a step: the last weights


def _trained(use_ema: bool, momentum: float = 0.5, steps: int = 3):
    """A dense model after `steps` Adam updates, its optimizer, and each step's weights."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = FusedAdam(0.1, use_ema=use_ema, ema_momentum=momentum)
    optimizer.build(model.trainable_variables)
    x = tf.constant(np.arange(12, dtype="float32").reshape(4, 3) / 10)
    seen = []
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        seen.append([v.numpy() for v in model.trainable_variables])
    return model, optimizer, seen


def test_the_average_is_in_the_model_inside_the_block_and_the_trained_weights_after():
    model, optimizer, seen = _trained(use_ema=True, momentum=0.5)
    # Keras's EMA: the first step copies the weights, then avg = m * avg + (1 - m) * w.
    expected = seen[0]
    for weights in seen[1:]:
        expected = [0.5 * a + 0.5 * w for a, w in zip(expected, weights, strict=True)]
    with averaging.averaged_weights(model, optimizer):
        inside = [v.numpy() for v in model.trainable_variables]
    for got, want in zip(inside, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    for got, want in zip(model.trainable_variables, seen[-1], strict=True):
        np.testing.assert_array_equal(got.numpy(), want)
    assert not np.allclose(inside[0], seen[-1][0])      # the average is not the last weights


def test_without_an_average_the_block_leaves_the_weights_alone():
    model, optimizer, seen = _trained(use_ema=False)
    assert not averaging.averages(optimizer)
    with averaging.averaged_weights(model, optimizer):
        for got, want in zip(model.trainable_variables, seen[-1], strict=True):
            np.testing.assert_array_equal(got.numpy(), want)


def test_a_checkpoint_keeps_the_average_for_a_resumed_run(tmp_path):
    model, optimizer, _ = _trained(use_ema=True)
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "ckpt"))
    with averaging.averaged_weights(model, optimizer):
        average = [v.numpy() for v in model.trainable_variables]
    fresh, fresh_optimizer, _ = _trained(use_ema=True, steps=0)
    tf.train.Checkpoint(model=fresh, optimizer=fresh_optimizer).restore(
        path).assert_existing_objects_matched()
    with averaging.averaged_weights(fresh, fresh_optimizer):
        for got, want in zip(fresh.trainable_variables, average, strict=True):
            np.testing.assert_array_equal(got.numpy(), want)
