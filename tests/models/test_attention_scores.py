"""The four region scores (additive, concat, general, dot): contract, formulas, decoding."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from models.attention_scorer import AttentionScorer
from models.hard_attention import HardAttention
from models.soft_attention import SoftAttention
from tests.models.layer_contract import run_layer_test
from tests.models.tiny import CAPTIONS, DIM, HIDDEN, REGIONS, UNITS, annotations, hidden, make_model

WEIGHTS = {
    "concat": {"annotation_projection/kernel": (DIM, UNITS),
               "hidden_projection/kernel": (HIDDEN, UNITS), "score_kernel": (UNITS,)},
    "general": {"annotation_projection/kernel": (DIM, HIDDEN)},   # W: a^T W h
    "dot": {},                                                     # DIM == HIDDEN: no W_q
}


@pytest.mark.parametrize("score", ["concat", "general", "dot"])
def test_layer_contract(score):
    mask = np.ones((2, REGIONS), bool)
    mask[0, :3] = False
    run_layer_test(AttentionScorer, {"units": UNITS, "score": score}, (annotations(), hidden()),
                   ((None, REGIONS), (None, REGIONS)), expected_weights=WEIGHTS[score],
                   call_kwargs={"mask": mask}, float32_outputs=(0, 1))


def test_dot_maps_the_state_to_the_annotation_size_when_they_differ():
    h = np.random.default_rng(3).normal(size=(2, 12)).astype("float32")
    run_layer_test(SoftAttention, {"units": UNITS, "score": "dot"}, (annotations(), h),
                   ((None, DIM), (None, REGIONS)),
                   expected_weights={"hidden_projection/kernel": (12, DIM)}, float32_outputs=(1,))


def _built(score, hidden_dim=HIDDEN):
    keras.utils.set_random_seed(0)
    layer = AttentionScorer(UNITS, score=score)
    layer.build((None, REGIONS, DIM), (None, hidden_dim))
    return layer


def _softmax(scores):
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_general_is_the_scaled_bilinear_form():
    layer, a, h = _built("general"), annotations(), hidden()
    w = layer.annotation_projection.kernel.numpy()                  # (D, n)
    scores = np.einsum("bld,dn,bn->bl", a, w, h) / np.sqrt(HIDDEN)
    np.testing.assert_allclose(layer(a, h)[0], _softmax(scores), rtol=1e-5, atol=1e-6)


def test_general_under_mixed_precision_reads_its_projection_in_bfloat16():
    """The per-step projection `a W` stays in the compute dtype (half the bytes each step
    reads); the scores' softmax is float32 and within bfloat16 rounding of float32's."""
    layer, a, h = _built("general"), annotations(), hidden()
    exact = layer(a, h)[0].numpy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        mixed = AttentionScorer(UNITS, score="general")
        mixed.build((None, REGIONS, DIM), (None, HIDDEN))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    mixed.set_weights(layer.get_weights())
    projected = mixed.project(a)
    assert projected.dtype == tf.bfloat16
    alpha, log_alpha = mixed.attention_weights(projected, h)
    assert alpha.dtype == log_alpha.dtype == tf.float32
    np.testing.assert_allclose(alpha, exact, atol=0.02)
    np.testing.assert_allclose(alpha.numpy().sum(-1), 1.0, rtol=1e-6)


def test_dot_is_the_scaled_dot_product():
    a, h = annotations(), hidden()
    np.testing.assert_allclose(_built("dot")(a, h)[0],
                               _softmax(np.einsum("bld,bd->bl", a, h) / np.sqrt(DIM)),
                               rtol=1e-5, atol=1e-6)
    h12 = np.random.default_rng(3).normal(size=(2, 12)).astype("float32")
    layer = _built("dot", hidden_dim=12)
    q = h12 @ layer.hidden_projection.kernel.numpy()
    np.testing.assert_allclose(layer(a, h12)[0],
                               _softmax(np.einsum("bld,bd->bl", a, q) / np.sqrt(DIM)),
                               rtol=1e-5, atol=1e-6)


def test_concat_is_the_additive_mlp_without_its_bias():
    a, h = annotations(), hidden()
    concat, additive = _built("concat"), _built("additive")
    for name in ("annotation_projection", "hidden_projection"):
        getattr(additive, name).kernel.assign(getattr(concat, name).kernel)
    additive.score_kernel.assign(concat.score_kernel)
    additive.annotation_projection.bias.assign(np.zeros(UNITS, "float32"))
    np.testing.assert_allclose(concat(a, h)[0], additive(a, h)[0], rtol=1e-6)


@pytest.mark.parametrize("score", ["additive", "concat", "general", "dot"])
def test_projection_once_per_sequence_equals_the_full_call(score):
    layer, a, h = _built(score), annotations(), hidden()
    full = layer(a, h)
    hoisted = layer.attention_weights(layer.project(a), h)
    for x, y in zip(full, hoisted, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(full[0]).sum(-1), 1.0, rtol=1e-6)


def test_unknown_score_is_refused_and_the_score_round_trips():
    with pytest.raises(ValueError, match="score"):
        AttentionScorer(UNITS, score="cosine")
    layer = HardAttention(UNITS, score="general", inference="argmax")
    assert HardAttention.from_config(layer.get_config()).score == "general"


@pytest.mark.parametrize("attention,score", [("soft", "general"), ("soft", "dot"),
                                             ("hard", "general"), ("soft", "concat")])
def test_decoder_with_each_score_trains_and_decodes_as_it_teacher_forces(attention, score):
    model = make_model(attention, attention_score=score, dropout=0.0)
    a = annotations()
    with tf.GradientTape() as tape:
        loss = model.compute_loss_terms(a, CAPTIONS)["loss"]
    grads = tape.gradient(loss, model.trainable_variables)
    assert all(g is not None and np.isfinite(tf.convert_to_tensor(g)).all() for g in grads)
    want = tf.nn.log_softmax(model({"annotations": a, "tokens": CAPTIONS[:, :-1]})["logits"])
    projected, state = model.project_annotations(a), model.initial_state(a)
    for t in range(CAPTIONS.shape[1] - 1):
        log_probs, _, state = model.decode_step(CAPTIONS[:, t], state, a, projected)
        np.testing.assert_allclose(log_probs, want[:, t], rtol=1e-5, atol=1e-5)
