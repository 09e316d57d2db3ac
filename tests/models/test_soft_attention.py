"""SoftAttention: the shared layer contract and the attention behaviour."""
import keras
import numpy as np
import pytest

from models.soft_attention import SoftAttention
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


def _built(**kwargs):
    keras.utils.set_random_seed(0)
    layer = SoftAttention(UNITS, **kwargs)
    layer.build((None, REGIONS, DIM), (None, HIDDEN))
    return layer


def test_layer_contract():
    # The masked call must meet the contract too: mask is how padding reaches the layer.
    mask = np.ones((2, REGIONS), bool)
    mask[0, :3] = False
    run_layer_test(SoftAttention, {"units": UNITS}, (annotations(), hidden()),
                   ((None, DIM), (None, REGIONS)), expected_weights=SCORER_WEIGHTS,
                   call_kwargs={"mask": mask}, float32_outputs=(1,))


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
    for x, y in zip(layer(a, h), layer(a, h, projected=projected), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", ["mixed_float16", "mixed_bfloat16"])
def test_weights_sum_to_one_under_mixed_precision(name):
    with policy(name):
        layer = _built()
        _, alpha = layer(annotations(), hidden())
    np.testing.assert_allclose(np.asarray(alpha).sum(-1), 1.0, rtol=1e-5)
