"""numpy <-> TensorProto conversions agree with TensorFlow's own."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from serving.tensors import TensorParseError, ndarray_to_tensor_proto, tensor_proto_to_ndarray

ARRAYS = [
    np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    np.arange(6, dtype=np.int32).reshape(1, 2, 3) - 3,
    np.array([2**40, -5], dtype=np.int64),
    np.array([0.5, np.nan, np.inf], dtype=np.float64),
    np.array([True, False]),
    np.arange(4, dtype=np.uint8),
    np.array([1.5, -2.25], dtype=np.float16),
    np.array(3.0, dtype=np.float32),
    np.zeros((0, 3), dtype=np.float32),
]


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype}{list(a.shape)}")
def test_round_trip_and_tensorflow_agrees(array):
    proto = ndarray_to_tensor_proto(array)
    np.testing.assert_array_equal(tf.make_ndarray(proto), array)
    np.testing.assert_array_equal(tensor_proto_to_ndarray(proto), array)
    # TF Serving answers with repeated fields (float_val, ...) by default: read those too.
    if array.dtype != np.float16:
        fields = as_repeated_fields(proto)
        assert not fields.tensor_content
        np.testing.assert_array_equal(tf.make_ndarray(fields), array)
        out = tensor_proto_to_ndarray(fields)
        assert out.dtype == array.dtype
        np.testing.assert_array_equal(out, array)


def as_repeated_fields(proto):
    """The same tensor with its values in the typed repeated field, as TF Serving sends."""
    from serving.tensors import _DTYPES
    out = type(proto)(dtype=proto.dtype, tensor_shape=proto.tensor_shape)
    getattr(out, _DTYPES[proto.dtype][1]).extend(tf.make_ndarray(proto).reshape(-1).tolist())
    return out


def test_strings_keep_trailing_nul_bytes():
    values = [b"ab\x00\x00", b"\x00", "caf\u00e9"]
    proto = ndarray_to_tensor_proto(values)
    assert list(proto.string_val) == [b"ab\x00\x00", b"\x00", "caf\u00e9".encode()]
    out = tensor_proto_to_ndarray(proto)
    assert out.dtype == object and out.tolist() == [b"ab\x00\x00", b"\x00", "caf\u00e9".encode()]
    assert tf.make_ndarray(proto).tolist() == out.tolist()


def test_short_value_lists_repeat_the_last_value():
    proto = tf.make_tensor_proto(0.0, shape=[2, 2])
    proto.ClearField("tensor_content")
    del proto.float_val[:]
    proto.float_val.extend([1.0, 2.0])
    np.testing.assert_array_equal(tensor_proto_to_ndarray(proto), [[1, 2], [2, 2]])


def test_invalid_protos_are_rejected():
    proto = ndarray_to_tensor_proto(np.zeros((2, 2), np.float32))
    proto.tensor_content = proto.tensor_content[:-1]
    with pytest.raises(TensorParseError, match="tensor_content"):
        tensor_proto_to_ndarray(proto)
    proto = ndarray_to_tensor_proto(np.zeros(2, np.float32))
    proto.tensor_shape.dim[0].size = -2
    with pytest.raises(TensorParseError):
        tensor_proto_to_ndarray(proto)
    proto = ndarray_to_tensor_proto(np.zeros(2, np.float32))
    proto.tensor_shape.unknown_rank = True
    with pytest.raises(TensorParseError):
        tensor_proto_to_ndarray(proto)
    proto = ndarray_to_tensor_proto([b"a", b"b", b"c"])
    proto.tensor_shape.dim[0].size = 2
    with pytest.raises(TensorParseError):
        tensor_proto_to_ndarray(proto)
