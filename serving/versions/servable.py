"""One loaded SavedModel version: its signatures, input checks, runs and warmup.

Generic over SavedModels: inputs and outputs are whatever the signatures
declare; request arrays are matched to them by name, dtype and shape. String
inputs are probed as images and rejected before decoding when their header
claims more than `max_image_pixels` pixels.
"""
from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, NamedTuple, Optional, Sequence

import grpc
import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from serving.errors import (
    ServingError,
    failed_precondition,
    from_tf_error,
    internal,
    invalid_argument,
)
from serving.limits.admission import image_cost
from serving.limits.image_headers import ImageHeaderError, check_pixels
from serving.versions.batch_scheduler import BatchScheduler
from serving.versions.batching_parameters import BatchingParameters

log = logging.getLogger(__name__)

DEFAULT_SIGNATURE = "serving_default"
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
MAX_WARMUP_RECORDS = 1000  # TF Serving's limit
Arrays = Dict[str, np.ndarray]


class InputCost(NamedTuple):
    """What checked inputs will cost to run: images, their decoded pixels, estimated bytes.

    `headers` holds `(alias, flat index, ImageInfo or None)` of every string
    element, so later checks (decode work) need not read the headers again.
    """
    images: int
    pixels: int
    bytes: int
    headers: tuple = ()


@dataclass
class Signature:
    """A callable signature: its function and the specs of its inputs."""
    name: str
    function: object  # a ConcreteFunction from tf.saved_model.load
    inputs: Dict[str, tf.TensorSpec]
    outputs: Sequence[str]
    signature_def: meta_graph_pb2.SignatureDef


