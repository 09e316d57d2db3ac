"""TF Serving's REST API on the standard library's ThreadingHTTPServer.

    GET  /v1/models/NAME[/versions/V | /labels/L]            model status
    GET  /v1/models/NAME[/versions/V | /labels/L]/metadata   signature defs
    POST /v1/models/NAME[/versions/V | /labels/L]:predict    predict

Predict bodies use TF Serving's formats: `{"instances": [...]}` (row
format, answered with `predictions`) or `{"inputs": ...}` (columnar,
answered with `outputs`), optional `signature_name`, and `{"b64": "..."}`
for binary strings; string outputs whose name ends in `_bytes` come back
base64-encoded. Errors are `{"error": "..."}` with the HTTP status TF
Serving uses for the gRPC code (400 invalid argument or failed
precondition, 404 not found, 501 unimplemented, ...); a body over
`max_request_bytes` gets 413, as libevent (TF Serving's HTTP layer) answers.
"""
from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Optional
from urllib.parse import unquote, urlsplit

import grpc
import numpy as np
import tensorflow as tf
from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2, model_pb2

from serving.errors import ServingError, invalid_argument
from serving.predictor import SIGNATURE_DEF, Predictor, output_aliases
from serving.servable import DEFAULT_SIGNATURE

log = logging.getLogger(__name__)

_PREDICT = re.compile(r"(?i)^/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?"
                      r":(classify|regress|predict)$")
_STATUS = re.compile(r"(?i)^/v1/models(?:/([^/:]+))?(?:/versions/(\d+)|/labels/([^/:]+))?"
                     r"(?:/(metadata))?$")


