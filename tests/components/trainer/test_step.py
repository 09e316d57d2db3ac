"""The Trainer's training step (the project's one training path) on the tiny model.

The step is what every strategy runs; here under the default strategy, with
the tiny sizes of tests/models/tiny.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from components.trainer.fused_adam import FusedAdam
from components.trainer.step import MEAN_KEYS, SUM_KEYS, make_train_step
from models.decoding import greedy_decode
from tests.models.tiny import CAPTIONS, annotations, make_model, policy

# Four images, four captions, all distinct: memorised in a few hundred steps.
_OVERFIT_CAPTIONS = np.array([[1, 4, 5, 6, 2, 0, 0],
                              [1, 7, 8, 2, 0, 0, 0],
                              [1, 9, 10, 11, 12, 2, 0],
                              [1, 4, 13, 14, 15, 16, 2]], "int32")


def _step(model, batch, learning_rate=0.02, clip_norm=0.0):
    """The Trainer's step for `batch` under the default strategy, on a fresh (fused) Adam."""
    optimizer = FusedAdam(learning_rate)
    optimizer.build(model.trainable_variables)
    spec = {k: tf.TensorSpec(v.shape, v.dtype) for k, v in batch.items()}
    return make_train_step(tf.distribute.get_strategy(), model, optimizer,
                           clip_norm=clip_norm, global_batch_size=len(batch["tokens"]),
                           element_spec=spec)


def _fit(model, a, steps):
    batch = {"annotations": tf.constant(a), "tokens": tf.constant(_OVERFIT_CAPTIONS)}
    step = _step(model, batch)
    return [{k: float(v) for k, v in step(batch).items()} for _ in range(steps)]


def _assert_reproduces_captions(model, a):
    out = greedy_decode(model, a, max_length=8)
    want = _OVERFIT_CAPTIONS[:, 1:]
    np.testing.assert_array_equal(out["tokens"][:, :want.shape[1]], want)
    np.testing.assert_array_equal(out["lengths"], (want != 0).sum(1))


def test_soft_attention_overfits_a_handful_of_captions():
    model = make_model("soft", dropout=0.0, doubly_stochastic_lambda=0.01)
    a = annotations(seed=3, batch=4)
    history = _fit(model, a, 150)
    assert set(history[-1]) == set(SUM_KEYS) | set(MEAN_KEYS)
    nll = history[-1]["nll_sum"] / history[-1]["num_tokens"]
    assert nll < 0.5
    terms = model.compute_loss_terms(a, _OVERFIT_CAPTIONS, training=False)
    assert float(terms["nll"]) < 0.05
    _assert_reproduces_captions(model, a)


def test_bfloat16_and_float32_training_agree():
    # The same model, data and optimizer: the per-token NLL curves of 150 steps
    # differ by at most 0.0026 (measured; start 3.03, end 0.0004), so 0.02 is
    # a bound that bfloat16 rounding passes and a wrong cast (e.g. a float32
    # softmax or loss computed in bfloat16) would not.
    curves, dtypes = {}, {}
    for name in ("float32", "mixed_bfloat16"):
        with policy(name):
            model = make_model("soft", dropout=0.0, doubly_stochastic_lambda=0.01)
            history = _fit(model, annotations(seed=3, batch=4), 150)
        curves[name] = np.array([h["nll_sum"] / h["num_tokens"] for h in history])
        dtypes[name] = {v.dtype for v in model.trainable_variables}
    assert dtypes["mixed_bfloat16"] == {"float32"}   # float32 variables
    np.testing.assert_allclose(curves["mixed_bfloat16"], curves["float32"], atol=0.02)
    assert curves["mixed_bfloat16"][-1] < 0.01 and curves["float32"][-1] < 0.01


def test_hard_attention_overfits_a_handful_of_captions():
    model = make_model("hard", dropout=0.0, doubly_stochastic_lambda=0.01)
    a = annotations(seed=3, batch=4)
    history = _fit(model, a, 200)
    terms = model.compute_loss_terms(a, _OVERFIT_CAPTIONS, training=False)
    assert float(terms["nll"]) < 0.05
    _assert_reproduces_captions(model, a)
    # The step moved the moving-average baseline on the sampled minibatches only.
    sampled = sum(1 for h in history if h["used_expected_alpha"] < 0.5)
    assert float(model.baseline_updates.numpy()) == sampled


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_step_loss_is_the_models_loss_and_every_weight_moves(attention):
    model = make_model(attention, dropout=0.0, expected_alpha_prob=1.0)
    a = annotations()
    before = [v.numpy().copy() for v in model.trainable_variables]
    want = model.compute_loss_terms(a, CAPTIONS, training=False)
    batch = {"annotations": tf.constant(a), "tokens": tf.constant(CAPTIONS)}
    out = {k: float(v) for k, v in _step(model, batch, learning_rate=1e-3,
                                           clip_norm=1e-3)(batch).items()}
    # One replica: the re-weighted loss is the model's own loss of the batch.
    np.testing.assert_allclose(out["loss"], float(want["loss"]), rtol=1e-5)
    assert out["num_tokens"] == float(want["num_tokens"]) and out["examples"] == 2.0
    assert out["grad_norm"] > 1e-3   # the raw norm, before clipping
    changed = [not np.array_equal(b, v.numpy()) for b, v in zip(before, model.trainable_variables, strict=True)]
    assert all(changed)


def _sgd_update(model, batch, token_normalizer):
    """The change of every weight after one Trainer step with plain SGD (rate 1)."""
    import keras
    optimizer = keras.optimizers.SGD(1.0)
    optimizer.build(model.trainable_variables)
    spec = {k: tf.TensorSpec(v.shape, v.dtype) for k, v in batch.items()}
    step = make_train_step(tf.distribute.get_strategy(), model, optimizer, clip_norm=0.0,
                           global_batch_size=len(batch["tokens"]), element_spec=spec,
                           token_normalizer=token_normalizer)
    before = [v.numpy().copy() for v in model.trainable_variables]
    out = {k: float(v) for k, v in step(batch).items()}
    delta = [v.numpy() - b for b, v in zip(before, model.trainable_variables, strict=True)]
    for v, b in zip(model.trainable_variables, before, strict=True):
        v.assign(b)
    return out, delta


def test_fixed_token_normalizer_divides_the_summed_token_losses_by_a_constant():
    # Under bucket_by_length the Trainer divides a batch's summed token losses
    # by the expected tokens per batch, not by the batch's own count: with the
    # count itself the update is the default one, with twice the count half
    # of it (no penalty, SGD: the update is the gradient), and the reported
    # loss is the per-token mean either way.
    model = make_model("soft", dropout=0.0, doubly_stochastic_lambda=0.0)
    batch = {"annotations": tf.constant(annotations()), "tokens": tf.constant(CAPTIONS)}
    tokens = float(np.sum(CAPTIONS[:, 1:] != 0))
    default, d0 = _sgd_update(model, batch, None)
    same, d1 = _sgd_update(model, batch, tokens)
    double, d2 = _sgd_update(model, batch, 2 * tokens)
    assert default["loss"] == pytest.approx(same["loss"]) == pytest.approx(double["loss"])
    for a, b, c in zip(d0, d1, d2, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(c, a / 2, rtol=1e-5, atol=1e-7)
    assert any(np.abs(a).max() > 1e-4 for a in d0)
