"""numpy <-> TensorProto without TensorFlow ops (client and server share it).

Numeric tensors go out as little-endian `tensor_content` (what
`tf.make_tensor_proto` writes); strings as `string_val`. Reading accepts
both `tensor_content` and the typed repeated fields (`float_val`, ...),
with TensorFlow's rule that a short value list is padded with its last
value, because TF Serving answers with the repeated fields by default.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from serving.protos import DATA_TYPE


def _dtype(name: str) -> int:
    return DATA_TYPE.values_by_name[name].number


DT_STRING = _dtype("DT_STRING")
DT_HALF = _dtype("DT_HALF")
_COMPLEX = (_dtype("DT_COMPLEX64"), _dtype("DT_COMPLEX128"))
# numpy's limits: 64 dimensions, and a byte size (zero dimensions left out,
# 16-byte items at most) that fits in an int64.
_MAX_RANK = 64
_MAX_EXTENT = (2 ** 63 - 1) // 16

# dtype enum -> (numpy dtype, repeated field for values when not tensor_content)
_DTYPES = {
    _dtype("DT_FLOAT"): (np.float32, "float_val"),
    _dtype("DT_DOUBLE"): (np.float64, "double_val"),
    _dtype("DT_INT32"): (np.int32, "int_val"),
    _dtype("DT_INT16"): (np.int16, "int_val"),
    _dtype("DT_INT8"): (np.int8, "int_val"),
    _dtype("DT_UINT8"): (np.uint8, "int_val"),
    _dtype("DT_UINT16"): (np.uint16, "int_val"),
    _dtype("DT_INT64"): (np.int64, "int64_val"),
    _dtype("DT_UINT32"): (np.uint32, "uint32_val"),
    _dtype("DT_UINT64"): (np.uint64, "uint64_val"),
    _dtype("DT_BOOL"): (np.bool_, "bool_val"),
    _dtype("DT_HALF"): (np.float16, "half_val"),
    _dtype("DT_COMPLEX64"): (np.complex64, "scomplex_val"),
    _dtype("DT_COMPLEX128"): (np.complex128, "dcomplex_val"),
}
_FROM_NUMPY = {np.dtype(np_type): enum for enum, (np_type, _) in _DTYPES.items()}


class TensorParseError(ValueError):
    """A TensorProto that does not describe a valid tensor."""


def dtype_name(enum: int) -> str:
    """'DT_FLOAT' style name of a dtype enum."""
    value = DATA_TYPE.values_by_number.get(enum)
    return value.name if value is not None else str(enum)


def short_dtype_name(enum: int) -> str:
    """'float', 'string', ... as TensorFlow error messages spell dtypes."""
    return dtype_name(enum).replace("DT_", "").lower()


def numpy_dtype_enum(dtype: np.dtype) -> int:
    """The TensorProto dtype enum of a numpy dtype (object/bytes/str -> DT_STRING)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return DT_STRING
    try:
        return _FROM_NUMPY[dtype.newbyteorder("=") if dtype.byteorder != "|" else dtype]
    except KeyError:
        raise TypeError(f"no TensorProto dtype for numpy {dtype}") from None


def ndarray_to_tensor_proto(array, out=None):
    """Builds a TensorProto from a numpy array (or list of bytes/str).

    Strings (object arrays of bytes or str, `S` or `U` arrays) become
    `DT_STRING` with `string_val`; `str` is encoded as UTF-8.

    Args:
      array: the values.
      out: an (empty) TensorProto to fill in place, e.g. a request's or a
        response's map entry, which saves a copy. None: a new
        `tensorflow.core` TensorProto (this imports TensorFlow; the client
        always passes `out`).
    Returns:
      The filled TensorProto (`out` when given).
    """
    if not isinstance(array, np.ndarray):
        array = _as_array(array)
    if out is None:
        from tensorflow.core.framework import tensor_pb2
        out = tensor_pb2.TensorProto()
    proto = out
    proto.dtype = numpy_dtype_enum(array.dtype)
    dims = proto.tensor_shape.dim
    for d in array.shape:
        dims.add().size = int(d)
    if proto.dtype == DT_STRING:
        proto.string_val.extend(
            v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.reshape(-1))
    else:
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        proto.tensor_content = np.ascontiguousarray(array).tobytes()
    return proto


