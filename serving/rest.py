"""TF Serving's REST API on uvicorn, a maintained production ASGI server.

    GET  /v1/models/NAME[/versions/V | /labels/L]            model status
    GET  /v1/models/NAME[/versions/V | /labels/L]/metadata   signature defs
    POST /v1/models/NAME[/versions/V | /labels/L]:predict    predict
    GET  <prometheus path>                                   metrics (when enabled)

Predict bodies use TF Serving's formats: `{"instances": [...]}` (row
format, answered with `predictions`) or `{"inputs": ...}` (columnar,
answered with `outputs`), optional `signature_name`, and `{"b64": "..."}`
for binary strings; string outputs whose name ends in `_bytes` come back
base64-encoded. Errors are `{"error": "..."}` with the HTTP status TF
Serving uses for the gRPC code (400 invalid argument or failed
precondition, 404 not found, 501 unimplemented, ...); a body over
`max_request_bytes` gets 413, as libevent (TF Serving's HTTP layer) answers.

HTTP/1.1 is parsed by h11 (through uvicorn), which enforces the message
framing rules of RFC 9112: conflicting `Content-Length` headers, a length
that is not all digits, an unsupported `Transfer-Encoding` or a missing
`Host` get 400 and the connection is closed, so no leftover bytes can be
read as a second ("smuggled") request. On top of it, a request carrying
both `Transfer-Encoding` and `Content-Length` is refused (400), and chunked
bodies are refused (411) as before. Every error, framing errors included,
is answered in JSON. Requests run on a pool of `num_threads` threads (the
model calls block); the event loop only parses and writes.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import itertools
import json
import logging
import math
import os
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import Any, Dict, Optional, Tuple
from urllib.parse import unquote

import grpc
import h11
import numpy as np
import tensorflow as tf
import uvicorn
from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2, model_pb2
from uvicorn.protocols.http.h11_impl import H11Protocol

from serving.admission import JSON_BYTES_PER_BODY_BYTE
from serving.errors import ServingError, invalid_argument
from serving.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from serving.metrics import ServingMetrics
from serving.predictor import SIGNATURE_DEF, Predictor, check_counts, output_aliases
from serving.servable import DEFAULT_SIGNATURE
from serving.ui_files import UiFiles, is_ui_path
from serving.work_admission import mark_pool

log = logging.getLogger(__name__)

_PREDICT = re.compile(r"(?i)^/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?"
                      r":(classify|regress|predict)$")
_STATUS = re.compile(r"(?i)^/v1/models(?:/([^/:]+))?(?:/versions/(\d+)|/labels/([^/:]+))?"
                     r"(?:/(metadata))?$")
_METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")
MAX_JSON_RANK = 64  # numpy's limit on dimensions; deeper JSON lists are the client's fault
# Limits on the request head (the request line and headers).
MAX_TARGET_BYTES = 64 * 1024    # request target: beyond it, 414
MAX_HEADER_BYTES = 64 * 1024    # one header line: beyond it, 431
MAX_HEADERS = 100               # header lines: beyond it, 431
# A head still incomplete at this size is refused (414 or 431) without
# waiting for the rest.
MAX_HEAD_BYTES = 256 * 1024
IDLE_SECONDS = 60  # a keep-alive connection may stay idle this long
# Bodies larger than this that cannot start a JSON object are refused
# without parsing them (smaller ones are parsed, for the exact reason).
PARSE_NON_OBJECT_BYTES = 64 * 1024
_LEADING_SPACE = re.compile(rb"[ \t\r\n]*")


class RestServer:
    """Serves the REST API from a background thread running uvicorn's event loop.

    Args:
      predictor: the shared request logic.
      host: address to bind.
      port: port to bind (0: any free port).
      max_request_bytes: largest accepted request body.
      ssl_cert, ssl_key: PEM files for HTTPS, or None.
      num_threads: requests handled at once (TF Serving's
        `--rest_api_num_threads`; default 4 per CPU, as there).
      metrics: when given with `metrics_path`, served there in Prometheus
        text format, and every request is counted in it.
      metrics_path: the URL path of the Prometheus endpoint.
      ui: when given, answers `/ui` paths (the attention explorer page).
    Raises:
      OSError: the port cannot be bound.
    """

    def __init__(self, predictor: Predictor, host: str = "127.0.0.1", port: int = 8501,
                 max_request_bytes: int = 16 << 20, ssl_cert: Optional[str] = None,
                 ssl_key: Optional[str] = None, num_threads: Optional[int] = None,
                 metrics: Optional[ServingMetrics] = None, metrics_path: Optional[str] = None,
                 ui: Optional[UiFiles] = None):
        self.host = host
        self._socket = _bind(host, port)
        self.port = self._socket.getsockname()[1]
        self.scheme = "https" if ssl_cert else "http"
        threads = num_threads or 4 * (os.cpu_count() or 1)
        # Marked so that requests waiting for decode capacity leave it threads.
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rest",
                                            initializer=mark_pool, initargs=("rest", threads))
        app = _RestApp(predictor, max_request_bytes, self._executor, metrics, metrics_path)
        app.ui = ui  # `captioner serve --ui`: the page at /ui/ (serving/ui_files.py)
        config = uvicorn.Config(
            app, lifespan="off", log_config=None, access_log=False, ws="none",
            http=_StrictH11Protocol, h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            timeout_keep_alive=IDLE_SECONDS, timeout_graceful_shutdown=5,
            server_header=False, ssl_certfile=ssl_cert, ssl_keyfile=ssl_key, backlog=128)
        try:
            config.load()  # TLS files are read here, so their errors reach the caller
        except Exception:
            self._socket.close()
            raise
        self._server = uvicorn.Server(config)
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "RestServer":
        """Starts serving; returns once the port accepts connections."""
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._socket]},
                                        name="rest-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise OSError(f"the REST server on {self.url} did not start")
            time.sleep(0.005)
        return self

    def stop(self, grace: float = 5.0) -> None:
        """Stops accepting; requests in progress finish (up to `grace` seconds)."""
        if self._thread is not None:
            self._server.config.timeout_graceful_shutdown = max(0.0, grace or 0.0)
            self._server.should_exit = True
            self._thread.join(grace + 5.0)
            self._thread = None
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._socket.close()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP: asyncio then sets TCP_NODELAY on every accepted
    # connection. Without it, the body (a second small write after the
    # headers) waits for the client's delayed ACK: +40 ms per response.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class _StrictH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, answering framing errors in JSON with the right status.

    uvicorn answers every parse error with a plain-text 400; here the
    answer names h11's reason, and a head over MAX_HEAD_BYTES gets 414
    (request line) or 431 (headers), as TF Serving's libevent answers.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._protocol_error: Optional[h11.RemoteProtocolError] = None
        next_event = self.conn.next_event

        def next_event_noting_errors():
            try:
                return next_event()
            except h11.RemoteProtocolError as e:
                self._protocol_error = e
                raise

        self.conn.next_event = next_event_noting_errors

    def handle_events(self) -> None:
        try:
            super().handle_events()
        except UnicodeDecodeError:  # uvicorn decodes the target as ASCII
            self._send_error(400, "Bad HTTP request: the request target is not ASCII")

    def eof_received(self) -> Optional[bool]:
        # A client may half-close once its request is sent (shutdown(SHUT_WR))
        # and still read the answer: keep the transport open for it, and
        # close once it is written (on_response_complete).
        self._eof = True
        if self.cycle is None or self.cycle.response_complete or self.cycle.more_body:
            return None  # idle, or the body will never arrive: close now
        return True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if (getattr(self, "_eof", False) and not self.transport.is_closing()
                and (self.cycle is None or self.cycle.response_complete)):
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        error = self._protocol_error
        status, reason = 400, str(error) if error is not None else msg
        if error is not None and error.error_status_hint == 431:
            pending = self.conn.trailing_data[0]
            line_done = b"\n" in pending.lstrip(b"\r\n")
            status = 431 if line_done else 414
            reason = ("request headers too large" if line_done else "request line too long") + \
                f" (limit {MAX_HEAD_BYTES} bytes)"
        self._send_error(status, f"Bad HTTP request: {reason}")


    def _send_error(self, status: int, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        try:
            self.transport.write(self.conn.send(h11.Response(
                status_code=status, headers=headers, reason=HTTPStatus(status).phrase)))
            self.transport.write(self.conn.send(h11.Data(data=body)))
            self.transport.write(self.conn.send(h11.EndOfMessage()))
        except h11.LocalProtocolError:  # h11 cannot frame an answer here: just close
            pass
        self.transport.close()


class _RestApp:
    """The ASGI application: reads the body, then runs the request on the thread pool."""

    ui: Optional[UiFiles] = None

    def __init__(self, predictor: Predictor, max_request_bytes: int, executor: ThreadPoolExecutor,
                 metrics: Optional[ServingMetrics], metrics_path: Optional[str]):
        self.predictor = predictor
        self.max_request_bytes = max_request_bytes
        self.executor = executor
        self.metrics = metrics
        self.metrics_path = metrics_path if metrics is not None else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        method = scope["method"]
        raw_path = scope.get("raw_path")
        # The undecoded path: model names are unquoted after routing, so
        # "%2F" stays inside a name instead of becoming a path separator.
        path = raw_path.decode("latin-1") if raw_path is not None else scope["path"]
        try:
            _check_head(scope)
            body = await self._read_body(scope["headers"], method, receive)
        except _HTTPError as e:  # the body may be unread: do not reuse the connection
            await _respond(send, e.status, _json({"error": e.message}), close=True)
            return
        except _Disconnected:
            return
        if self.ui is not None and is_ui_path(path):
            await self.ui.respond(scope, send, self.executor)
            return
        if self.metrics_path is not None and path == self.metrics_path and method == "GET":
            data = await asyncio.get_running_loop().run_in_executor(
                self.executor, self.metrics.exposition)
            await _respond(send, 200, data, content_type=METRICS_CONTENT_TYPE)
            return
        status, payload = await asyncio.get_running_loop().run_in_executor(
            self.executor, self._handle, method, path, body)
        await _respond(send, status, _json(payload))

    async def _read_body(self, headers, method: str, receive) -> bytes:
        lengths = [value for name, value in headers if name == b"content-length"]
        encodings = [value for name, value in headers if name == b"transfer-encoding"]
        if encodings and lengths:
            raise _HTTPError(400, "a request may not carry both Transfer-Encoding and "
                                  "Content-Length")
        if encodings:
            raise _HTTPError(411, "chunked request bodies are not supported; "
                                  "send Content-Length")
        if not lengths:
            if method == "POST":
                raise _HTTPError(411, "Content-Length required")
            return b""
        size = int(lengths[0])  # h11 checked it: digits only, one value
        if size > self.max_request_bytes:
            # Read and drop a moderately oversized body first: closing with
            # unread data resets the connection, and the client would see
            # the reset instead of this answer.
            if size <= 8 * self.max_request_bytes:
                while True:
                    message = await receive()
                    if message["type"] != "http.request" or not message.get("more_body"):
                        break
            raise _HTTPError(413, f"request body of {size} bytes exceeds the limit of "
                                  f"{self.max_request_bytes} bytes")
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                return b"".join(chunks)

    # -- on the thread pool ----------------------------------------------------

    def _handle(self, method: str, path: str, body: bytes) -> Tuple[int, Dict[str, Any]]:
        """(HTTP status, JSON payload) of one request; counts it in the metrics."""
        started = time.perf_counter()
        seen: Dict[str, str] = {}  # model_name and api, once routing knows them
        code = grpc.StatusCode.OK
        try:
            if method not in _METHODS:
                return 501, {"error": f"Unsupported method ({method!r})"}
            if not path.lower().startswith("/v1/"):
                return 404, {"error": f"Not found: {method} {path}"}
            return 200, self._route(method, path, body, seen)
        except ServingError as e:
            code = e.code
            return e.http_status, {"error": e.message}
        except Exception as e:  # a bad request never takes the server down
            code = grpc.StatusCode.INTERNAL
            log.exception("REST %s %s failed", method, path)
            return 500, {"error": f"{type(e).__name__}: {e}"}
        finally:
            if self.metrics is not None and "model_name" in seen:
                self.metrics.record_request(seen["model_name"], code.name, seen["api"], "REST",
                                            1e6 * (time.perf_counter() - started))

    def _route(self, method: str, path: str, body: bytes, seen: Dict[str, str]
               ) -> Dict[str, Any]:
        if method == "POST":
            match = _PREDICT.match(path)
            if match:
                name, version, label, verb = match.groups()
                seen.update(model_name=unquote(name), api=verb.lower())
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
                seen.update(model_name=unquote(name),
                            api="GetModelMetadata" if metadata else "GetModelStatus")
                spec = _model_spec(name, version, label)
                return self._metadata(spec) if metadata else self._status(spec)
        raise invalid_argument(f"Malformed request: {method} {path}")

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
        _check_json_start(body)
        # Parsing makes Python objects many times the body's size: that
        # memory is reserved from the decode budget first.
        with self.predictor.budget.reserve(len(body) * JSON_BYTES_PER_BODY_BYTE,
                                           f"a JSON body of {len(body)} bytes"):
            return self._predict_json(spec, _parse_json(body))

    def _predict_json(self, spec: model_pb2.ModelSpec, doc: Dict[str, Any]) -> Dict[str, Any]:
        max_images = self.predictor.max_images
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
            inputs, row_format = _inputs_from_instances(doc["instances"], signature.inputs,
                                                        max_images), True
        elif "inputs" in doc:
            inputs, row_format = _inputs_from_columns(doc["inputs"], signature.inputs,
                                                      max_images), False
        else:
            raise invalid_argument("Missing 'inputs' or 'instances' key")
        outputs = self.predictor.run(servable, signature, inputs)
        outputs = {alias: outputs[alias] for alias in output_aliases(signature, ())}
        return _predictions(outputs) if row_format else _columns(outputs)




def _check_head(scope) -> None:
    """HTTP version and head size limits (505, 414, 431), as TF Serving's libevent sets."""
    if scope.get("http_version") not in ("1.0", "1.1"):
        raise _HTTPError(505, f"HTTP version {scope.get('http_version')} is not supported")
    target = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
    if target > MAX_TARGET_BYTES:
        raise _HTTPError(414, f"request target of {target} bytes exceeds the limit of "
                              f"{MAX_TARGET_BYTES} bytes")
    headers = scope["headers"]
    if len(headers) > MAX_HEADERS:
        raise _HTTPError(431, f"{len(headers)} header lines exceed the limit of {MAX_HEADERS}")
    for name, value in headers:
        if len(name) + len(value) + 2 > MAX_HEADER_BYTES:
            raise _HTTPError(431, f"a header line exceeds the limit of {MAX_HEADER_BYTES} "
                                  f"bytes")


class _Disconnected(Exception):
    """The client went away before its body arrived."""


def _json(payload: Dict[str, Any]) -> bytes:
    return json.dumps(payload, indent=None).encode("utf-8")


async def _respond(send, status: int, data: bytes, content_type: str = "application/json",
                   close: bool = False) -> None:
    headers = [(b"content-type", content_type.encode("latin-1")),
               (b"content-length", str(len(data)).encode("ascii"))]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


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


def _check_json_start(body: bytes) -> None:
    """Refuses a large body that cannot be a JSON object, before parsing it."""
    if len(body) <= PARSE_NON_OBJECT_BYTES:
        return
    start = _LEADING_SPACE.match(body).end()
    if body[start:start + 1] != b"{":
        raise invalid_argument(f"JSON Value: request body is not an object: it starts with "
                               f"{body[start:start + 16]!r} (a predict request is a JSON "
                               f"object, '{{')")


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


def _inputs_from_instances(instances: Any, specs: Dict[str, tf.TensorSpec],
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
    return {name: _json_tensor(columns[name], specs[name].dtype, max_images, name) for name in specs}


def _inputs_from_columns(inputs: Any, specs: Dict[str, tf.TensorSpec],
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
