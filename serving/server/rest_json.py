"""TF Serving's REST JSON: request bodies to input arrays, output arrays to JSON.

Request bodies are `{"instances": [...]}` (row format) or `{"inputs": ...}`
(columnar); `{"b64": "..."}` stands for binary strings. JSON values are
typed by TF Serving's rules (an integer for an integer input, a number for
a float input, a string or `{"b64"}` for a string input); ragged lists and
lists nested deeper than `MAX_JSON_RANK` are refused. Outputs come back as
`predictions` (row format) or `outputs` (columnar); string outputs whose
name ends in `_bytes`, and strings that are not UTF-8, come back as
`{"b64": "..."}`.
"""
from __future__ import annotations

import base64
import binascii
import itertools
import json
import math
import re
from typing import Any, Dict, Optional

import grpc
import numpy as np
import orjson
import tensorflow as tf

from serving.errors import ServingError, internal, invalid_argument
from serving.server.predictor import check_counts

MAX_JSON_RANK = 64  # numpy's limit on dimensions; deeper JSON lists are the client's fault
# Bodies larger than this that cannot start a JSON object are refused
# without parsing them (smaller ones are parsed, for the exact reason).
PARSE_NON_OBJECT_BYTES = 64 * 1024
_LEADING_SPACE = re.compile(rb"[ \t\r\n]*")


def check_json_start(body: bytes) -> None:
    """Refuses a large body that cannot be a JSON object, before parsing it."""
    if len(body) <= PARSE_NON_OBJECT_BYTES:
        return
    start = _LEADING_SPACE.match(body).end()
    if body[start:start + 1] != b"{":
        raise invalid_argument(f"JSON Value: request body is not an object: it starts with "
                               f"{body[start:start + 16]!r} (a predict request is a JSON "
                               f"object, '{{')")


def parse_json(body: bytes) -> Dict[str, Any]:
    if not body:
        raise invalid_argument("JSON Parse error: The document is empty")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise invalid_argument(f"JSON Parse error: {e}") from None
    if not isinstance(doc, dict):
        raise invalid_argument("JSON Value: request body is not an object")
    return doc


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _leaf(value: Any, dtype: tf.DType) -> Any:
    """One JSON scalar as a value of `dtype` (TF Serving's JSON typing rules)."""
    if dtype == tf.string:
        if isinstance(value, str):
            try:
                return value.encode("utf-8")
            except UnicodeEncodeError:  # JSON's "\ud800": a lone surrogate
                raise invalid_argument(f"JSON Value: {json.dumps(value)[:100]} is not valid "
                                       f"Unicode (unpaired surrogate)") from None
        if _is_b64(value):
            try:
                return base64.b64decode(value["b64"], validate=True)
            except (binascii.Error, ValueError):
                raise invalid_argument("Unable to base64 decode") from None
    elif dtype.is_bool:
        if isinstance(value, bool):
            return value
    elif dtype.is_integer:
        if isinstance(value, int) and not isinstance(value, bool):
            if not dtype.min <= value <= dtype.max:
                raise invalid_argument(f"JSON Value: {value} is out of range for {dtype.name}")
            return value
    elif dtype.is_floating:
        if isinstance(value, float):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an integer literal like 10**400
                raise invalid_argument(f"JSON Value: {str(value)[:40]}... is out of range for "
                                       f"{dtype.name}") from None
    else:
        raise ServingError(grpc.StatusCode.UNIMPLEMENTED,
                           f"Conversion of JSON Value to type: {dtype.name}")
    kind = type(value).__name__
    raise invalid_argument(f"JSON Value: {json.dumps(value)[:100]} Type: {kind} is not of "
                           f"expected type: {dtype.name}")


