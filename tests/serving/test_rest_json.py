"""serving/server/rest_json.py: the C-speed path for numbers gives exactly what the walk gives."""
from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.errors import ServingError
from serving.server import rest_json

DTYPES = [tf.float32, tf.float64, tf.float16, tf.int32, tf.int64, tf.int8, tf.uint8]


def _convert(value, dtype, fast: bool):
    old = rest_json._FAST_NUMBERS
    rest_json._FAST_NUMBERS = fast
    try:
        return rest_json._json_tensor(value, dtype)
    except ServingError as e:
        return e.code, e.message
    finally:
        rest_json._FAST_NUMBERS = old


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    return a == b


LEAVES = st.one_of(st.integers(-2 ** 70, 2 ** 70), st.integers(-300, 300),
                   st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
                   st.text(max_size=3))


def _lists(leaf):
    return st.recursive(leaf, lambda inner: st.lists(inner, max_size=4), max_leaves=24)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(_lists(LEAVES), st.sampled_from(DTYPES))
def test_fast_numbers_equal_the_walk(value, dtype):
    value = json.loads(json.dumps(value))  # what a JSON body can hold
    assert _same(_convert(value, dtype, True), _convert(value, dtype, False)), value


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.integers(1, 4), st.integers(1, 5), st.sampled_from(DTYPES),
       st.sampled_from(["ints", "floats", "mixed", "bool", "big", "ragged"]))
def test_dense_grids_equal_the_walk(rows, cols, dtype, kind):
    rng = np.random.RandomState(rows * 10 + cols)
    grid = [[int(v) for v in rng.randint(-200, 200, cols)] for _ in range(rows)]
    if kind == "floats":
        grid = [[float(v) / 3 for v in row] for row in grid]
    elif kind == "mixed":
        grid[0][0] = 0.5
    elif kind == "bool":
        grid[-1][-1] = True
    elif kind == "big":
        grid[0][-1] = 2 ** 40
    elif kind == "ragged":
        grid[-1] = grid[-1] + [1]
    assert _same(_convert(grid, dtype, True), _convert(grid, dtype, False)), grid


def test_fast_path_is_taken_for_plain_numbers(monkeypatch):
    walked = []
    original = rest_json._leaf
    monkeypatch.setattr(rest_json, "_leaf", lambda v, d: walked.append(v) or original(v, d))
    array = rest_json._json_tensor([[[0, 0, 0.5]] * 4] * 2, tf.float32)
    assert array.shape == (2, 4, 3) and array.dtype == np.float32 and not walked
    with pytest.raises(ServingError, match="Type: bool"):
        rest_json._json_tensor([[1.0, True]], tf.float32)