class Servable:
    """A SavedModel version loaded for serving.

    Args:
      name: the model name.
      version: the integer version.
      path: the version folder (`<base_path>/<version>`).
      max_image_pixels: limit on decoded pixels of any image input (0: none).
      batching: when given, concurrent runs of a signature are batched.
      batch_observer: `observer(name, queued_micros)` called after each
        batch runs (see `BatchScheduler`), or None.
    """

    def __init__(self, name: str, version: int, path: str, max_image_pixels: int = 0,
                 batching: Optional[BatchingParameters] = None,
                 batch_observer: Optional[Callable] = None):
        self.name = name
        self.version = version
        self.path = path
        self.max_image_pixels = max_image_pixels
        self.batching = batching
        self.batch_observer = batch_observer
        self.warmup_requests = 0
        # Set by the ModelManager: `time.monotonic()` when its load began and
        # when it became available, and the load's seconds (warmup included).
        self.load_started: Optional[float] = None
        self.available_at: Optional[float] = None
        self.load_seconds: Optional[float] = None
        self._batchers: Dict[str, BatchScheduler] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.meta_graph = read_meta_graph(path)
        self.module = tf.saved_model.load(path, tags=list(self.meta_graph.meta_info_def.tags)
                                          or None)
        self.signatures: Dict[str, Signature] = {}
        for key, function in self.module.signatures.items():
            _, kwargs = function.structured_input_signature
            outputs = function.structured_outputs
            self.signatures[key] = Signature(
                name=key, function=function, inputs=dict(kwargs),
                outputs=sorted(outputs) if isinstance(outputs, Mapping) else [],
                signature_def=self.meta_graph.signature_def.get(key,
                                                                meta_graph_pb2.SignatureDef()))

    @property
    def signature_defs(self) -> Mapping[str, meta_graph_pb2.SignatureDef]:
        """Every SignatureDef of the meta graph (what GetModelMetadata returns)."""
        return self.meta_graph.signature_def

    def signature(self, name: str) -> Signature:
        """The named signature (empty = serving_default); FAILED_PRECONDITION if absent."""
        key = name or DEFAULT_SIGNATURE
        try:
            return self.signatures[key]
        except KeyError:
            raise failed_precondition(f'Serving signature key "{key}" not found.') from None

    @staticmethod
    def check_input_names(signature: Signature, names) -> None:
        """INVALID_ARGUMENT unless `names` are exactly the signature's inputs."""
        expected = set(signature.inputs)
        sent = set(names)
        if sent != expected:
            raise invalid_argument(
                f"input size does not match signature: {len(sent)}!={len(expected)} "
                f"len({{{','.join(sorted(sent))}}}) != len({{{','.join(sorted(expected))}}}). "
                f"Sent extra: {{{','.join(sorted(sent - expected))}}}. "
                f"Missing but required: {{{','.join(sorted(expected - sent))}}}.")

    def check_inputs(self, signature: Signature, inputs: Arrays) -> InputCost:
        """Checks input names, dtypes, shapes and image headers (INVALID_ARGUMENT).

        Returns:
          The images (string elements), the pixels their headers say the
          decoder will allocate, and the estimated peak bytes of the run
          (`serving.limits.admission`), all known before anything is decoded.
        """
        self.check_input_names(signature, inputs)
        images = pixels = cost = 0
        headers = []
        for index, (alias, spec) in enumerate(sorted(signature.inputs.items())):
            array = inputs[alias]
            want = np.dtype(object) if spec.dtype == tf.string else spec.dtype.as_numpy_dtype
            if np.dtype(array.dtype) != np.dtype(want):
                raise invalid_argument(f"Expects arg[{index}] to be {spec.dtype.name} but "
                                       f"{_dtype_name(array.dtype)} is provided")
            if not spec.shape.is_compatible_with(array.shape):
                raise invalid_argument(
                    f"input {alias}: shape {list(array.shape)} is not compatible with "
                    f"the signature's {_shape_str(spec.shape)}")
            if spec.dtype == tf.string:
                count, alias_pixels, alias_cost = self._check_images(alias, array, headers)
                images += count
                pixels += alias_pixels
                cost += alias_cost
            else:
                cost += 2 * array.nbytes  # the array and its tensor
        return InputCost(images, pixels, cost, tuple(headers))

    def _check_images(self, alias: str, array: np.ndarray, headers: list):
        """(images, pixels, estimated bytes) of a string input; INVALID_ARGUMENT on a bad header.

        Appends `(alias, index, info)` of every element to `headers`.
        """
        pixels = cost = 0
        flat = array.reshape(-1)
        # TensorProto's padding rule repeats one object: read its header once.
        seen: Dict[int, object] = {}
        for i, value in enumerate(flat):
            if not isinstance(value, bytes):
                raise invalid_argument(f"input {alias}[{i}] is not bytes")
            try:
                info = seen[id(value)] if id(value) in seen else check_pixels(
                    value, self.max_image_pixels)
            except ImageHeaderError as e:
                raise invalid_argument(f"input {alias}[{i}]: {e}") from None
            seen[id(value)] = info
            headers.append((alias, i, info))
            image_pixels = info.pixels if info is not None else 0
            pixels += image_pixels
            cost += image_cost(image_pixels, len(value))
        return len(flat), pixels, cost

    def run(self, signature: Signature, inputs: Arrays, deadline: Optional[float] = None,
            is_active: Optional[Callable[[], bool]] = None) -> Arrays:
        """Runs a signature on checked inputs (batched when batching is on).

        Args:
          signature: the signature.
          inputs: alias -> checked array.
          deadline: `time.monotonic()` time by which the answer is due: with
            batching, a request expected to be answered later is refused at
            once (RESOURCE_EXHAUSTED), one whose deadline passes while it waits
            for its batch is dropped (DEADLINE_EXCEEDED); None: none.
          is_active: returns False once the client is gone (its queued
            request is dropped, CANCELLED); None: never.
        """
        return self.submit(signature, inputs, deadline, is_active).result()

    def submit(self, signature: Signature, inputs: Arrays, deadline: Optional[float] = None,
               is_active: Optional[Callable[[], bool]] = None) -> Future:
        """As `run`, but returns once the request is queued for its batch, with a Future
        of its outputs (`BatchScheduler.submit_async`); unbatched, it runs here and the
        Future is done on return. Refusals are raised at once."""
        if self.batching is not None:
            batcher = self._batcher(signature)
            if batcher is not None:
                return batcher.submit_async(inputs, deadline, is_active)
        future: Future = Future()
        try:
            future.set_result(self.call(signature, inputs))
        except Exception as e:
            future.set_exception(e)
        return future

    def call(self, signature: Signature, inputs: Arrays) -> Arrays:
        """Runs the signature function once, mapping TF errors to their codes."""
        try:
            tensors = {alias: tf.convert_to_tensor(array, dtype=signature.inputs[alias].dtype)
                       for alias, array in inputs.items()}
            outputs = signature.function(**tensors)
        except tf.errors.OpError as e:
            raise from_tf_error(e) from None
        except (ValueError, TypeError) as e:
            raise invalid_argument(str(e)) from None
        except Exception as e:
            log.exception("%s version %d signature %s failed", self.name, self.version,
                          signature.name)
            raise internal(f"{type(e).__name__}: {e}") from None
        if not isinstance(outputs, Mapping):
            raise internal(f"signature {signature.name} did not return a dict of outputs")
        return {alias: value.numpy() for alias, value in outputs.items()}

    def check_admission(self, deadline: Optional[float], signature: Optional[str] = None,
                        rows: int = 1) -> None:
        """Refuses now (as `run` would) a request of at least `rows` rows whose batch
        queue is full or would answer after `deadline`, before it is parsed.

        Args:
          deadline: `time.monotonic()` time by which the answer is due; None: none.
          signature: the signature's name; None: not known yet, and then the
            request is refused only when every signature's queue would refuse it.
          rows: a lower bound of the request's rows.
        Raises:
          ServingError: RESOURCE_EXHAUSTED, UNAVAILABLE or DEADLINE_EXCEEDED.
        """
        if self.batching is None:
            return
        with self._lock:
            if signature is not None:
                key = signature or DEFAULT_SIGNATURE
                batchers = [self._batchers[key]] if key in self._batchers else []
            elif len(self._batchers) == len(self.signatures):
                batchers = list(self._batchers.values())
            else:  # a signature with no queue yet would take it
                batchers = []
        error = None
        for batcher in batchers:
            try:
                batcher.check_admission(rows, deadline)
                return
            except ServingError as e:
                error = e
        if error is not None:
            raise error

    def _batcher(self, signature: Signature) -> Optional[BatchScheduler]:
        with self._lock:
            if self._closed:
                return None
            batcher = self._batchers.get(signature.name)
            if batcher is None:
                batcher = BatchScheduler(
                    lambda arrays, s=signature: self.call(s, arrays), self.batching,
                    name=f"batch-{self.name}-v{self.version}-{signature.name}",
                    observer=self.batch_observer)
                self._batchers[signature.name] = batcher
            return batcher

    def warmup(self, predict) -> int:
        """Replays `assets.extra/tf_serving_warmup_requests`, if present.

        Args:
          predict: `predict(request, servable)` running one PredictRequest on
            this servable (the server's own request path).
        Returns:
          The number of requests replayed.
        Raises:
          ServingError: a record is not a PredictLog, there are more than
            1000, or a request fails: the version then fails to load, as in
            TF Serving.
        """
        from tensorflow_serving.apis import prediction_log_pb2

        path = os.path.join(self.path, WARMUP_FILE)
        if not tf.io.gfile.exists(path):
            return 0
        count = 0
        for record in tf.data.TFRecordDataset(path):
            count += 1
            if count > MAX_WARMUP_RECORDS:
                raise invalid_argument(f"Number of warmup records exceeds the maximum "
                                       f"({MAX_WARMUP_RECORDS}) at {path}")
            entry = prediction_log_pb2.PredictionLog.FromString(record.numpy())
            kind = entry.WhichOneof("log_type")
            if kind != "predict_log":
                raise invalid_argument(f"warmup record {count} is a {kind}; only "
                                       f"predict_log is supported")
            predict(entry.predict_log.request, self)
        self.warmup_requests = count
        return count

    def close(self) -> None:
        """Stops the batch schedulers once their queued requests are done."""
        with self._lock:
            self._closed = True
            batchers = list(self._batchers.values())
        for batcher in batchers:
            batcher.close()

    def batch_sizes(self) -> Dict[str, Dict[int, int]]:
        """Rows per batch run so far, per signature (for tests and diagnostics)."""
        with self._lock:
            return {name: dict(b.batch_sizes) for name, b in self._batchers.items()}