def _json_tensor(value: Any, dtype: tf.DType, max_images: int = 0, name: str = "") -> np.ndarray:
    """A (possibly nested) JSON list as a dense array; ragged lists are rejected.

    With `max_images`, rows beyond it, and strings (images) beyond it, are
    refused before the values are walked or converted.
    """
    shape = []
    probe = value
    while isinstance(probe, list):
        shape.append(len(probe))
        if len(shape) > MAX_JSON_RANK:
            raise invalid_argument(f"JSON value nested more than {MAX_JSON_RANK} lists deep: "
                                   f"a tensor may have at most {MAX_JSON_RANK} dimensions")
        if not probe:
            break
        probe = probe[0]
    if max_images and shape:
        check_counts({name: ((shape[0],), False)}, max_images)
        if dtype == tf.string and math.prod(shape) > max_images:
            check_counts({name: (shape, True)}, max_images)
    if _FAST_NUMBERS and (dtype.is_integer or dtype.is_floating):
        fast = _numbers_at_c_speed(value, shape, dtype)
        if fast is not None:
            return fast
    flat = []

    def walk(item, level):
        if isinstance(item, list):
            if level >= len(shape):
                raise invalid_argument(f"Encountered list at unexpected level: {level} "
                                       f"expected < {len(shape)}")
            if len(item) != shape[level]:
                raise invalid_argument(f"Encountered list at unexpected size: {len(item)} at "
                                       f"level: {level} expected size: {shape[level]}")
            for element in item:
                walk(element, level + 1)
        else:
            if level != len(shape):
                raise invalid_argument(f"JSON Value: {json.dumps(item)[:100]} found at "
                                       f"incorrect level: {level + 1} in the JSON DOM. "
                                       f"Expected at level: {len(shape)}")
            flat.append(_leaf(item, dtype))

    try:
        walk(value, 0)
    except RecursionError:
        raise invalid_argument("JSON value nested too deeply") from None
    if dtype == tf.string:
        array = np.empty(len(flat), dtype=object)
        array[:] = flat
        return array.reshape(shape)
    # A finite double beyond float32's range becomes inf, as in TF Serving
    # (rapidjson's GetFloat); only values beyond a double's are refused (_leaf).
    with np.errstate(over="ignore"):
        return np.asarray(flat, dtype=dtype.as_numpy_dtype).reshape(shape)


_FAST_NUMBERS = True  # tests turn it off to compare with the element-by-element walk


def _numbers_at_c_speed(value: Any, shape: list, dtype: tf.DType) -> Optional[np.ndarray]:
    """A dense list of plain JSON numbers as an array, without a Python step per element.

    Returns None whenever the element-by-element walk (`_json_tensor`) could
    answer differently: ragged lists, other types (strings, null, objects),
    booleans (numpy would take True as 1), integers outside int64 or the
    dtype's range, floats for an integer dtype. The walk then gives the
    exact error; for valid input both give the same array.
    """
    if not shape:  # a scalar: nothing to gain
        return None
    try:
        with np.errstate(over="ignore"):
            array = np.array(value)
    except (ValueError, TypeError, OverflowError):
        return None
    if array.shape != tuple(shape) or array.dtype.kind not in "if":
        return None
    if dtype.is_integer and array.dtype.kind != "i":
        return None
    flat = value
    for _ in range(len(shape) - 1):
        flat = itertools.chain.from_iterable(flat)
    if bool in map(type, flat):
        return None
    if array.dtype.kind == "i" and array.size and dtype.is_integer:
        if array.min() < dtype.min or array.max() > dtype.max:
            return None
    with np.errstate(over="ignore"):
        return array.astype(dtype.as_numpy_dtype)


def inputs_from_instances(instances: Any, specs: Dict[str, tf.TensorSpec],
                           max_images: int = 0) -> Dict[str, np.ndarray]:
    if not isinstance(instances, list):
        raise invalid_argument("Excepting 'instances' to be an list/array")
    if not instances:
        raise invalid_argument("No values in 'instances' array")
    if max_images and len(instances) > max_images:
        check_counts({"instances": ((len(instances),), False)}, max_images)
    as_objects = isinstance(instances[0], dict) and not _is_b64(instances[0])
    if not as_objects:
        if len(specs) != 1:
            raise invalid_argument("instances is a plain list, but expecting list of objects "
                                   "as multiple input tensors required as per tensorinfo_map")
        (name, spec), = specs.items()
        if any(isinstance(e, dict) and not _is_b64(e) for e in instances):
            raise invalid_argument("Expecting value/list but got object in the input list")
        return {name: _json_tensor(instances, spec.dtype, max_images, name)}
    columns: Dict[str, list] = {name: [] for name in specs}
    for index, element in enumerate(instances):
        if not isinstance(element, dict) or _is_b64(element):
            raise invalid_argument(f"Expecting object but got list at item {index} of input list")
        if set(element) != set(specs):
            raise invalid_argument(
                f"Failed to process element: {index} of 'instances' list. JSON object keys "
                f"must be equal to: {','.join(sorted(specs))}")
        for name in specs:
            columns[name].append(element[name])
    return {name: _json_tensor(columns[name], specs[name].dtype, max_images, name)
            for name in specs}