def _as_array(value) -> np.ndarray:
    """np.asarray, except that bytes/str become an object array: numpy's `S`
    dtype would drop trailing NUL bytes from binary data such as images."""
    probe = value
    while isinstance(probe, (list, tuple)) and probe:
        probe = probe[0]
    if isinstance(probe, (bytes, str)):
        return np.array(value, dtype=object)
    return np.asarray(value)


def tensor_shape(proto, max_elements: Optional[int] = None) -> tuple:
    """The shape a TensorProto claims, checked, without materializing anything.

    Raises:
      TensorParseError: unknown rank, negative sizes, shapes too large to
        allocate or over `max_elements`.
    """
    shape_proto = proto.tensor_shape
    if shape_proto.unknown_rank:
        raise TensorParseError("tensor shape has unknown rank")
    shape = tuple(int(d.size) for d in shape_proto.dim)
    if any(d < 0 for d in shape):
        raise TensorParseError(f"tensor shape {list(shape)} has a negative size")
    if len(shape) > _MAX_RANK:
        raise TensorParseError(f"tensor rank {len(shape)} exceeds {_MAX_RANK}")
    # Python ints: an int64 product would wrap around.
    if math.prod(d for d in shape if d) > _MAX_EXTENT:
        raise TensorParseError(f"tensor shape {list(shape)} is too large")
    n = math.prod(shape)
    if max_elements is not None and n > max_elements:
        raise TensorParseError(f"tensor shape {list(shape)} has {n} elements, more than the "
                               f"limit of {max_elements}")
    return shape


def tensor_proto_to_ndarray(proto,
                            max_elements: Optional[int] = None) -> np.ndarray:
    """Reads a TensorProto into a numpy array (strings: object array of bytes).

    Args:
      proto: the tensor.
      max_elements: refuse shapes with more elements than this (None: no
        limit). The padding rule lets a few bytes claim any shape, so a
        server bounds what one small request can make it allocate.
    Raises:
      TensorParseError: unknown rank, negative sizes, shapes too large to
        allocate or over `max_elements`, or values that do not match the
        shape (what TF's `Tensor::FromProto` rejects).
    """
    shape = tensor_shape(proto, max_elements)
    n = math.prod(shape)
    if proto.dtype == DT_STRING:
        values = list(proto.string_val)
        if proto.tensor_content:
            raise TensorParseError("string tensors cannot use tensor_content")
        return _fill(values, n, shape, object)
    if proto.dtype not in _DTYPES:
        raise TensorParseError(f"unsupported dtype {dtype_name(proto.dtype)}")
    np_type, field = _DTYPES[proto.dtype]
    dtype = np.dtype(np_type).newbyteorder("<")
    if proto.tensor_content:
        content = proto.tensor_content
        if len(content) != n * dtype.itemsize:
            raise TensorParseError(
                f"tensor_content has {len(content)} bytes, shape {list(shape)} of "
                f"{short_dtype_name(proto.dtype)} needs {n * dtype.itemsize}")
        return np.frombuffer(content, dtype=dtype).astype(np_type).reshape(shape)
    values = getattr(proto, field)
    if proto.dtype == DT_HALF:
        raw = np.asarray(values, dtype=np.uint16).view(np.float16)
    elif proto.dtype in _COMPLEX:
        flat = np.asarray(values, dtype=np.float64)
        raw = (flat[0::2] + 1j * flat[1::2]).astype(np_type)
    else:
        raw = np.asarray(values, dtype=np_type)
    return _fill(raw, n, shape, np_type)


def _fill(values, n: int, shape: tuple, dtype) -> np.ndarray:
    """TF's rule: no values -> zeros, too few -> repeat the last, too many -> error."""
    count = len(values)
    if count > n:
        raise TensorParseError(f"{count} values for shape {list(shape)} ({n} elements)")
    out = np.empty(n, dtype=dtype)
    if dtype is object:
        out[:count] = values if count else []
        out[count:] = values[-1] if count else b""
    else:
        out[:count] = values
        out[count:] = values[-1] if count else 0
    return out.reshape(shape)