def read_meta_graph(path: str) -> meta_graph_pb2.MetaGraphDef:
    """The 'serve' meta graph of a SavedModel (the first one if none is tagged so).

    Read from `saved_model.pb` alone: nothing is loaded or run.

    Args:
      path: the SavedModel folder (local or any `tf.io.gfile` path).
    Returns:
      The `MetaGraphDef` (its `signature_def` lists the signatures).
    Raises:
      ServingError: DATA_LOSS when the file holds no meta graph.
    """
    pb = os.path.join(path, "saved_model.pb")
    with tf.io.gfile.GFile(pb, "rb") as f:
        saved_model = saved_model_pb2.SavedModel.FromString(f.read())
    if not saved_model.meta_graphs:
        raise ServingError(grpc.StatusCode.DATA_LOSS, f"{pb} has no meta graph")
    for meta_graph in saved_model.meta_graphs:
        if "serve" in meta_graph.meta_info_def.tags:
            return meta_graph
    return saved_model.meta_graphs[0]


def _dtype_name(dtype: np.dtype) -> str:
    if np.dtype(dtype).kind in "OSU":
        return "string"
    try:
        return tf.as_dtype(dtype).name
    except TypeError:
        return str(dtype)


def _shape_str(shape: tf.TensorShape) -> str:
    if shape.rank is None:
        return "[?]"
    return "[" + ",".join("?" if d is None else str(d) for d in shape.as_list()) + "]"