def inputs_from_columns(inputs: Any, specs: Dict[str, tf.TensorSpec],
                         max_images: int = 0) -> Dict[str, np.ndarray]:
    if not isinstance(inputs, dict) or _is_b64(inputs):
        if len(specs) != 1:
            raise invalid_argument("inputs is a plain value/list, but expecting an object as "
                                   "multiple input tensors required as per tensorinfo_map")
        (name, spec), = specs.items()
        return {name: _json_tensor(inputs, spec.dtype, max_images, name)}
    arrays = {}
    for name, spec in specs.items():
        if name not in inputs:
            raise invalid_argument(f"Missing named input: {name} in 'inputs' object.")
        arrays[name] = _json_tensor(inputs[name], spec.dtype, max_images, name)
    return arrays


def _to_json(name: str, array: np.ndarray, keep_numbers: bool = False) -> Any:
    """Array -> nested lists; strings as text, or {"b64": ...} for `*_bytes` / non-UTF-8.

    With `keep_numbers`, a numeric array of rank >= 1 stays an array, for
    orjson to write without a Python object per element.
    """
    if array.dtype == object:
        as_bytes = name.endswith("_bytes")

        def convert(value):
            if isinstance(value, bytes):
                if not as_bytes:
                    try:
                        return value.decode("utf-8")
                    except UnicodeDecodeError:
                        pass
                return {"b64": base64.b64encode(value).decode("ascii")}
            return value

        flat = np.empty(array.size, dtype=object)
        flat[:] = [convert(value) for value in array.reshape(-1)]
        return flat.reshape(array.shape).tolist()
    if keep_numbers and array.ndim:
        return np.ascontiguousarray(array)
    return array.tolist()


def row_response(outputs: Dict[str, np.ndarray], keep_numbers: bool = False) -> Dict[str, Any]:
    """`{"predictions": ...}`: one object per row (one value when there is one output)."""
    sizes = {name: (a.shape[0] if a.ndim else None) for name, a in outputs.items()}
    for name, size in sizes.items():
        if size is None:
            raise invalid_argument(f"Tensor name: {name} has no shape information ")
    if len(set(sizes.values())) > 1:
        raise invalid_argument(f"Tensor outputs have inconsistent batch sizes: {sizes}")
    converted = {name: _to_json(name, a, keep_numbers) for name, a in outputs.items()}
    batch = next(iter(sizes.values())) if sizes else 0
    if len(converted) == 1:
        (values,) = converted.values()
        return {"predictions": values}
    return {"predictions": [{name: converted[name][i] for name in converted}
                            for i in range(batch)]}


def column_response(outputs: Dict[str, np.ndarray], keep_numbers: bool = False
                    ) -> Dict[str, Any]:
    """`{"outputs": ...}`: one value per output (the value itself when there is one)."""
    converted = {name: _to_json(name, a, keep_numbers) for name, a in outputs.items()}
    if len(converted) == 1:
        (values,) = converted.values()
        return {"outputs": values}
    return {"outputs": converted}


def encode_outputs(outputs: Dict[str, np.ndarray], row_format: bool) -> bytes:
    """A predict answer as JSON bytes: `row_response` or `column_response`, encoded.

    Numeric arrays are written by orjson straight from their buffers (float32
    in its shortest round-trip form, as TF Serving writes it). Outputs with
    NaN or infinities are refused (INTERNAL, naming them): TF Serving writes
    them as `NaN` / `Infinity`, which is not JSON (RFC 8259), and browsers'
    `JSON.parse` fails on it; requests cannot cause them (non-finite inputs
    are refused), so they mean a broken model.
    """
    respond = row_response if row_format else column_response
    broken = sorted(name for name, a in outputs.items()
                    if a.dtype.kind in "fc" and not np.isfinite(a).all())
    if broken:
        raise internal(f"the model returned NaN or infinite values in output(s) "
                       f"{', '.join(broken)}, which JSON cannot carry; the model may be broken "
                       f"(its gRPC answer carries them as they are)")
    try:
        return orjson.dumps(respond(outputs, keep_numbers=True),
                            option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:  # orjson.JSONEncodeError: a dtype it does not write
        return encode(respond(outputs))


def encode(payload: Dict[str, Any]) -> bytes:
    """A JSON document as UTF-8 bytes."""
    return json.dumps(payload, indent=None, allow_nan=False).encode("utf-8")
