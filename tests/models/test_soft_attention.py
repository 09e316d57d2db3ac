"""SoftAttention: the layer contract and the attention behaviour."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from models.soft_attention import SoftAttention
from tests.models.tiny import DIM, HIDDEN, REGIONS, UNITS, annotations, hidden, policy


def _built(**kwargs):
    keras.utils.set_random_seed(0)
    layer = SoftAttention(UNITS, **kwargs)
    layer.build((None, REGIONS, DIM), (None, HIDDEN))
    return layer


def test_config_round_trip():
    layer = SoftAttention(UNITS, name="att")
    config = layer.get_config()
    assert config["units"] == UNITS
    clone = SoftAttention.from_config(config)
    assert clone.get_config() == config
    revived = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert isinstance(revived, SoftAttention) and revived.get_config() == config


def test_exact_weight_counts():
    layer = _built()
    shapes = {w.path.split("/", 1)[1]: tuple(w.shape) for w in layer.trainable_weights}
    assert shapes == {"annotation_projection/kernel": (DIM, UNITS),
                      "annotation_projection/bias": (UNITS,),
                      "hidden_projection/kernel": (HIDDEN, UNITS),
                      "score_kernel": (UNITS,)}
    assert layer.count_params() == DIM * UNITS + UNITS + HIDDEN * UNITS + UNITS
    assert not layer.non_trainable_weights


def test_symbolic_call():
    layer = SoftAttention(UNITS)
    context, alpha = layer(keras.Input((REGIONS, DIM)), keras.Input((HIDDEN,)))
    assert tuple(context.shape) == (None, DIM)
    assert tuple(alpha.shape) == (None, REGIONS) and alpha.dtype == "float32"


def test_weights_sum_to_one_and_context_is_expectation():
    layer = _built()
    a = annotations()
    context, alpha = layer(a, hidden())
    alpha = np.asarray(alpha)
    np.testing.assert_allclose(alpha.sum(-1), 1.0, rtol=1e-6)
    assert (alpha > 0).all()
    np.testing.assert_allclose(context, np.einsum("bl,bld->bd", alpha, a), rtol=1e-5, atol=1e-6)


def test_masked_regions_get_exactly_zero_weight():
    layer = _built()
    mask = np.ones((2, REGIONS), bool)
    mask[0, [0, 4, 8]] = False
    mask[1, 1:] = False
    _, alpha = layer(annotations(), hidden(), mask=mask)
    alpha = np.asarray(alpha)
    assert (alpha[~mask] == 0.0).all()
    np.testing.assert_allclose(alpha.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(alpha[1, 0], 1.0)


def test_pre_projected_annotations_give_the_same_result():
    layer = _built()
    a, h = annotations(), hidden()
    projected = layer.project(a)
    assert tuple(projected.shape) == (2, REGIONS, UNITS)
    for x, y in zip(layer(a, h), layer(a, h, projected=projected)):
        np.testing.assert_array_equal(x, y)


def test_save_and_load_give_identical_outputs(tmp_path):
    a_in, h_in = keras.Input((REGIONS, DIM)), keras.Input((HIDDEN,))
    layer = SoftAttention(UNITS, name="attention")
    model = keras.Model([a_in, h_in], layer(a_in, h_in))
    model.save(tmp_path / "att.keras")
    revived = keras.saving.load_model(tmp_path / "att.keras")
    assert isinstance(revived.get_layer("attention"), SoftAttention)
    for x, y in zip(model([annotations(), hidden()]), revived([annotations(), hidden()])):
        np.testing.assert_array_equal(x, y)


def test_one_training_step_updates_every_weight():
    layer = _built()
    a, h = tf.constant(annotations()), tf.constant(hidden())
    before = [w.numpy().copy() for w in layer.trainable_weights]
    optimizer = keras.optimizers.SGD(0.1)
    with tf.GradientTape() as tape:
        context, alpha = layer(a, h, training=True)
        loss = tf.reduce_sum(context[:, 0]) + tf.reduce_sum(alpha[:, 0])
    grads = tape.gradient(loss, layer.trainable_weights)
    assert all(g is not None for g in grads)
    optimizer.apply_gradients(zip(grads, layer.trainable_weights))
    assert all(not np.array_equal(b, w.numpy()) for b, w in zip(before, layer.trainable_weights))


@pytest.mark.parametrize("name,compute", [("mixed_float16", "float16"),
                                          ("mixed_bfloat16", "bfloat16")])
def test_mixed_precision_dtypes(name, compute):
    with policy(name):
        layer = _built()
        context, alpha = layer(annotations(), hidden())
    assert context.dtype == compute
    assert alpha.dtype == "float32"            # softmax in float32
    assert all(w.dtype == "float32" for w in layer.weights)
    np.testing.assert_allclose(np.asarray(alpha).sum(-1), 1.0, rtol=1e-5)
