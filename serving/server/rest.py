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

The modules under it: `serving/server/rest_http.py` (the socket, HTTP/1.1
framing by h11 through uvicorn, head limits) and `serving/server/rest_json.py`
(the JSON formats). On top of h11, a request carrying both
`Transfer-Encoding` and `Content-Length` is refused (400), and so are
chunked bodies (411). Every error, framing errors included, is answered in
JSON. Requests run on a pool of `num_threads` threads (the model calls
block), which also encode the answers; the event loop only parses and
writes. A batched predict request does not hold its thread while it waits
for its batch: the thread parses it and queues it (`Predictor.run_async`),
the event loop awaits the batch and encodes the answer when it is small (a
thread when it is large); so REST requests waiting for batches are bounded
by the batch queue, not by the threads. One exception, the fast path: a small predict request on the only
open connection, with nothing else in flight, runs on the event loop
itself when its decode work is small and it is not batched
(`Predictor.may_run_inline`), which saves two thread hand-offs (pool and
back); any other request, or one found too costly once parsed, goes to the
pool.

Overload (deadlines, refusals, the connection bound): `serving/server/rest_server.py`.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Optional, Tuple
from urllib.parse import unquote

import grpc
from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2, model_pb2

from serving.errors import ServingError, invalid_argument
from serving.limits.admission import JSON_BYTES_PER_BODY_BYTE
from serving.limits.load_shedding import DEADLINE_SHARE, RunTimes, expected_seconds, fits
from serving.server import rest_json
from serving.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from serving.server.metrics import ServingMetrics
from serving.server.predictor import SIGNATURE_DEF, Predictor, RunElsewhere, output_aliases
from serving.server.rest_http import (
    Disconnected,
    HTTPError,
    check_head,
    respond,
)
from serving.ui.routes import UiFiles, is_ui_path
from serving.versions.servable import DEFAULT_SIGNATURE

log = logging.getLogger(__name__)

_PREDICT = re.compile(r"(?i)^/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?"
                      r":(classify|regress|predict)$")
_STATUS = re.compile(r"(?i)^/v1/models(?:/([^/:]+))?(?:/versions/(\d+)|/labels/([^/:]+))?"
                     r"(?:/(metadata))?$")
_METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")
# Largest body a request on the fast path (run on the event loop) may have:
# parsing it there must be quick.
INLINE_MAX_BODY = 256 * 1024
# Most output values a batched request's answer may have to be encoded on the
# event loop once its batch is done (a caption with its attention maps is a
# few thousand); larger answers are encoded on the pool.
INLINE_MAX_OUTPUT_VALUES = 1 << 15
_SIGNATURE_NAME = re.compile(rb'"signature_name"\s*:\s*"([A-Za-z0-9_.\-/]*)"')


class _Pending:
    """A predict request queued for its batch: `_RestApp._handle`'s answer before it is
    known. `encode(outputs)` makes the JSON body; metrics are recorded once done."""

    __slots__ = ("future", "encode", "seen", "started")

    def __init__(self, future, encode: Callable[[Dict[str, Any]], bytes]):
        self.future = future  # a concurrent.futures.Future of the outputs; never cancelled
        self.encode = encode
        self.seen: Dict[str, str] = {}
        self.started = 0.0

    def small(self) -> bool:
        """Whether the (done) answer is small enough to encode on the event loop."""
        if self.future.exception() is not None:
            return True
        return sum(getattr(v, "size", 1) for v in self.future.result().values()) \
            <= INLINE_MAX_OUTPUT_VALUES


def signature_hint(body: bytes) -> Optional[str]:
    """The signature a predict body names, read without parsing it: "" for none (the
    default), None when that is not certain from its bytes (escapes, several)."""
    if b"\\u" in body:
        return None
    found = _SIGNATURE_NAME.findall(body)
    if len(found) > 1 or (not found and b"signature_name" in body):
        return None
    return found[0].decode("ascii") if found else ""


