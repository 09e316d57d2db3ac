"""AttentionScorer: the shared layer contract and the masked softmax both attentions use."""
import keras
import numpy as np

from models.attention_scorer import AttentionScorer
from models.hard_attention import HardAttention
from models.soft_attention import SoftAttention
from tests.models.layer_contract import run_layer_test
from tests.models.tiny import DIM, HIDDEN, REGIONS, SCORER_WEIGHTS, UNITS, annotations, hidden


def test_layer_contract():
    run_layer_test(AttentionScorer, {"units": UNITS}, (annotations(), hidden()),
                   ((None, REGIONS), (None, REGIONS)), expected_weights=SCORER_WEIGHTS,
                   float32_outputs=(0, 1))


def test_alpha_is_the_softmax_of_log_alpha_and_masks_are_exact():
    keras.utils.set_random_seed(0)
    scorer = AttentionScorer(UNITS)
    mask = np.ones((2, REGIONS), bool)
    mask[0, :4] = False
    alpha, log_alpha = (np.asarray(t) for t in scorer(annotations(), hidden(), mask=mask))
    np.testing.assert_allclose(alpha[mask], np.exp(log_alpha[mask]), rtol=1e-6)
    assert (alpha[~mask] == 0.0).all()
    np.testing.assert_allclose(alpha.sum(-1), 1.0, rtol=1e-6)
    # The masked log-weights are finite (no -inf that could turn into NaN gradients).
    assert np.isfinite(log_alpha).all()


def test_soft_and_hard_attention_weight_regions_like_their_scorer():
    a, h = annotations(), hidden()
    scorer = AttentionScorer(UNITS)
    alpha, _ = scorer(a, h)
    for cls in (SoftAttention, HardAttention):
        layer = cls(UNITS)
        layer.build((None, REGIONS, DIM), (None, HIDDEN))
        layer.set_weights(scorer.get_weights())
        np.testing.assert_allclose(layer(a, h)[1], alpha, rtol=1e-6)



def test_score_gradient_equals_autodiff_of_multiply_and_sum():
    import tensorflow as tf

    from models.attention_scorer import score
    rng = np.random.default_rng(0)
    energy = tf.constant(np.tanh(rng.normal(size=(3, REGIONS, UNITS))), tf.float32)
    w = tf.constant(rng.normal(size=(UNITS,)), tf.float32)
    upstream = tf.constant(rng.normal(size=(3, REGIONS)), tf.float32)

    def grads(fn):
        with tf.GradientTape() as tape:
            tape.watch([energy, w])
            out = fn(energy, w)
            loss = tf.reduce_sum(out * upstream)
        return (out, *tape.gradient(loss, [energy, w]))

    ours = grads(score)
    plain = grads(lambda e, v: tf.reduce_sum(e * v, axis=-1))
    for got, want in zip(ours, plain, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_mixed_precision_scores_in_float32_from_compute_dtype_matmuls():
    # Under mixed_bfloat16 the projections are bfloat16 matmuls, but the MLP's
    # sum, tanh and score are float32: the scores equal a float32 evaluation
    # of the same bfloat16 projections.
    import tensorflow as tf

    from tests.models.tiny import policy
    with policy("mixed_bfloat16"):
        keras.utils.set_random_seed(0)
        scorer = AttentionScorer(UNITS)
        a, h = annotations(), hidden()
        alpha, log_alpha = scorer(a, h)
        projected = scorer.project(a)
        assert projected.dtype == tf.float32
        hidden_bf16 = scorer.hidden_projection(tf.cast(h, tf.bfloat16))
    assert alpha.dtype == log_alpha.dtype == tf.float32
    energy = np.tanh(np.asarray(projected) + np.asarray(tf.cast(hidden_bf16, tf.float32))[:, None])
    scores = (energy * np.asarray(scorer.score_kernel)).sum(-1)
    top = scores.max(-1, keepdims=True)
    expected = scores - top - np.log(np.exp(scores - top).sum(-1, keepdims=True))  # log-softmax
    np.testing.assert_allclose(log_alpha, expected, rtol=1e-5, atol=1e-5)
