"""Loss terms: masked NLL, doubly stochastic penalty, entropy, REINFORCE surrogate."""
import numpy as np
import tensorflow as tf

from models import losses


def test_masked_nll_is_minus_log_softmax_at_real_tokens_only():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 4, 6)).astype("float32")
    targets = np.array([[3, 4, 2, 0], [5, 2, 0, 0]])
    nll = np.asarray(losses.masked_nll(logits, targets))
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    want = -np.take_along_axis(log_p, targets[..., None], -1)[..., 0] * (targets != 0)
    np.testing.assert_allclose(nll, want, rtol=1e-5, atol=1e-6)
    assert (nll[targets == 0] == 0).all()


def test_masked_nll_matches_the_fused_cross_entropy_in_value_and_gradient():
    """Log-sum-exp minus the target logit: TensorFlow's sparse softmax cross-entropy,
    also for logits far from zero (no overflow) and in bfloat16."""
    import tensorflow as tf
    rng = np.random.default_rng(1)
    targets = tf.constant(rng.integers(1, 50, size=(3, 5)), tf.int32)
    for scale, shift, dtype in ((1.0, 0.0, tf.float32), (30.0, 500.0, tf.float32),
                                (4.0, 0.0, tf.bfloat16)):
        logits = tf.Variable(tf.cast(rng.normal(size=(3, 5, 50)) * scale + shift, dtype))
        with tf.GradientTape(persistent=True) as tape:
            ours = losses.masked_nll(logits, targets)
            fused = tf.nn.sparse_softmax_cross_entropy_with_logits(
                targets, tf.cast(logits, tf.float32))
        assert ours.dtype == tf.float32 and np.isfinite(ours.numpy()).all()
        np.testing.assert_allclose(ours, fused, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(tf.cast(tape.gradient(ours, logits), tf.float32),
                                   tf.cast(tape.gradient(fused, logits), tf.float32),
                                   rtol=1e-5, atol=1e-6)


def test_doubly_stochastic_penalty_is_zero_when_every_region_sums_to_one():
    # T = L = 9, alpha_ti = 1/L: sum_t alpha_ti = 1 for every region i.
    alpha = np.full((2, 9, 9), 1 / 9, "float32")
    steps = np.ones((2, 9), "float32")
    np.testing.assert_allclose(losses.doubly_stochastic_penalty(alpha, steps), 0.0, atol=1e-10)
    # A permutation-like attention (each step on one new region) also sums to 1.
    np.testing.assert_allclose(
        losses.doubly_stochastic_penalty(np.eye(9, dtype="float32")[None], steps[:1]), 0.0)


def test_doubly_stochastic_penalty_matches_the_formula_over_real_steps_only():
    rng = np.random.default_rng(1)
    alpha = rng.dirichlet(np.ones(9), size=(2, 5)).astype("float32")   # (2, 5, 9)
    steps = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], "float32")
    got = np.asarray(losses.doubly_stochastic_penalty(alpha, steps, weight=0.5))
    want = 0.5 * ((1 - (alpha * steps[..., None]).sum(1)) ** 2).sum(-1)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_entropy_of_uniform_is_log_l_and_zero_weights_are_safe():
    np.testing.assert_allclose(losses.attention_entropy(np.full((3, 9), 1 / 9, "float32")),
                               np.log(9.0), rtol=1e-6)
    one_hot = np.eye(9, dtype="float32")[:2]
    x = tf.constant(one_hot)
    with tf.GradientTape() as tape:
        tape.watch(x)
        h = losses.attention_entropy(x)
    np.testing.assert_allclose(h, 0.0, atol=1e-6)
    assert np.isfinite(tape.gradient(h, x)).all()


def test_reinforce_surrogate_gradient_is_advantage_times_score_function():
    reward = tf.constant([-3.0, -1.0])
    log_prob = tf.constant([-2.0, -0.5])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([reward, log_prob])
        value = losses.reinforce_surrogate(reward, -2.0, log_prob, weight=0.5)
    np.testing.assert_allclose(value, [-0.5 * -1.0 * -2.0, -0.5 * 1.0 * -0.5])
    np.testing.assert_allclose(tape.gradient(value, log_prob), [0.5, -0.5])
    assert tape.gradient(value, reward) is None          # the reward is a constant