class _RestApp:
    """The ASGI application: reads the body, then runs the request on the thread pool."""

    ui: Optional[UiFiles] = None
    # Open connections (set by RestServer); None: unknown (no fast path, no limit).
    connections: Optional[Callable[[], int]] = None
    fast_path = True
    threads = 1  # the pool's threads
    timeout: Optional[float] = None  # seconds from a request's arrival to its deadline
    max_connections = 0  # 0: no limit

    def __init__(self, predictor: Predictor, max_request_bytes: int, executor: ThreadPoolExecutor,
                 metrics: Optional[ServingMetrics], metrics_path: Optional[str]):
        self.predictor = predictor
        self.max_request_bytes = max_request_bytes
        self.executor = executor
        self.metrics = metrics
        self.metrics_path = metrics_path if metrics is not None else None
        self.in_flight = 0  # requests between routing and answer (event loop only)
        self.inline_runs = 0  # requests answered on the fast path
        self.pool_jobs = 0  # requests handed to the pool and not done (event loop only)
        self.job_times = RunTimes()  # seconds a request holds a pool thread
        # "busy" (429: no thread in time), "connections" (503) -> requests refused
        self.refused: collections.Counter = collections.Counter()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        arrived = time.monotonic()
        method = scope["method"]
        raw_path = scope.get("raw_path")
        # The undecoded path: model names are unquoted after routing, so
        # "%2F" stays inside a name instead of becoming a path separator.
        path = raw_path.decode("latin-1") if raw_path is not None else scope["path"]
        try:
            check_head(scope)
            body = await self._read_body(scope["headers"], method, receive)
        except HTTPError as e:  # the body may be unread: do not reuse the connection
            await respond(send, e.status, rest_json.encode({"error": e.message}), close=True)
            return
        except Disconnected:
            return
        if self.max_connections and self.connections is not None \
                and self.connections() > self.max_connections:
            self.refused["connections"] += 1
            await respond(send, 503, _error(
                f"server busy: {self.connections()} REST connections are open, more than "
                f"{self.max_connections} (--rest-max-connections); retry later, or reuse a "
                f"connection"), close=True)
            return
        if self.ui is not None and is_ui_path(path):
            await self.ui.respond(scope, send, self.executor)
            return
        if self.metrics_path is not None and path == self.metrics_path and method == "GET":
            data = await asyncio.get_running_loop().run_in_executor(
                self.executor, self.metrics.exposition)
            await respond(send, 200, data, content_type=METRICS_CONTENT_TYPE)
            return
        deadline = arrived + self.timeout if self.timeout is not None else None
        self.in_flight += 1
        try:
            answer = self._early_refusal(method, path, body, deadline, arrived)
            if answer is None and self._may_try_inline(method, body):
                answer = self._handle(method, path, body, inline=True, deadline=deadline)
                self.inline_runs += answer is not None
            if answer is None:
                # The answer is encoded on the pool too: the loop only writes it.
                answer = self._refusal(deadline) or await self._on_pool(
                    method, path, body, deadline, receive)
        finally:
            self.in_flight -= 1
        await respond(send, *answer)

    def _may_try_inline(self, method: str, body: bytes) -> bool:
        """The fast path's preconditions: a small POST, alone on the only connection."""
        return (self.fast_path and self.connections is not None and method == "POST"
                and self.in_flight == 1 and len(body) <= INLINE_MAX_BODY
                and self.connections() <= 1)

    def _early_refusal(self, method: str, path: str, body: bytes, deadline: Optional[float],
                       arrived: float) -> Optional[Tuple[int, bytes]]:
        """The answer to a predict request that its batch queue would refuse now (429,
        503), before it is parsed: refusing must cost less than queueing, or an overload
        is spent parsing requests only to refuse them. None: no early refusal."""
        match = _PREDICT.match(path) if method == "POST" else None
        if match is None or match.group(4).lower() != "predict":
            return None
        name, version, label, _ = match.groups()
        signature = signature_hint(body)
        try:
            servable = self.predictor.resolve(_model_spec(name, version, label))
        except ServingError:  # answered with its error on the pool
            return None
        try:
            servable.check_admission(deadline, signature)
        except ServingError as e:
            if self.metrics is not None:
                self.metrics.record_request(unquote(name), e.code.name, "predict", "REST",
                                            1e6 * (time.monotonic() - arrived))
            return e.http_status, _error(e.message)
        return None

    def _refusal(self, deadline: Optional[float]) -> Optional[Tuple[int, bytes]]:
        """429 when no pool thread would take the request in time to answer it by its
        deadline (see the module doc), else None."""
        ahead = self.pool_jobs
        if deadline is None or ahead < self.threads:
            return None
        mean = self.job_times.mean
        expected = expected_seconds(ahead, self.threads, mean)
        left = deadline - time.monotonic()
        if fits(expected, left):
            return None
        self.refused["busy"] += 1
        return 429, _error(
            f"server busy: {ahead - self.threads + 1} requests wait for one of the "
            f"{self.threads} REST threads ({1e3 * mean:.0f} ms each): the answer would come in "
            f"about {1e3 * expected:.0f} ms, more than {DEADLINE_SHARE:.0%} of the "
            f"{1e3 * max(left, 0):.0f} ms left of the request's timeout (--rest-timeout-ms); "
            f"retry later")

    async def _on_pool(self, method: str, path: str, body: bytes, deadline: Optional[float],
                       receive) -> Tuple[int, bytes]:
        """The request handled on the pool (a batched one waits for its batch here, holding
        no thread; dropped unrun if its connection is lost meanwhile)."""
        answer = await self._pool(self._handle, method, path, body, False, deadline,
                                  connection_alive(receive))
        if isinstance(answer, _Pending):  # queued for its batch: wait without a thread
            await asyncio.wrap_future(answer.future)
            # A small answer is encoded here, a large one on the pool.
            answer = self._complete(answer) if answer.small() \
                else await self._pool(self._complete, answer, True)
        return answer

    def _pool(self, fn, *args):
        """`fn(*args)` on the pool, counted in `pool_jobs` while it waits or runs."""
        job = asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        self.pool_jobs += 1
        job.add_done_callback(self._job_done)
        return job

    def _job_done(self, job) -> None:
        self.pool_jobs -= 1

    async def _read_body(self, headers, method: str, receive) -> bytes:
        lengths = [value for name, value in headers if name == b"content-length"]
        encodings = [value for name, value in headers if name == b"transfer-encoding"]
        if encodings and lengths:
            raise HTTPError(400, "a request may not carry both Transfer-Encoding and "
                                  "Content-Length")
        if encodings:
            raise HTTPError(411, "chunked request bodies are not supported; "
                                  "send Content-Length")
        if not lengths:
            if method == "POST":
                raise HTTPError(411, "Content-Length required")
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
            raise HTTPError(413, f"request body of {size} bytes exceeds the limit of "
                                  f"{self.max_request_bytes} bytes")
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise Disconnected()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                return b"".join(chunks)

    # -- on the thread pool ----------------------------------------------------

    def _complete(self, pending: _Pending, on_pool: bool = False) -> Tuple[int, bytes]:
        """(HTTP status, JSON body) of a request whose batch is done; counts it."""
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            return 200, pending.encode(pending.future.result())
        except ServingError as e:
            code = e.code
            return e.http_status, _error(e.message)
        except Exception as e:  # a bad request never takes the server down
            code = grpc.StatusCode.INTERNAL
            log.exception("REST predict failed")
            return 500, _error(f"{type(e).__name__}: {e}")
        finally:
            if on_pool:
                self.job_times.observe(time.perf_counter() - started)
            if self.metrics is not None and "model_name" in pending.seen:
                self.metrics.record_request(
                    pending.seen["model_name"], code.name, pending.seen["api"], "REST",
                    1e6 * (time.perf_counter() - pending.started))

    def _handle(self, method: str, path: str, body: bytes, inline: bool = False,
                deadline: Optional[float] = None,
                is_active: Optional[Callable[[], bool]] = None):
        """(HTTP status, JSON body) of one request; counts it in the metrics.

        With `inline` (on the event loop), None when the request must run on
        the pool instead (`RunElsewhere`): nothing ran and nothing was counted.
        A batched predict request comes back `_Pending` once queued for its
        batch. `deadline` (`time.monotonic()`) and `is_active` go to the run.
        """
        started = time.perf_counter()
        seen: Dict[str, str] = {}  # model_name and api, once routing knows them
        code = grpc.StatusCode.OK
        try:
            if method not in _METHODS:
                return 501, _error(f"Unsupported method ({method!r})")
            if not path.lower().startswith("/v1/"):
                return 404, _error(f"Not found: {method} {path}")
            answer = self._route(method, path, body, seen, inline, deadline, is_active)
            if isinstance(answer, _Pending):  # counted once done (`_complete`)
                answer.seen, answer.started = dict(seen), started
                seen.clear()
                return answer
            return 200, answer
        except RunElsewhere:
            seen.clear()
            return None
        except ServingError as e:
            code = e.code
            return e.http_status, _error(e.message)
        except Exception as e:  # a bad request never takes the server down
            code = grpc.StatusCode.INTERNAL
            log.exception("REST %s %s failed", method, path)
            return 500, _error(f"{type(e).__name__}: {e}")
        finally:
            elapsed = time.perf_counter() - started
            if not inline:
                self.job_times.observe(elapsed)
            if self.metrics is not None and "model_name" in seen:
                self.metrics.record_request(seen["model_name"], code.name, seen["api"], "REST",
                                            1e6 * elapsed)

    def _route(self, method: str, path: str, body: bytes, seen: Dict[str, str],
               inline: bool = False, deadline: Optional[float] = None,
               is_active: Optional[Callable[[], bool]] = None):
        if method == "POST":
            match = _PREDICT.match(path)
            if match:
                name, version, label, verb = match.groups()
                seen.update(model_name=unquote(name), api=verb.lower())
                spec = _model_spec(name, version, label)
                if verb.lower() != "predict":
                    raise ServingError(grpc.StatusCode.UNIMPLEMENTED,
                                       f"{verb} is not supported by this server")
                return self._predict(spec, body, inline, deadline, is_active)
        else:
            match = _STATUS.match(path)
            if match:
                name, version, label, metadata = match.groups()
                if not name:
                    raise invalid_argument("Missing model name in request.")
                seen.update(model_name=unquote(name),
                            api="GetModelMetadata" if metadata else "GetModelStatus")
                spec = _model_spec(name, version, label)
                return rest_json.encode(self._metadata(spec) if metadata
                                        else self._status(spec))
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

    def _predict(self, spec: model_pb2.ModelSpec, body: bytes, inline: bool = False,
                 deadline: Optional[float] = None,
                 is_active: Optional[Callable[[], bool]] = None):
        rest_json.check_json_start(body)
        # Too late already (it waited for a thread): 504 before parsing anything.
        self.predictor.work.check_deadline(deadline, "the REST request (--rest-timeout-ms)")
        # Parsing makes Python objects many times the body's size: that
        # memory is reserved from the decode budget first.
        with self.predictor.budget.reserve(len(body) * JSON_BYTES_PER_BODY_BYTE,
                                           f"a JSON body of {len(body)} bytes"):
            return self._predict_json(spec, rest_json.parse_json(body), inline, deadline,
                                      is_active)

    def _predict_json(self, spec: model_pb2.ModelSpec, doc: Dict[str, Any],
                      inline: bool = False, deadline: Optional[float] = None,
                      is_active: Optional[Callable[[], bool]] = None):
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
            inputs = rest_json.inputs_from_instances(doc["instances"], signature.inputs,
                                                     max_images)
        elif "inputs" in doc:
            inputs = rest_json.inputs_from_columns(doc["inputs"], signature.inputs, max_images)
        else:
            raise invalid_argument("Missing 'inputs' or 'instances' key")
        row_format = "instances" in doc

        def encode(outputs: Dict[str, Any]) -> bytes:
            outputs = {alias: outputs[alias] for alias in output_aliases(signature, ())}
            return rest_json.encode_outputs(outputs, row_format=row_format)

        if servable.batching is not None and not inline:  # no thread held while it waits
            return _Pending(self.predictor.run_async(servable, signature, inputs, deadline,
                                                     is_active), encode)
        return encode(self.predictor.run(servable, signature, inputs, deadline, inline=inline,
                                         is_active=is_active))


def _error(message: str) -> bytes:
    return rest_json.encode({"error": message})


def connection_alive(receive) -> Optional[Callable[[], bool]]:
    """`is_active` of a request: False once its connection is lost (reset, transport
    error), read from uvicorn's request cycle (the object `receive` is bound to, which
    marks itself `disconnected`), so that nothing waits on the loop for it; None where
    the server does not expose it. A half-close (FIN) is not a loss: the client may
    still read its answer."""
    cycle = getattr(receive, "__self__", None)
    if cycle is None or not hasattr(cycle, "disconnected"):
        return None
    return lambda: not cycle.disconnected


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