class RestServer:
    """Serves the REST API in a background thread.

    Args:
      predictor: the shared request logic.
      host: address to bind.
      port: port to bind (0: any free port).
      max_request_bytes: largest accepted request body.
      ssl_context: a server-side `ssl.SSLContext` for HTTPS, or None.
    """

    def __init__(self, predictor: Predictor, host: str = "127.0.0.1", port: int = 8501,
                 max_request_bytes: int = 16 << 20, ssl_context: Optional[ssl.SSLContext] = None):
        handler = type("Handler", (_Handler,), {"predictor": predictor,
                                                "max_request_bytes": max_request_bytes})
        server_cls = _HTTPServer6 if ":" in host else _HTTPServer
        self._httpd = server_cls((host, port), handler)
        if ssl_context is not None:
            # The handshake runs in the connection's own thread (see _Handler.setup).
            self._httpd.socket = ssl_context.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.host = host
        self.port = self._httpd.server_address[1]
        self.scheme = "https" if ssl_context is not None else "http"
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def start(self) -> "RestServer":
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={
            "poll_interval": 0.2}, name="rest-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128

    def handle_error(self, request, client_address):
        log.debug("REST connection from %s failed", client_address, exc_info=True)


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "captioner-serving"
    timeout = 60  # seconds a connection may stay idle or slow
    predictor: Predictor
    max_request_bytes: int

    def setup(self):
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()

    def log_message(self, format, *args):
        log.debug("%s - %s", self.address_string(), format % args)

    # -- dispatch ----------------------------------------------------------

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def do_PATCH(self):
        self._dispatch("PATCH")

    def _dispatch(self, method: str) -> None:
        path = urlsplit(self.path).path
        try:
            has_body = method == "POST" or "Content-Length" in self.headers
            body = self._read_body() if has_body else b""
            if not path.lower().startswith("/v1/"):
                self._send(404, {"error": f"Not found: {method} {path}"})
                return
            self._send(200, self._route(method, path, body))
        except ServingError as e:
            self._send(e.http_status, {"error": e.message})
        except _HTTPError as e:  # the body may be unread: do not reuse the connection
            self.close_connection = True
            self._send(e.status, {"error": e.message})
        except Exception as e:  # a bad request never takes the server down
            log.exception("REST %s %s failed", method, path)
            self._send(500, {"error": f"{type(e).__name__}: {e}"})

    def _route(self, method: str, path: str, body: bytes) -> Dict[str, Any]:
        if method == "POST":
            match = _PREDICT.match(path)
            if match:
                name, version, label, verb = match.groups()
                spec = _model_spec(name, version, label)
                if verb.lower() != "predict":
                    raise ServingError(grpc.StatusCode.UNIMPLEMENTED,
                                       f"{verb} is not supported by this server")
                return self._predict(spec, body)
        else:
            match = _STATUS.match(path)
            if match:
                name, version, label, metadata = match.groups()
                if not name:
                    raise invalid_argument("Missing model name in request.")
                spec = _model_spec(name, version, label)
                return self._metadata(spec) if metadata else self._status(spec)
        raise invalid_argument(f"Malformed request: {method} {path}")

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raise _HTTPError(411, "chunked request bodies are not supported; "
                                  "send Content-Length")
        length = self.headers.get("Content-Length")
        if length is None:
            raise _HTTPError(411, "Content-Length required")
        try:
            size = int(length)
        except ValueError:
            raise _HTTPError(400, f"bad Content-Length {length!r}") from None
        if size < 0:
            raise _HTTPError(400, f"bad Content-Length {length!r}")
        if size > self.max_request_bytes:
            # Read and drop a moderately oversized body first: closing with
            # unread data resets the connection, and the client would see
            # the reset instead of this answer.
            if size <= 8 * self.max_request_bytes:
                left = size
                while left > 0:
                    chunk = self.rfile.read(min(left, 1 << 16))
                    if not chunk:
                        break
                    left -= len(chunk)
            raise _HTTPError(413, f"request body of {size} bytes exceeds the limit of "
                                  f"{self.max_request_bytes} bytes")
        return self.rfile.read(size)

    def _send(self, status: int, payload: Dict[str, Any]) -> None:
        data = json.dumps(payload, indent=None).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    # -- endpoints ---------------------------------------------------------

    def _status(self, spec: model_pb2.ModelSpec) -> Dict[str, Any]:
        response = self.predictor.model_status(
            get_model_status_pb2.GetModelStatusRequest(model_spec=spec))
        return json_format.MessageToDict(response, always_print_fields_with_no_presence=True)

    def _metadata(self, spec: model_pb2.ModelSpec) -> Dict[str, Any]:
        response = self.predictor.metadata(get_model_metadata_pb2.GetModelMetadataRequest(
            model_spec=spec, metadata_field=[SIGNATURE_DEF]))
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata[SIGNATURE_DEF].Unpack(signature_map)
        options = dict(preserving_proto_field_name=True,
                       always_print_fields_with_no_presence=True)
        return {"model_spec": json_format.MessageToDict(response.model_spec, **options),
                "metadata": {SIGNATURE_DEF: json_format.MessageToDict(signature_map, **options)}}

    def _predict(self, spec: model_pb2.ModelSpec, body: bytes) -> Dict[str, Any]:
        doc = _parse_json(body)
        signature_name = doc.get("signature_name", "")
        if not isinstance(signature_name, str):
            raise invalid_argument("'signature_name' key must be a string value.")
        servable = self.predictor.resolve(spec)
        key = signature_name or DEFAULT_SIGNATURE
        if key not in servable.signatures:
            raise invalid_argument(f'Serving signature name: "{key}" not found in signature def')
        signature = servable.signature(key)
        if "instances" in doc and "inputs" in doc:
            raise invalid_argument("Not formatted correctly expecting only one of 'inputs' or "
                                   "'instances' keys to exist")
        if "instances" in doc:
            inputs, row_format = _inputs_from_instances(doc["instances"], signature.inputs), True
        elif "inputs" in doc:
            inputs, row_format = _inputs_from_columns(doc["inputs"], signature.inputs), False
        else:
            raise invalid_argument("Missing 'inputs' or 'instances' key")
        outputs = self.predictor.run(servable, signature, inputs)
        outputs = {alias: outputs[alias] for alias in output_aliases(signature, ())}
        return _predictions(outputs) if row_format else _columns(outputs)


class _HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _model_spec(name: str, version: Optional[str], label: Optional[str]) -> model_pb2.ModelSpec:
    spec = model_pb2.ModelSpec(name=unquote(name))
    if version is not None:
        try:
            spec.version.value = int(version)
        except (ValueError, OverflowError):
            raise invalid_argument(f"Failed to convert version: {version} to numeric.") from None
    if label is not None:
        spec.version_label = unquote(label)
    return spec


def _parse_json(body: bytes) -> Dict[str, Any]:
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
            return value.encode("utf-8")
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
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    else:
        raise ServingError(grpc.StatusCode.UNIMPLEMENTED,
                           f"Conversion of JSON Value to type: {dtype.name}")
    kind = type(value).__name__
    raise invalid_argument(f"JSON Value: {json.dumps(value)[:100]} Type: {kind} is not of "
                           f"expected type: {dtype.name}")


def _json_tensor(value: Any, dtype: tf.DType) -> np.ndarray:
    """A (possibly nested) JSON list as a dense array; ragged lists are rejected."""
    shape = []
    probe = value
    while isinstance(probe, list):
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
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
    return np.asarray(flat, dtype=dtype.as_numpy_dtype).reshape(shape)


def _inputs_from_instances(instances: Any, specs: Dict[str, tf.TensorSpec]
                           ) -> Dict[str, np.ndarray]:
    if not isinstance(instances, list):
        raise invalid_argument("Excepting 'instances' to be an list/array")
    if not instances:
        raise invalid_argument("No values in 'instances' array")
    as_objects = isinstance(instances[0], dict) and not _is_b64(instances[0])
    if not as_objects:
        if len(specs) != 1:
            raise invalid_argument("instances is a plain list, but expecting list of objects "
                                   "as multiple input tensors required as per tensorinfo_map")
        (name, spec), = specs.items()
        if any(isinstance(e, dict) and not _is_b64(e) for e in instances):
            raise invalid_argument("Expecting value/list but got object in the input list")
        return {name: _json_tensor(instances, spec.dtype)}
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
    return {name: _json_tensor(columns[name], specs[name].dtype) for name in specs}


def _inputs_from_columns(inputs: Any, specs: Dict[str, tf.TensorSpec]) -> Dict[str, np.ndarray]:
    if not isinstance(inputs, dict) or _is_b64(inputs):
        if len(specs) != 1:
            raise invalid_argument("inputs is a plain value/list, but expecting an object as "
                                   "multiple input tensors required as per tensorinfo_map")
        (name, spec), = specs.items()
        return {name: _json_tensor(inputs, spec.dtype)}
    arrays = {}
    for name, spec in specs.items():
        if name not in inputs:
            raise invalid_argument(f"Missing named input: {name} in 'inputs' object.")
        arrays[name] = _json_tensor(inputs[name], spec.dtype)
    return arrays


def _to_json(name: str, array: np.ndarray) -> Any:
    """Array -> nested lists; strings as text, or {"b64": ...} for `*_bytes` / non-UTF-8."""
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
    return array.tolist()


def _predictions(outputs: Dict[str, np.ndarray]) -> Dict[str, Any]:
    sizes = {name: (a.shape[0] if a.ndim else None) for name, a in outputs.items()}
    for name, size in sizes.items():
        if size is None:
            raise invalid_argument(f"Tensor name: {name} has no shape information ")
    if len(set(sizes.values())) > 1:
        raise invalid_argument(f"Tensor outputs have inconsistent batch sizes: {sizes}")
    converted = {name: _to_json(name, a) for name, a in outputs.items()}
    batch = next(iter(sizes.values())) if sizes else 0
    if len(converted) == 1:
        (values,) = converted.values()
        return {"predictions": values}
    return {"predictions": [{name: converted[name][i] for name in converted}
                            for i in range(batch)]}


def _columns(outputs: Dict[str, np.ndarray]) -> Dict[str, Any]:
    converted = {name: _to_json(name, a) for name, a in outputs.items()}
    if len(converted) == 1:
        (values,) = converted.values()
        return {"outputs": values}
    return {"outputs": converted}
